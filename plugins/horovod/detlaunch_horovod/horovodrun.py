"""horovodrun, as ``python -m detlaunch_horovod.horovodrun ARGS``: the same run, with its slow start done at import.

horovodrun's own start is ~0.4 s of imports and then, before it starts any rank, a probe of the
build for the controller it was told (``--gloo``): horovod forks a child that imports its torch
extension, and so torch (~2 s a start). Both are done here at import, so that a standby of this
module (``Command.standby``, see detlaunch's standby.py) has them behind it when the next attempt
is due. The probe is horovod's own (``gloo_built``/``mpi_built``, cached in horovodrun's process),
called as horovodrun calls it; its result is the one horovodrun would get, so a run here behaves as
horovodrun's: the same arguments, environment, output and exit code (argparse's name included).

horovodrun starts each rank through a helper process of its own (multiprocessing's "spawn": a new
interpreter that imports the main module again, as ``__mp_main__``). There this module imports
nothing of horovod's launcher: the helper needs none of it, and each rank starts ~0.3 s sooner
(the horovodrun command's helpers import it all again).

Which controller to probe comes in DETLAUNCH_HOROVOD_PROBE (gloo or mpi; the layer sets it), taken
out of the environment at import: neither horovodrun's ranks nor its helpers see it.

One difference: when a rank fails, horovodrun (gloo, not elastic) terminates every other rank at
once, itself. Under detlaunch that is detlaunch's to do, for the whole job and after it has taken
the survivors' stacks (the dump before kill); horovodrun racing it sent its SIGTERM first now and
then, and the survivors' stacks were lost. So horovodrun here leaves the other ranks running
(`_leave_the_other_ranks_to_detlaunch`) and ends when they have ended, with the exit code it
would have had.

And its helper for each rank waits out detlaunch's grace period before it SIGKILLs the rank (grace.py).
"""

import os
import sys

PROBE_ENV = "DETLAUNCH_HOROVOD_PROBE"


def _start() -> None:
    """horovodrun's imports and its build probe, ahead of the run."""
    import horovod.runner.launch  # noqa: F401 (imported now, for the run)
    from horovod.common.util import gloo_built, mpi_built

    probe = {"gloo": gloo_built, "mpi": mpi_built}.get(os.environ.pop(PROBE_ENV, ""))
    if probe is not None:
        # run_controller(): `verbose = verbosity >= 2`, False for horovodrun's --verbose (store_true): this key
        probe(verbose=False)


if __name__ != "__mp_main__":  # not again in horovodrun's helper processes
    _start()


class _AsIfElastic:
    """horovodrun's settings, read by gloo_run._exec_command_fn, which makes its terminate-every-rank-on-a-
    failure event only for a run that is not elastic (and reads nothing else of `elastic`)."""

    elastic = True

    def __init__(self, settings: object) -> None:
        self._settings = settings

    def __getattr__(self, name: str) -> object:
        return getattr(self._settings, name)


def _leave_the_other_ranks_to_detlaunch() -> None:
    from horovod.runner import gloo_run

    make = gloo_run._exec_command_fn
    gloo_run._exec_command_fn = lambda settings: make(_AsIfElastic(settings))


def _wait_out_the_grace() -> None:
    from horovod.runner.common.util import safe_shell_exec

    from detlaunch_horovod import grace

    safe_shell_exec._exec_middleman = grace.exec_middleman  # what execute() starts in each helper, by name


def main() -> int | None:
    from horovod.runner.launch import run_commandline

    _leave_the_other_ranks_to_detlaunch()
    _wait_out_the_grace()
    sys.argv[0] = "horovodrun"  # what argparse names in its messages, as under the console script
    result: int | None = run_commandline()
    return result


if __name__ == "__main__":
    sys.exit(main())
