"""Per-job ssh for launchers that reach other nodes over ssh (horovodrun, deepspeed's pdsh).

A public submodule of the plugin API: ``from detlaunch.ssh import sshd_parts, ...``.

Every node the launcher reaches runs its own sshd under its supervisor: key-only, listening
only on that node's address, with a host key and an authorized client key made for this job
(ssh-keygen, at start). The keys live in the job directory the nodes share (``--ssh-dir``, by
default the job dir), one private folder per node. The chief's launcher gets an ``ssh`` on its
PATH that uses a per-job client config: each node's own key, strict host-key checking against
the host keys the nodes just made (even when a launcher passes StrictHostKeyChecking=no), and
no password, ever.

A rank that arrives over ssh finds its node's supervisor through DETLAUNCH_SSHD_SUPERVISOR,
which that node's sshd sets (SetEnv) for every session. The same way it gets its node's own
CUDA_VISIBLE_DEVICES (NODE_OWN_ENV: the value the node's detlaunch was started with; unset where it
had none): the launchers export the chief's environment to every node but leave that one out
(horovod's exporter, deepspeed's env file), so without it a rank would see every GPU of a shared node.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import os
import shlex
import shutil
import sys
from collections.abc import Mapping

import detlaunch.exit_codes as exit_codes
from detlaunch.errors import ConfigError
from detlaunch.options import Option, OptionGroup
from detlaunch.planning.addresses import bind_host
from detlaunch.planning.config import NUMBERS, Config
from detlaunch.planning.doctor import Check, port_check
from detlaunch.planning.stage import SOCKET_NAME, SSHD_SUPERVISOR_ENV, Command, Stage, StageContext
from detlaunch.system.safefs import write_private_file

__all__ = ["SshLayout", "SshParts", "add_ssh_options", "sshd_parts", "ssh_client_parts", "ssh_port_check",
           "client_path", "DEFAULT_SSH_PORT", "SSH_PORT_ENV", "NODE_OWN_ENV"]

DEFAULT_SSH_PORT = 12350
SSH_PORT_ENV = "DTRAIN_SSH_PORT"
# A node's own variables, which its ssh sessions get from its detlaunch (see the module docstring).
NODE_OWN_ENV = ("CUDA_VISIBLE_DEVICES",)


SSH_OPTIONS = (
    Option("--ssh-port", type=NUMBERS["ssh_port"], metavar="PORT",
           help=f"port of the per-job sshd on each node (default: ${SSH_PORT_ENV}, else {DEFAULT_SSH_PORT})"),
    Option("--ssh-dir", metavar="DIR",
           help="directory shared by all nodes for the per-job ssh keys (default: the job dir)"),
)


def add_ssh_options(parser: argparse.ArgumentParser, layer: str) -> None:
    """Add --ssh-port and --ssh-dir to a layer's option group (for layers that use ssh)."""
    OptionGroup(f"{layer}: ssh between nodes", SSH_OPTIONS).add_to(parser)


def ssh_port_check(config: Config, required: bool) -> list[Check]:
    """For ``detlaunch doctor``: the per-job sshd's port free, when --ssh-port (or $DTRAIN_SSH_PORT) names one.

    required: whether the job uses the sshd (several nodes); else a failure is a warning.
    """
    given = config.options.get("ssh_port") or config.env.get(SSH_PORT_ENV)
    if not given:
        return []
    try:
        port = int(NUMBERS["ssh_port"].parse(str(given)))
    except argparse.ArgumentTypeError as e:
        return [Check("ssh port free", False, f"{SSH_PORT_ENV}={given!r}: {e}", "give --ssh-port PORT", required)]
    where = "" if required else " (only for jobs on several nodes)"
    check = port_check("127.0.0.1", port, "ssh port (the per-job sshd)", "--ssh-port", required)
    return [dataclasses.replace(check, fix=check.fix + where) if not check.ok else check]


def _ip_literal(addr: str) -> str:
    return f"[{addr}]" if ":" in addr else addr


@dataclasses.dataclass(frozen=True)
class SshLayout:
    """Where each node's ssh files live, and which port the per-job sshd listens on."""

    root: str
    port: int

    @classmethod
    def for_job(cls, ctx: StageContext) -> SshLayout:
        port = ctx.option("ssh_port") or ctx.env.get(SSH_PORT_ENV) or DEFAULT_SSH_PORT
        try:
            port = int(NUMBERS["ssh_port"].parse(str(port)))
        except argparse.ArgumentTypeError as e:
            raise ConfigError(f"{SSH_PORT_ENV}={port!r}: {e}") from None
        root = ctx.option("ssh_dir") or os.path.join(ctx.shared_dir, "ssh")
        return cls(os.path.abspath(root), port)

    def node_dir(self, node: int) -> str:
        return os.path.join(self.root, f"node-{node}")

    def host_key(self, node: int) -> str:
        return os.path.join(self.node_dir(node), "host_key")

    def client_key(self, node: int) -> str:
        return os.path.join(self.node_dir(node), "client_key")

    @property
    def client_dir(self) -> str:
        return os.path.join(self.root, "client")

    @property
    def bin_dir(self) -> str:
        return os.path.join(self.client_dir, "bin")


@dataclasses.dataclass(frozen=True)
class SshParts:
    """Pieces a layer puts into its Stage (see Stage for what each one means)."""

    files: dict[str, str] = dataclasses.field(default_factory=dict)
    executables: dict[str, str] = dataclasses.field(default_factory=dict)
    dirs: tuple[str, ...] = ()
    setup: tuple[tuple[str, ...], ...] = ()
    prelaunch: tuple[tuple[str, ...], ...] = ()
    wait_for_sshd: tuple[tuple[str, int], ...] = ()
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    commands: tuple[Command, ...] = ()

    def __add__(self, other: SshParts) -> SshParts:
        return SshParts(
            files={**self.files, **other.files}, executables={**self.executables, **other.executables},
            dirs=self.dirs + other.dirs, setup=self.setup + other.setup, prelaunch=self.prelaunch + other.prelaunch,
            wait_for_sshd=self.wait_for_sshd + other.wait_for_sshd, env={**self.env, **other.env},
            commands=self.commands + other.commands,
        )

    def stage(self, *commands: Command, unset_env: tuple[str, ...] = ()) -> Stage:
        """A Stage running these parts' daemons, then `commands` (which get the parts' env)."""
        launchers = tuple(dataclasses.replace(c, env={**self.env, **c.env}) for c in commands)
        return Stage(commands=self.commands + launchers, files=self.files, executables=self.executables,
                     dirs=self.dirs, setup=self.setup, wait_for_sshd=self.wait_for_sshd,
                     prelaunch=self.prelaunch, unset_env=unset_env)


def sshd_binary() -> str:
    found = shutil.which("sshd", path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    return found or "/usr/sbin/sshd"


def session_env(ctx: StageContext, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """What every ssh session of this node gets (sshd's SetEnv): its supervisor, its own NODE_OWN_ENV, `extra`."""
    env = {SSHD_SUPERVISOR_ENV: os.path.join(ctx.run_dir, SOCKET_NAME)}
    env.update({name: ctx.env[name] for name in NODE_OWN_ENV if name in ctx.env})
    env.update(extra or {})
    for name, value in env.items():
        if any(c in value for c in '"\\') or not value.isprintable():
            raise ConfigError(f"{name}={value!r}: this node's sshd cannot pass a value holding a quote, a "
                              "backslash or a control character on to the ranks it starts; fix the value")
    return env


def sshd_config(ctx: StageContext, layout: SshLayout, extra_env: Mapping[str, str] | None = None) -> str:
    node = ctx.cluster.node_rank
    addr = ctx.cluster.require_addresses("ssh")[node]
    # sshd keeps the first SetEnv line only: every variable goes on one
    set_env = " ".join(f'{name}="{value}"' for name, value in session_env(ctx, extra_env).items())
    return "\n".join([
        f"ListenAddress {_ip_literal(bind_host(addr, ctx.cluster.bind_any))}:{layout.port}",
        f"HostKey {layout.host_key(node)}",
        f"AuthorizedKeysFile {layout.client_key(node)}.pub",
        "PidFile none",
        "AuthenticationMethods publickey",
        "PubkeyAuthentication yes",
        "PasswordAuthentication no",
        "KbdInteractiveAuthentication no",
        "UsePAM no",
        "PermitRootLogin prohibit-password",
        f"AllowUsers {getpass.getuser()}",
        # Our files are 0600 in 0700 folders, but the job dir may sit under a sticky /tmp, which sshd's StrictModes
        # refuses: detlaunch checks the folders above the job dir itself (system/jobdir.unsafe_parent).
        "StrictModes no",
        "PermitUserEnvironment no",
        "AllowTcpForwarding no",
        "AllowAgentForwarding no",
        "AllowStreamLocalForwarding no",
        "X11Forwarding no",
        "PermitTunnel no",
        "PrintMotd no",
        "PrintLastLog no",
        "MaxStartups 256",
        "MaxSessions 256",
        "LogLevel ERROR",
        f"SetEnv {set_env}",
        "",
    ])


def sshd_parts(ctx: StageContext, layout: SshLayout | None = None, env: Mapping[str, str] | None = None) -> SshParts:
    """This node's sshd: a fresh folder with new keys, then ``sshd -D`` as a daemon of the job.

    env: more variables for every session (and so every rank) it starts, beside session_env's.
    """
    layout = layout or SshLayout.for_job(ctx)
    node = ctx.cluster.node_rank
    config = os.path.join(layout.node_dir(node), "sshd_config")
    keygen = ("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C")
    return SshParts(
        dirs=(layout.node_dir(node),),
        files={config: sshd_config(ctx, layout, env)},
        setup=(
            (*keygen, f"detlaunch-{ctx.cluster.job_id}-host{node}", "-f", layout.host_key(node)),
            (*keygen, f"detlaunch-{ctx.cluster.job_id}-client{node}", "-f", layout.client_key(node)),
        ),
        commands=(Command((sshd_binary(), "-D", "-e", "-f", config), name="sshd", daemon=True),),
    )


def client_path(ctx: StageContext, layout: SshLayout | None = None) -> str:
    """The chief's launcher's PATH: the per-job ``ssh`` first. A launcher that hands its environment to every rank
    (horovodrun) gives the other nodes' ranks this PATH too, where their nodes share the chief's (a layer's
    RankWrapper.warm_env says so, for their rank templates)."""
    layout = layout or SshLayout.for_job(ctx)
    return layout.bin_dir + os.pathsep + ctx.env.get("PATH", os.defpath)


def ssh_client_parts(ctx: StageContext, nodes: list[int], layout: SshLayout | None = None) -> SshParts:
    """The chief's side: wait for each node's sshd, trust exactly its new host key, use its key."""
    layout = layout or SshLayout.for_job(ctx)
    addrs = ctx.cluster.require_addresses("ssh")
    config = os.path.join(layout.client_dir, "ssh_config")
    known_hosts = os.path.join(layout.client_dir, "known_hosts")
    bin_dir = layout.bin_dir
    lines = []
    for node in nodes:
        lines += [f"Host {addrs[node]}", f"  IdentityFile {layout.client_key(node)}"]
    lines += [
        "Host *",
        f"  Port {layout.port}",
        "  IdentitiesOnly yes",
        "  BatchMode yes",
        "  PasswordAuthentication no",
        "  KbdInteractiveAuthentication no",
        "  StrictHostKeyChecking yes",
        f"  UserKnownHostsFile {known_hosts}",
        "  GlobalKnownHostsFile /dev/null",
        "  CheckHostIP no",
        "  LogLevel ERROR",
        "  ConnectTimeout 20",
        "  ServerAliveInterval 5",
        "",
    ]
    ssh = shutil.which("ssh") or "/usr/bin/ssh"
    # First -o wins in ssh: ours come before whatever the launcher adds.
    wrapper = (f"#!/bin/sh\nexec {shlex.quote(ssh)} -F {shlex.quote(config)} "
               "-o StrictHostKeyChecking=yes -o PasswordAuthentication=no \"$@\"\n")
    pubkeys = [f"{addrs[n]}:{layout.port}={layout.host_key(n)}.pub" for n in nodes]
    return SshParts(
        dirs=(layout.client_dir, bin_dir),
        files={config: "\n".join(lines)},
        executables={os.path.join(bin_dir, "ssh"): wrapper},
        prelaunch=((sys.executable, "-m", "detlaunch.ssh", "known-hosts", known_hosts, *pubkeys),),
        wait_for_sshd=tuple((addrs[n], layout.port) for n in nodes),
        env={"PATH": client_path(ctx, layout)},
    )


def write_known_hosts(path: str, entries: list[str]) -> None:
    """entries: ``host:port=pubkey_file``; the nodes wrote their host keys before starting sshd."""
    lines = []
    for entry in entries:
        target, _, pub = entry.partition("=")
        host, _, port = target.rpartition(":")
        with open(pub) as f:
            key = " ".join(f.read().split()[:2])
        lines.append(f"[{host}]:{port} {key}" if port != "22" else f"{host} {key}")
    write_private_file(path, "\n".join(lines) + "\n")


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "known-hosts":
        write_known_hosts(argv[1], argv[2:])
        return 0
    print("usage: python -m detlaunch.ssh known-hosts FILE host:port=pubkey ...", file=sys.stderr)
    return exit_codes.USAGE


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
