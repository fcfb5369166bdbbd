"""``--spawn ssh``: every node's detlaunch over the user's own ssh (their keys, agent, ~/.ssh/config), in parallel.

Each node gets ``ssh -T -o BatchMode=yes [--ssh-opts] HOST '<cd CWD && exec detlaunch ...>'``: the remote
command is one line quoted word by word for a POSIX login shell (``SpawnRequest.shell_command``), so every
argument and path arrives exactly as given; the variables (--export, .deepspeed_env) and the job secret come
on the node's stdin, never on a command line (docs/SPAWN.md). ssh's stdin is the spawning command's pipe:
when that closes (Ctrl-C there, or the spawning command killed), the node's detlaunch sees its stdin end and
stops its job; so a launch need not die with the spawning command (NodeLaunch.watches_stdin), and starts faster.
Node 0 runs here, without ssh, when its address is this machine: its name, loopback's 127.0.0.1, or an
address one of its interfaces holds.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Sequence

from detlaunch import Config, ConfigError, NodeLaunch, SpawnRequest, hookimpl

LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")


def is_here(host: str) -> bool:
    """Whether `host` is this machine: its name, loopback's, or an address of one of its interfaces (a literal
    address: no name is looked up, which could wait on a resolver)."""
    if host in (*LOCAL_NAMES, socket.gethostname()):
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    import psutil  # only for an address given as such

    return any(ipaddress.ip_address(a.address.split("%")[0]) == ip for addrs in psutil.net_if_addrs().values()
               for a in addrs if a.family in (socket.AF_INET, socket.AF_INET6))


class SshSpawner:
    def launches(self, request: SpawnRequest) -> Sequence[NodeLaunch]:
        if not request.hosts:
            raise ConfigError("--spawn ssh needs the nodes: give --hosts H:S,H:S or --hostfile FILE")
        out = []
        for node, host in enumerate(request.hosts):
            label = f"node {node} ({host})"
            if node == 0 and is_here(host):  # its variables come on its stdin, as every node's (NodeLaunch.env)
                out.append(NodeLaunch(request.startup_argv(0), label, node, watches_stdin=True))
                continue
            out.append(NodeLaunch(("ssh", "-T", "-o", "BatchMode=yes", *request.ssh_opts, "--", host,
                                   request.shell_command(node)), label, node, watches_stdin=True))
        return out


@hookimpl
def detlaunch_spawners(config: Config) -> dict[str, SshSpawner]:
    return {"ssh": SshSpawner()}
