import sys

if sys.argv[1:2] in (["status"], ["stacks"]):  # a question to a running job: skip the launcher's imports
    from .control_cli import main

    sys.exit(main())
from .cli import main

sys.exit(main())
