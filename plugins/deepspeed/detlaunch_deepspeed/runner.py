"""deepspeed's runner (the ``deepspeed`` command), as ``python -m detlaunch_deepspeed.runner ARGS``.

The runner spends its start importing deepspeed, and so torch (seconds a start); as a module, a
standby of it (``Command.standby``, see detlaunch's standby.py) is the next attempt's runner,
waiting past those imports while an attempt runs. A run here is the ``deepspeed`` console
script's: the same arguments, environment, output and exit code (argparse's name included).
"""

import sys

from deepspeed.launcher.runner import main as runner_main


def main() -> None:
    sys.argv[0] = "deepspeed"  # what argparse names in its messages, as under the console script
    runner_main()


if __name__ == "__main__":
    main()
