"""Nodes reached over a real ssh, for ``--spawn ssh``: an sshd of the test's own on 127.0.0.2-4 for a throwaway
user with a home, a key and an ssh config of their own; and three hosts that go wrong: 127.0.0.6, where the
command is not found (a host without detlaunch), 127.0.0.7, where the user's key is not authorized (ssh login
refused), and 127.0.0.8, whose detlaunch says it is another version. The user runs this checkout's detlaunch
with Debian's python3 (the venv's interpreter lives under /root) and the venv's packages on its path, as
tests/node/test_escape.py does."""

from __future__ import annotations

import dataclasses
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from support.helpers import free_port, wait_until
from support.paths import ROOT

HOSTS = ("127.0.0.2", "127.0.0.3", "127.0.0.4")
NO_DETLAUNCH = "127.0.0.6"  # its sshd runs every command as a shell without detlaunch would: not found, 127
REFUSED = "127.0.0.7"  # no authorized keys there: "Permission denied (publickey)", 255
OTHER_VERSION, OTHER = "127.0.0.8", "0.0.9"  # its detlaunch is this checkout's, saying it is version 0.0.9
# What 127.0.0.8 runs instead of `python3 -m detlaunch`: the node's own detlaunch, of another version.
OTHER_DETLAUNCH = f"""import sys
import detlaunch.version
detlaunch.version.__version__ = "{OTHER}"
from detlaunch.cli.main import main
sys.exit(main())
"""
PYTHON = "/usr/bin/python3"


@dataclasses.dataclass
class SshNodes:
    user: pwd.struct_passwd
    home: Path
    port: int
    env: dict[str, str]
    as_user: tuple[str, ...]

    def processes(self) -> list[int]:
        """The user's live processes (their ssh sessions, detlaunch, ranks): none once a job is over."""
        return [p.pid for p in psutil.process_iter(["uids", "status"])
                if p.info["uids"] and p.info["uids"].real == self.user.pw_uid and p.info["status"] != "zombie"]

    def no_processes_left(self, settle: float = 15) -> None:
        wait_until(lambda: not self.processes() or None, timeout=settle,
                   what=f"the user's processes gone (left: {self.processes()})")


def _answers(port: int) -> bool | None:
    try:
        with socket.create_connection((HOSTS[0], port), timeout=1) as s:
            return s.recv(4).startswith(b"SSH-") or None
    except OSError:
        return None


@contextmanager
def ssh_nodes(user: pwd.struct_passwd) -> Iterator[SshNodes]:
    home = Path(tempfile.mkdtemp(prefix="dlspawn-"))
    sshd = None
    try:
        os.chmod(home, 0o755)
        subprocess.run(["usermod", "--home", str(home), "--shell", "/bin/sh", "--password", "*", user.pw_name],
                       check=True)  # "!": locked, which sshd refuses even a key
        (home / ".ssh").mkdir(mode=0o700)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(home / ".ssh" / "id_ed25519")],
                       check=True)
        shutil.copy(home / ".ssh" / "id_ed25519.pub", home / ".ssh" / "authorized_keys")
        port = free_port()
        (home / ".ssh" / "config").write_text(
            f"Host 127.0.0.*\n  Port {port}\n  IdentityFile ~/.ssh/id_ed25519\n  StrictHostKeyChecking no\n"
            "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  ConnectTimeout 10\n")
        server = home / "sshd"
        server.mkdir()
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(server / "host_key")], check=True)
        listen = "".join(f"ListenAddress {h}:{port}\n" for h in (*HOSTS, NO_DETLAUNCH, REFUSED, OTHER_VERSION))
        (server / "other_detlaunch.py").write_text(OTHER_DETLAUNCH)
        other = f"s| -m detlaunch | {server / 'other_detlaunch.py'} |"
        (server / "sshd_config").write_text(
            f"{listen}HostKey {server / 'host_key'}\nPidFile none\nAuthorizedKeysFile .ssh/authorized_keys\n"
            f"PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\n"
            f"AllowUsers {user.pw_name}\nPermitRootLogin no\nLogLevel ERROR\nMaxStartups 100\n"
            f"Match LocalAddress {NO_DETLAUNCH}\n  ForceCommand exec /nonexistent/bin/python3 -m detlaunch\n"
            f"Match LocalAddress {REFUSED}\n  AuthorizedKeysFile none\n"
            f"Match LocalAddress {OTHER_VERSION}\n"
            f"  ForceCommand exec /bin/sh -c \"$(printf %s \"$SSH_ORIGINAL_COMMAND\" | sed '{other}')\"\n")
        for path in home.rglob("*"):
            if server not in (path, *path.parents):
                os.chown(path, user.pw_uid, user.pw_gid)
        os.chown(home, user.pw_uid, user.pw_gid)
        sshd = subprocess.Popen(["/usr/sbin/sshd", "-D", "-e", "-f", str(server / "sshd_config")],
                                start_new_session=True, stderr=subprocess.DEVNULL)
        wait_until(lambda: _answers(port), timeout=20, what="the test's sshd answering")
        path = [str(ROOT / "core"), *map(str, sorted((ROOT / "plugins").iterdir())), sysconfig.get_paths()["purelib"],
                *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
        env = {"PYTHONPATH": os.pathsep.join(dict.fromkeys(path)), "HOME": str(home), "TMPDIR": str(home),
               "XDG_CACHE_HOME": str(home / "cache"), "USER": user.pw_name, "LOGNAME": user.pw_name}
        as_user = ("setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}", "--clear-groups")
        nodes = SshNodes(user, home, port, env, as_user)
        yield nodes
    finally:
        if sshd is not None:
            os.killpg(sshd.pid, signal.SIGKILL)
            sshd.wait()
        for p in psutil.process_iter(["uids"]):  # by PID, so that userdel can remove the user
            if p.info["uids"] and p.info["uids"].real == user.pw_uid:
                try:
                    p.kill()
                except psutil.NoSuchProcess:
                    pass
        shutil.rmtree(home, ignore_errors=True)
