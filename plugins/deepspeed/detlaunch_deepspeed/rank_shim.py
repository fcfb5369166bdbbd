"""Between deepspeed's launcher and detlaunch's rank wrapper: what deepspeed alone would give a script.

deepspeed's launcher runs ``python -u THIS [--local_rank=N] AT MASTER_ADDR RANK_COMMAND...``:
RANK_COMMAND is detlaunch's rank wrapper followed by the user's command, AT the index in
RANK_COMMAND right after the user's script, MASTER_ADDR the address the user asked for ("-"
for deepspeed's own: an empty word would not survive pdsh's remote shell). This execs
RANK_COMMAND with ``--local_rank=N`` inserted at AT, so the script sees ``train.py
--local_rank=N ARGS`` exactly as under deepspeed alone, while the rank wrapper (which would take
``--local_rank`` for one of its own options) stays in front. On one node deepspeed's runner
always exports MASTER_ADDR=127.0.0.1; a ``--master-addr`` the user gave is put back here.

Devices: deepspeed's launch sets CUDA_VISIBLE_DEVICES to the node's slots from the hostfile, as
indices (``0,1`` for ``slots=2``), whatever the node had. On several nodes each node's sshd gives its
sessions that node's own list in NODE_DEVICES (its detlaunch's CUDA_VISIBLE_DEVICES): deepspeed's
indices pick from it (``0,1`` of ``4,5,6,7`` is ``4,5``), as they would have picked from the node's GPUs.
A node that had no list keeps deepspeed's, as deepspeed alone would give it.

Words: on several nodes deepspeed hands the command to pdsh as one line for a remote shell, its
words unquoted (a word with a space wrapped in double quotes, where ``$`` and backquotes still
run), after an unquoted ``cd`` to its directory. So there RANK_COMMAND comes as one word,
``--words=`` and the urlsafe base64 of JSON ``{"cwd": ..., "command": [...]}``, which no shell
changes: every word and the directory arrive exactly as given (see encode_words).
Stdlib only; it replaces itself, so no process is left between the launcher and the wrapper.
"""

import base64
import json
import os
import sys

NODE_DEVICES = "DETLAUNCH_NODE_CUDA_VISIBLE_DEVICES"
WORDS = "--words="


def encode_words(command: list[str], cwd: str) -> str:
    """The rank command and its directory as one word that a shell leaves as it is."""
    payload = json.dumps({"cwd": cwd, "command": command}).encode()
    return WORDS + base64.urlsafe_b64encode(payload).decode()


def decode_words(argv: list[str]) -> tuple[list[str], str | None]:
    """(the command, the directory to run it in, or None: here) from the words deepspeed passed."""
    if len(argv) == 1 and argv[0].startswith(WORDS):
        payload = json.loads(base64.urlsafe_b64decode(argv[0][len(WORDS):]))
        return list(payload["command"]), payload["cwd"]
    return argv, None


def rank_command(argv: list[str]) -> tuple[list[str], str, str | None]:
    """``[--local_rank=N], AT, MASTER_ADDR, *command`` (or its encoded word) -> (the command to exec,
    MASTER_ADDR or "", the directory to run it in or None)."""
    local_rank = [argv.pop(0)] if argv and argv[0].startswith("--local_rank=") else []
    at, master_addr = int(argv[0]), argv[1]
    command, cwd = decode_words(argv[2:])
    return [*command[:at], *local_rank, *command[at:]], "" if master_addr == "-" else master_addr, cwd


def node_devices(deepspeeds: str | None, own: str | None) -> str | None:
    """The rank's CUDA_VISIBLE_DEVICES: deepspeed's indices into the node's own list; None: keep deepspeed's."""
    if own is None or deepspeeds is None:
        return None
    listed = [d.strip() for d in own.split(",")] if own.strip() else []
    picked = []
    for index in deepspeeds.split(","):
        index = index.strip()
        if not index.isdigit():
            return own  # not deepspeed's indices: the node's own list
        if int(index) < len(listed):
            picked.append(listed[int(index)])
    return ",".join(picked)


def main() -> None:
    command, master_addr, cwd = rank_command(sys.argv[1:])
    if cwd is not None:
        os.chdir(cwd)
    if master_addr:
        os.environ["MASTER_ADDR"] = master_addr
    devices = node_devices(os.environ.get("CUDA_VISIBLE_DEVICES"), os.environ.pop(NODE_DEVICES, None))
    if devices is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = devices
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
