import sys

if sys.argv[1:2] in (["status"], ["stacks"]):  # a question to a running job: skip the launcher's imports
    from detlaunch.cli.control import main

    sys.exit(main())
from detlaunch.cli.main import main

sys.exit(main())
