"""Warm ranks, the supervisor's side: the node's rank template, started once, and the ends of warm ranks.

The template (rank/template.py) imports torch, torch.distributed and --preload once, while the nodes
join and the first attempt starts, and every rank of every attempt on this node is forked from it
(rank/warm.py): a restart does not import torch again, and 8 ranks share one copy of what the import
wrote. The supervisor binds the template's socket itself (in the run dir, 0600) before it starts
the template, so that a wrapper that comes first waits for the template's imports instead of
finding no socket; it tells each wrapper the socket in its welcome.

A warm rank is the template's grandchild, re-parented to this supervisor (the subreaper): its end is
reaped here, and `reaped` hands it to the rank's wrapper (rank_registry.py). The template is spared
by every attempt's sweep, and stopped with the job. Where it cannot be used (--no-warm-ranks, a
command that is not ``python SCRIPT`` or ``python -m MODULE``, a layer whose launcher starts the
wrappers and does not declare what it adds to their environment: RankWrapper.warm_env) the ranks
start cold, as before; `why_cold` says why, for the dry run and one line. Under a launcher (torchrun,
horovodrun, deepspeed) each wrapper it starts asks the template as under --layer direct: the template
is built with what the launcher inherits plus what the layer says it adds (warm_ranks.launcher_env).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
from collections.abc import Callable, Mapping

from detlaunch.outcome import ProcessEnd
from detlaunch.planning.plan import LaunchPlan
from detlaunch.planning.warm_ranks import PRELOAD_ENV, imports, ranks_env, why_cold, why_not_forkable
from detlaunch.rank import warm
from detlaunch.system import procs

TITLE_ROOM = " " * 2048  # room in the template's command line for a forked rank's own (template.retitle)
TEMPLATE_PATH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rank", "template.py")
PRELOAD_FAILED = 3  # template.PRELOAD_FAILED: it said why itself
class RankTemplate:
    """This node's rank template process, when there is one."""

    def __init__(self, plan: LaunchPlan, say: Callable[[str], None],
                 rank_reaped: Callable[[int, ProcessEnd], None]) -> None:
        """rank_reaped: told of every other orphan this supervisor reaps (a warm rank: its wrapper learns)."""
        self.plan, self.say, self.rank_reaped = plan, say, rank_reaped
        self.path = os.path.join(plan.run_dir, warm.SOCKET_NAME)
        self.pid: int | None = None
        self.listener: socket.socket | None = None

    def start(self, env: Mapping[str, str], defaults: Mapping[str, str], spared: set[int]) -> None:
        """Start it with the environment rank 0 of this node will have (its import-time part is what counts:
        what its starter inherits, and what a launcher adds), spared by this attempt's sweep (`spared`)."""
        if why_cold(self.plan):
            why = why_not_forkable(self.plan, env)
            if why:
                self.say(f"warm ranks: {why}: ranks start cold")
            return
        template_env = ranks_env(self.plan, env, defaults)
        template_env[PRELOAD_ENV] = ",".join(imports(self.plan))
        parsed = warm.python_command(self.plan.user_command)
        assert parsed is not None
        interpreter = parsed[0]
        exe = shutil.which(interpreter[0], path=template_env.get("PATH", os.defpath))
        if not exe:
            return  # the ranks say it, cold
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            listener.bind(self.path)
            os.chmod(self.path, 0o600)
            listener.listen(1024)
            listener.set_inheritable(True)
            self.pid = procs.spawn((exe, *interpreter[1:], TEMPLATE_PATH, str(listener.fileno()), exe, TITLE_ROOM),
                                   template_env, output_fd=2)
        except OSError as e:
            self.say(f"warm ranks: the rank template cannot start ({e.strerror or e}): ranks start cold")
            self.close_socket()
        finally:
            listener.close()  # the template has its own copy
        self.spare(spared)

    def welcome(self) -> dict[str, str]:
        return {"template": self.path} if self.pid is not None else {}

    def spare(self, spared: set[int]) -> None:
        if self.pid is not None:
            spared.add(self.pid)

    def reaped(self, pid: int, end: ProcessEnd) -> None:
        """An orphan's end: the template's (it is gone: ranks start cold from now on), or a warm rank's."""
        if pid != self.pid:
            self.rank_reaped(pid, end)
            return
        self.pid = None
        self.close_socket()
        if end.code != PRELOAD_FAILED:  # it said why itself otherwise
            self.say(f"warm ranks: the rank template (pid {pid}) ended ({end.describe()}): ranks start cold")

    def close_socket(self) -> None:
        try:
            os.unlink(self.path)
        except OSError:
            pass

    def stop(self) -> None:
        """The job ends: SIGKILL it (it runs nothing of the job's) and reap it."""
        if self.pid is not None:
            procs.signal_pid(self.pid, signal.SIGKILL)
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass
            self.pid = None
        self.close_socket()
