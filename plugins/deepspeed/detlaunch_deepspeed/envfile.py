"""deepspeed's env file: what the ranks on every node get, since an ssh session starts with a bare environment.

With pdsh, deepspeed's runner builds ``export K=V; ...`` for each remote node from its env file
(``K=V`` lines), and the remote shell evaluates it. This module turns an environment into that
file: every variable except the deny-list, each value quoted so that it reaches the rank unchanged
through the deepspeed version at hand.

It is also the program the chief's supervisor runs right before deepspeed starts
(``python -S envfile.py --quoting Q [--deny RE]... --replace FILE``): it writes the environment the
launcher really runs with (the user's, plus what detlaunch and every plugin add), which a stage hook
cannot see. It never writes over a file it finds, unless told --replace: the layer's own file of the
last attempt, which a restarted attempt writes again. Standard library only, so ``-S`` keeps it quick.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from collections.abc import Iterable, Mapping

# The seed's deny-list (variables unsafe to share between nodes), and detlaunch's node-local ones:
# a rank finds its node's supervisor through DETLAUNCH_SSHD_SUPERVISOR, which that node's sshd sets;
# an `export` of the chief's value would run after it and point the rank at the wrong socket. The same
# sshd gives each node's ranks that node's own CUDA_VISIBLE_DEVICES (and its copy for rank_shim.py).
SEED_DENY = ("BASH_FUNC_.*", "OLDPWD", "HOSTNAME", ".*CUDA_VISIBLE_DEVICES", "SLURM_PROCID",
             "DET_SLOT_IDS", "DET_AGENT_ID")
NODE_LOCAL_DENY = ("DETLAUNCH_SUPERVISOR", "DETLAUNCH_SSHD_SUPERVISOR", "DETLAUNCH_NODE_RANK",
                   "DETLAUNCH_NODE_CUDA_VISIBLE_DEVICES")
DENY = SEED_DENY + NODE_LOCAL_DENY

# How deepspeed's MultiNodeRunner.add_export treats a value read from the file (it strips it first):
#   "raw"    before 0.6.2: deepspeed shell-quotes it itself; write it as it is.
#   "shell"  0.6.2 to 0.15.1: written into `export K=V;` as it is; write it shlex-quoted.
#   "double" 0.15.2 on: wrapped in double quotes (always until 0.16.4, when it holds any character
#            outside [\w@%+=:,./-] since 0.16.5); a shlex-quoted value would keep its quotes, so
#            escape what double quotes still expand instead.
QUOTINGS = ("raw", "shell", "double")
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_DOUBLE_SPECIAL = re.compile(r'([\\"$`])')


def parse_version(text: str) -> tuple[int, ...]:
    """The numeric release of a version string: ``0.15.2+cpu`` -> (0, 15, 2)."""
    parts = []
    for piece in text.split("+")[0].split("."):
        digits = re.match(r"\d+", piece)
        if not digits:
            break
        parts.append(int(digits.group()))
        if digits.group() != piece:
            break
    return tuple(parts)


def quoting_for(version: tuple[int, ...]) -> str:
    if version < (0, 6, 2):
        return "raw"
    if version < (0, 15, 2):
        return "shell"
    return "double"


def quote_value(value: str, quoting: str) -> str:
    if quoting == "shell":
        return shlex.quote(value)
    if quoting == "double":
        return _DOUBLE_SPECIAL.sub(r"\\\1", value)
    if quoting == "raw":
        return value
    raise ValueError(f"unknown quoting {quoting!r} (one of {', '.join(QUOTINGS)})")


def is_denied(name: str, deny: Iterable[str] = DENY) -> bool:
    """Patterns match whole names (the seed matched prefixes: OLDPWD also hid OLDPWDX)."""
    return any(re.fullmatch(pattern, name) for pattern in deny)


def why_not_exported(name: str, value: str) -> str | None:
    """Why a variable that is not denied still cannot travel through the env file, or None.

    (deepspeed strips every value it reads: leading and trailing blanks are lost, with or without
    detlaunch; a venv's PS1 or VIRTUAL_ENV_PROMPT loses its final space.)
    """
    if not _NAME.match(name):
        return "its name is not a shell variable name (the remote shell's `export` would fail)"
    if "\n" in value or "\r" in value:
        return "its value holds a newline, and deepspeed reads the env file line by line"
    return None


def env_file_lines(env: Mapping[str, str], quoting: str,
                   deny: Iterable[str] = DENY) -> tuple[list[str], list[tuple[str, str]]]:
    """The env file's lines (sorted by name), and the (name, reason) of each variable left out
    for a reason other than the deny-list."""
    deny = tuple(deny)
    lines, skipped = [], []
    for name in sorted(env):
        value = env[name]
        if is_denied(name, deny):
            continue
        reason = why_not_exported(name, value)
        if reason:
            skipped.append((name, reason))
        else:
            lines.append(f"{name}={quote_value(value, quoting)}")
    return lines, skipped


def user_env_files(env: Mapping[str, str], cwd: str) -> list[str]:
    """The env files deepspeed alone would read (``$DS_ENV_FILE`` or ``.deepspeed_env``, in the
    home directory, then the current one): detlaunch points DS_ENV_FILE at its own file, so it
    copies their lines after its own, where they win as they would have."""
    name = env.get("DS_ENV_FILE") or ".deepspeed_env"
    home = env.get("HOME") or os.path.expanduser("~")
    found = []
    for folder in (home, cwd):
        path = os.path.join(folder, name)
        if os.path.isfile(path) and path not in found:
            found.append(path)
    return found


def user_lines(text: str, deny: Iterable[str] = DENY) -> list[str]:
    """A user's env file, as deepspeed reads it, minus blank lines and denied names."""
    deny = tuple(deny)
    out = []
    for line in text.splitlines():
        name, sep, _ = line.partition("=")
        if sep and name.strip() and not is_denied(name.strip(), deny):
            out.append(line)
    return out


def render(env: Mapping[str, str], quoting: str, deny: Iterable[str] = DENY,
           extra: Iterable[str] = ()) -> tuple[str, list[tuple[str, str]]]:
    lines, skipped = env_file_lines(env, quoting, deny)
    return "".join(f"{line}\n" for line in [*lines, *extra]), skipped


def main(argv: list[str]) -> int:
    quoting, deny, out, replace = "double", [], None, False
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg in ("--quoting", "--deny") and args:
            value = args.pop(0)
            if arg == "--quoting":
                quoting = value
            else:
                deny.append(value)
        elif arg == "--replace":
            replace = True
        elif out is None and (arg == "-" or not arg.startswith("-")):
            out = arg
        else:
            out = None
            break
    if out is None or quoting not in QUOTINGS:
        print("usage: envfile.py [--quoting raw|shell|double] [--deny REGEX]... [--replace] FILE|-", file=sys.stderr)
        return 2
    deny = deny or list(DENY)
    extra: list[str] = []
    for path in user_env_files(os.environ, os.getcwd()):
        with open(path, encoding="utf-8", errors="surrogateescape") as f:
            extra += user_lines(f.read(), deny)
    text, skipped = render(os.environ, quoting, deny, extra)
    for name, reason in skipped:
        print(f"detlaunch: warning: not exporting {name} to the ranks: {reason}", file=sys.stderr)
    if out == "-":
        sys.stdout.write(text)
        return 0
    if replace:  # the layer's own file from the last attempt (a restart runs the prelaunch again)
        try:
            os.unlink(out)
        except FileNotFoundError:
            pass
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8", errors="surrogateescape") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
