"""A minimal layer, to test the contract suite itself: it runs each rank as a plain local process.

TOY_MODE (read on import and while planning) makes it break one rule of the contract:

    heavy          imports toy_heavy, a module its tests declare heavy
    random         its environment hook returns a new value on each call
    chief-ip       its launcher's environment overrides DET_CHIEF_IP
    no-wrapper     its launcher runs the user's command without the rank wrapper
    leak           planning starts a process that outlives the job
    wrong-rank     it names a rank variable its launcher never sets
    unknown-hook   it implements a hook with a misspelled name
    single         declares multi_node = False, and refuses several nodes with a detlaunch error
    single-crash   declares multi_node = False, but crashes on several nodes (not a detlaunch error)
    direct         no launcher: declares rank_commands = True and starts each rank itself (correct)
    direct-twice   the same, but starts the node's first rank twice and its last rank never
    direct-undeclared  starts each rank itself without declaring rank_commands

Unset, it keeps every rule: the suite must pass. Not installed: tests put a dist-info for it on
PYTHONPATH (see test_contract.py).
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys

from detlaunch import Command, ConfigError, RankWrapper, Stage, StageContext, hookimpl

MODE = os.environ.get("TOY_MODE", "")
LAUNCHER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "toylauncher.py")

if MODE == "heavy":
    import toy_heavy  # noqa: F401
if MODE in ("single", "single-crash"):
    DETLAUNCH_CONTRACT = {"multi_node": False}
if MODE in ("direct", "direct-twice"):
    DETLAUNCH_CONTRACT = {"rank_commands": True}


def _stage(ctx: StageContext) -> Stage:
    c = ctx.cluster
    if MODE == "single" and c.num_nodes > 1:
        raise ConfigError("the toy layer runs on one node only")
    if MODE == "single-crash" and c.num_nodes > 1:
        raise ValueError("crash")
    if MODE == "leak":  # a double fork: the grandchild belongs to nobody detlaunch knows
        subprocess.Popen([sys.executable, "-c", "import os, time\nif os.fork() == 0: time.sleep(30)"]).wait()
    if MODE.startswith("direct"):
        ranks = [c.first_rank + i for i in range(c.local_slots)]
        if MODE == "direct-twice" and len(ranks) > 1:
            ranks[-1] = ranks[0]
        return Stage(commands=tuple(Command(ctx.rank_command, rank=r, env={"TOY_RANK": str(r)}) for r in ranks))
    command = ctx.user_command if MODE == "no-wrapper" else ctx.rank_command
    env = {"DET_CHIEF_IP": "192.0.2.1"} if MODE == "chief-ip" else {}
    argv = (sys.executable, LAUNCHER, str(c.first_rank), str(c.local_slots), "--", *command)
    return Stage(commands=(Command(argv, name="toy", env=env),))


@hookimpl
def detlaunch_rank_wrappers(ctx: StageContext) -> RankWrapper:
    return RankWrapper(rank_env=("TOY_WRONG_RANK",) if MODE == "wrong-rank" else ("TOY_RANK",))


@hookimpl
def detlaunch_environment(ctx: StageContext) -> dict[str, str]:
    return {"TOY_NONCE": secrets.token_hex(4)} if MODE == "random" else {"USE_TOY": "1"}


@hookimpl
def detlaunch_chief_stage(ctx: StageContext) -> Stage:
    return _stage(ctx)


@hookimpl
def detlaunch_worker_stage(ctx: StageContext) -> Stage:
    return _stage(ctx)


if MODE == "unknown-hook":

    @hookimpl
    def detlaunch_chief_stag(ctx: StageContext) -> None:
        """Misspelled: no such hook."""
