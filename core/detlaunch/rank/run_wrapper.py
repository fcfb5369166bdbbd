"""What each rank's `python -S` runs: the rank wrapper (wrapper.py), loaded from its bytecode.

Python compiles the script it is given on every start and keeps what compiling left on its heap:
for the wrapper's 600 lines, about 1.6 MB more in every rank's wrapper (bench direct: PSS) and a
few milliseconds. A module it imports is read from its cached bytecode instead (__pycache__,
written on the first run or when detlaunch is installed). So the supervisor starts this small
script, and the wrapper is imported from its folder (sys.path[0] under `python -S`).
"""

import sys

try:
    from . import wrapper  # as detlaunch.rank.run_wrapper: only for type checkers
except ImportError:  # run as a script, as always
    import wrapper  # type: ignore[no-redef]

if __name__ == "__main__":
    sys.exit(wrapper.main())
