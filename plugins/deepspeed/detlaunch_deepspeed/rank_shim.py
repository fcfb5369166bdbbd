"""Between deepspeed's launcher and detlaunch's rank wrapper: what deepspeed alone would give a script.

deepspeed's launcher runs ``python -u THIS [--local_rank=N] AT MASTER_ADDR RANK_COMMAND...``:
RANK_COMMAND is detlaunch's rank wrapper followed by the user's command, AT the index in
RANK_COMMAND right after the user's script, MASTER_ADDR the address the user asked for ("-"
for deepspeed's own: an empty word would not survive pdsh's remote shell). This execs
RANK_COMMAND with ``--local_rank=N`` inserted at AT, so the script sees ``train.py
--local_rank=N ARGS`` exactly as under deepspeed alone, while the rank wrapper (which would take
``--local_rank`` for one of its own options) stays in front. On one node deepspeed's runner
always exports MASTER_ADDR=127.0.0.1; a ``--master-addr`` the user gave is put back here.
Stdlib only; it replaces itself, so no process is left between the launcher and the wrapper.
"""

import os
import sys


def rank_command(argv: list[str]) -> tuple[list[str], str]:
    """``[--local_rank=N], AT, MASTER_ADDR, *command`` -> (the command to exec, MASTER_ADDR or "")."""
    local_rank = [argv.pop(0)] if argv and argv[0].startswith("--local_rank=") else []
    at, master_addr, command = int(argv[0]), argv[1], argv[2:]
    return [*command[:at], *local_rank, *command[at:]], "" if master_addr == "-" else master_addr


def main() -> None:
    command, master_addr = rank_command(sys.argv[1:])
    if master_addr:
        os.environ["MASTER_ADDR"] = master_addr
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
