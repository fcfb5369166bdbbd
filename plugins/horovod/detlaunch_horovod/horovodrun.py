"""horovodrun, as ``python -m detlaunch_horovod.horovodrun ARGS``: the same run, with its slow start done at import.

horovodrun's own start is ~0.4 s of imports and then, before it starts any rank, a probe of the
build for the controller it was told (``--gloo``): horovod forks a child that imports its torch
extension, and so torch (~2 s a start). Both are done here at import, so that a standby of this
module (``Command.standby``, see detlaunch's standby.py) has them behind it when the next attempt
is due. The probe is horovod's own (``gloo_built``/``mpi_built``, cached in horovodrun's process),
called as horovodrun calls it; its result is the one horovodrun would get, so a run here behaves as
horovodrun's: the same arguments, environment, output and exit code (argparse's name included).

Which controller to probe comes in DETLAUNCH_HOROVOD_PROBE (gloo or mpi; the layer sets it), taken
out of the environment at import: neither horovodrun's ranks nor its helpers see it.
"""

import os
import sys

from horovod.common.util import gloo_built, mpi_built
from horovod.runner.launch import run_commandline

PROBE_ENV = "DETLAUNCH_HOROVOD_PROBE"
PROBES = {"gloo": gloo_built, "mpi": mpi_built}

probe = PROBES.get(os.environ.pop(PROBE_ENV, ""))
if probe is not None and __name__ != "__mp_main__":  # not again in horovodrun's spawned helpers
    # run_controller(): `verbose = verbosity >= 2`, False for horovodrun's --verbose (store_true): this key
    probe(verbose=False)


def main() -> int | None:
    sys.argv[0] = "horovodrun"  # what argparse names in its messages, as under the console script
    result: int | None = run_commandline()
    return result


if __name__ == "__main__":
    sys.exit(main())
