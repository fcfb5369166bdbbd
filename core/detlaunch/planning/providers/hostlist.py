"""SLURM's compressed host lists and per-node counts, as pure functions.

SLURM writes node lists compressed (``gpu[01-04,07],cpu3``) and per-node counts
run-length encoded (``2(x3),1``). These functions expand them exactly as
``scontrol show hostnames`` does (the tests check them against it), and
compress a list back, so that property-based tests can round-trip them.

Grammar (one entry per top-level comma; commas inside brackets list ranges):
``prefix[ranges]suffix[ranges]...``, ranges ``N`` or ``LO-HI``; several bracket
groups expand as a cartesian product, leftmost slowest (``a[1-2]b[3-4]`` is
a1b3 a1b4 a2b3 a2b4). A zero-padded low bound sets the width (``n[08-11]``:
n08..n11; ``n[01-100]``: n01..n99, n100).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Sequence

from detlaunch.errors import ClusterError

MAX_HOSTS = 1_000_000  # a typo such as n[1-99999999] must not eat the node's memory
_RANGE = re.compile(r"([0-9]+)(?:-([0-9]+))?")
_COUNT = re.compile(r"([0-9]+)(?:\(x([0-9]+)\))?")
_TRAILING_DIGITS = re.compile(r"^(.*?)([0-9]*)$", re.S)
_FORBIDDEN = set("[],") | {" ", "\t", "\n"}


def _split_top_level(text: str, what: str) -> list[str]:
    """Split at commas outside brackets; reject unbalanced or nested brackets."""
    entries, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            if depth:
                raise ClusterError(f"{what}: nested '[' at position {i} in {text!r}")
            depth = 1
        elif c == "]":
            if not depth:
                raise ClusterError(f"{what}: ']' without '[' at position {i} in {text!r}")
            depth = 0
        elif c == "," and not depth:
            entries.append(text[start:i])
            start = i + 1
    if depth:
        raise ClusterError(f"{what}: '[' is never closed in {text!r}")
    entries.append(text[start:])
    return entries


def _expand_ranges(body: str, entry: str, what: str) -> list[str]:
    """``01-04,07`` -> ['01', '02', '03', '04', '07'] (width from each low bound)."""
    out: list[str] = []
    for part in body.split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            raise ClusterError(f"{what}: bad range {part!r} in {entry!r}; write N or LO-HI, e.g. n[01-04,07]")
        lo_text, hi_text = m.group(1), m.group(2)
        lo, hi = int(lo_text), int(hi_text if hi_text is not None else lo_text)
        if hi < lo:
            raise ClusterError(f"{what}: range {part!r} in {entry!r} goes backwards; write LO-HI with LO <= HI")
        if hi - lo + 1 + len(out) > MAX_HOSTS:
            raise ClusterError(f"{what}: {entry!r} names more than {MAX_HOSTS} hosts")
        width = len(lo_text)
        out.extend(f"{n:0{width}d}" for n in range(lo, hi + 1))
    return out


def _expand_entry(entry: str, what: str) -> Iterator[str]:
    """One top-level entry: literal pieces and bracket groups, as a cartesian product."""
    parts = re.split(r"\[([^\]]*)\]", entry)  # literal, ranges, literal, ranges, ..., literal
    pieces: list[list[str]] = []
    for i, part in enumerate(parts):
        if i % 2:
            pieces.append(_expand_ranges(part, entry, what))
        elif part:
            if any(c.isspace() for c in part):
                raise ClusterError(f"{what}: white space in host name {entry!r}")
            pieces.append([part])
    for combo in itertools.product(*pieces):
        yield "".join(combo)


def expand_hostlist(text: str, what: str = "host list") -> list[str]:
    """Every host of a SLURM host list, in order (``n[1-2],x`` -> n1, n2, x).

    :param what: how to name the input in errors (``SLURM_JOB_NODELIST=...``).
    :raises ClusterError: one line saying what is malformed, where.
    """
    text = text.strip()
    if not text:
        raise ClusterError(f"{what} is empty")
    hosts: list[str] = []
    for entry in _split_top_level(text, what):
        if not entry:
            raise ClusterError(f"{what}: empty entry in {text!r}; remove the extra comma")
        for host in _expand_entry(entry, what):
            hosts.append(host)
            if len(hosts) > MAX_HOSTS:
                raise ClusterError(f"{what} names more than {MAX_HOSTS} hosts")
    return hosts


def _split_name(host: str) -> tuple[str, str]:
    m = _TRAILING_DIGITS.match(host)
    assert m is not None
    return m.group(1), m.group(2)


def _fits(digits: str, value: int, width: int) -> bool:
    """Does formatting `value` with the run's `width` give back exactly `digits`?"""
    return f"{value:0{width}d}" == digits


def compress_hostlist(hosts: Sequence[str]) -> str:
    """A compact SLURM form of `hosts` that expands back to exactly `hosts`, never longer than them.

    Consecutive hosts that share a prefix and whose trailing numbers count up by one
    (with the first one's zero padding) become one range when that is shorter:
    n01,n02,n03,x -> n[01-03],x. Order is kept: ``expand_hostlist(compress_hostlist(h)) == h``.
    """
    for h in hosts:
        if not h or _FORBIDDEN & set(h):
            raise ClusterError(f"cannot write host {h!r} in a SLURM host list")
    out: list[str] = []
    i = 0
    while i < len(hosts):
        prefix, digits = _split_name(hosts[i])
        if not digits:
            out.append(hosts[i])
            i += 1
            continue
        width, start = len(digits), int(digits)
        j = i + 1
        while j < len(hosts):
            p, d = _split_name(hosts[j])
            if p != prefix or not d or int(d) != start + (j - i) or not _fits(d, int(d), width):
                break
            j += 1
        plain = ",".join(hosts[i:j])
        ranged = f"{prefix}[{digits}-{start + (j - i) - 1:0{width}d}]"
        out.append(ranged if j - i > 1 and len(ranged) <= len(plain) else plain)
        i = j
    return ",".join(out)


def expand_counts(text: str, what: str = "count list") -> list[int]:
    """SLURM's per-node counts: ``2(x3),1`` -> [2, 2, 2, 1]."""
    counts: list[int] = []
    for part in text.strip().split(","):
        m = _COUNT.fullmatch(part.strip())
        if not m:
            raise ClusterError(f"{what}: cannot read {part!r} in {text!r}; expected e.g. 2(x3),1")
        repeat = int(m.group(2) or 1)
        if repeat < 1 or len(counts) + repeat > MAX_HOSTS:
            raise ClusterError(f"{what}: bad repeat count in {part!r}")
        counts.extend([int(m.group(1))] * repeat)
    return counts


def compress_counts(counts: Sequence[int]) -> str:
    """The inverse of :func:`expand_counts`: [2, 2, 2, 1] -> ``2(x3),1``."""
    parts = []
    for value, group in itertools.groupby(counts):
        n = len(list(group))
        parts.append(f"{value}(x{n})" if n > 1 else str(value))
    return ",".join(parts)
