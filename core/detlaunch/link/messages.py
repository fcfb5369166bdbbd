"""What the nodes' supervisors say to each other over the job link: every kind of message, named once.

One JSON object per line (wire.py), its kind in "t". Who sends each kind, and its fields:

    kind        sent by  fields                       meaning
    hb          both     -                            still here (every --heartbeat; the wire skips it unread)
    challenge   chief    job, nonce                   the chief's first words: prove you are a node of `job`
    auth        worker   node, nonce, addr, mac, spare  I am node `node` (mac over the chief's nonce); prove
                                                      yourself over my `nonce`; `addr` is my own address;
                                                      `spare` (not null): I am that spare, sent to its place
    welcome     chief    mac, attempt, hold, spare    mac over the worker's nonce; you join `attempt`, and
                                                      wait for "go" first when `hold`; `spare` (not null):
                                                      your place is taken, join again as this spare
    rank_exit   worker   status                       one of my ranks ended (its RankStatus)
    failed      worker   failure                      this node failed for another reason (its sshd, a signal)
    bye         worker   ranks                        my part of the attempt is over: every rank's end
    ask         worker   id, what, args               a client on my node asks the job (control.py)
    reply       worker   id, data                     my node's part of the answer you gather as `id`
    stop        chief    failure                      the job stops: the verdict so far
    request     chief    id, what, args               your node's part of a question I gather
    answer      chief    id, data                     the job's answer to your `ask` number `id`
    restart     chief    attempt, delay               start `attempt` in `delay` s (null: wait for "go")
    go          chief    attempt, members             every node is back: start `attempt` now, on the places
                                                      `members` (node-rank order; null: unchanged)
    end         chief    failure                      the job is over: the final verdict (null: it succeeded)
    promote     chief    place                        (to a spare) take node `place`'s place: leave, and join
                                                      again as that node (node/spare.py)
    members     chief    m                            the job's membership and restart state, whole, to a
                                                      node that has none yet (membership.py): what a
                                                      successor needs of the chief
    members_change chief c                            what changed in it since the last one sent

Reading is in one place, `decode`: a line that is not JSON, or a known kind with a field missing
or of the wrong type, is `Malformed`; a kind this link does not know (or that is not a JSON object),
or one the sending side never sends, is `UnknownKind`. wire.py decides what each costs the
connection. A failure a message carries is read leniently: one that cannot be read counts as none
(a stop still stops; a `failed` without one is ignored).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any, ClassVar, TypeVar, cast

from detlaunch.link.membership import Membership, MembershipChange
from detlaunch.outcome import Failure, RankStatus

CHIEF, WORKER, BOTH = "chief", "worker", "both"  # who sends a kind


class NotAMessage(ValueError):
    """What a peer sent is no message of the job link (the text says what it was)."""


class UnknownKind(NotAMessage):
    """A kind this link does not know, or one the side that sent it never sends."""


class Malformed(NotAMessage):
    """A known kind with a field missing or of the wrong type."""


# -- how each field is read from JSON (None: the key is missing) and written back --------------------------
def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise TypeError(f"not a string: {v!r}"[:80])
    return v


def _integer(v: Any) -> int:
    """Strictly a JSON integer (not true or false): a node number the chief compares."""
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"not an integer: {v!r}"[:80])
    return v


def _failure(v: Any) -> Failure | None:
    try:
        return Failure.from_json(v) if v else None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def _status(v: Any) -> RankStatus:
    if not isinstance(v, dict):
        raise TypeError("not an object")
    return RankStatus.from_json(v)


def _failure_json(f: Failure | None) -> Any:
    return f.to_json() if f is not None else None


def _field(read: Callable[[Any], Any], *, key: str | None = None,
           write: Callable[[Any], Any] = lambda v: v, optional: bool = False) -> Any:
    """A message field: `read` converts the JSON value (raising TypeError/ValueError/KeyError on a bad one);
    `key` names it on the wire when that differs from the attribute; `optional`: None unless given (a field
    added later: an older peer's message has none)."""
    if optional:
        return dataclasses.field(default=None, metadata={"read": read, "key": key, "write": write})
    return dataclasses.field(metadata={"read": read, "key": key, "write": write})


class Kind:
    """What every message class says of itself: its kind ("t") and the side that sends it."""

    kind: ClassVar[str]
    sender: ClassVar[str]


KINDS: dict[str, type[Kind]] = {}
K = TypeVar("K", bound=type[Kind])


def _kind(kind: str, sender: str) -> Callable[[K], K]:
    def register(cls: K) -> K:
        cls.kind, cls.sender = kind, sender
        KINDS[kind] = cls
        return cls
    return register


# -- the kinds ---------------------------------------------------------------------------------------------
@_kind("hb", BOTH)
@dataclasses.dataclass(frozen=True)
class Heartbeat(Kind):
    pass


@_kind("challenge", CHIEF)
@dataclasses.dataclass(frozen=True)
class Challenge(Kind):
    job: str = _field(_text)
    nonce: str = _field(_text)


@_kind("auth", WORKER)
@dataclasses.dataclass(frozen=True)
class Auth(Kind):
    node: int = _field(_integer)
    nonce: str = _field(_text)
    addr: str = _field(lambda v: str(v or ""))  # "": the chief takes the connection's source address
    mac: str = _field(_text)
    # A promoted spare joining the place it was sent to: its spare number, by which the chief tells it from the
    # lost node's own new detlaunch claiming the same place (link/places.py), whatever their addresses.
    spare: int | None = _field(lambda v: None if v is None else _integer(v), optional=True)


@_kind("welcome", CHIEF)
@dataclasses.dataclass(frozen=True)
class Welcome(Kind):
    mac: str = _field(_text)
    attempt: int = _field(lambda v: int(v or 1))
    hold: bool = _field(bool)
    # A lost node's new detlaunch whose place is taken: it joins again as this spare (link/spares.py).
    spare: int | None = _field(lambda v: None if v is None else _integer(v), optional=True)


@_kind("rank_exit", WORKER)
@dataclasses.dataclass(frozen=True)
class RankExit(Kind):
    status: RankStatus = _field(_status, write=lambda s: s.to_json())


@_kind("failed", WORKER)
@dataclasses.dataclass(frozen=True)
class Failed(Kind):
    failure: Failure | None = _field(_failure, write=_failure_json)


@_kind("bye", WORKER)
@dataclasses.dataclass(frozen=True)
class Bye(Kind):
    ranks: tuple[RankStatus, ...] = _field(lambda v: tuple(_status(d) for d in v or ()),
                                           write=lambda ranks: [r.to_json() for r in ranks])


@_kind("ask", WORKER)
@dataclasses.dataclass(frozen=True)
class Ask(Kind):
    key: int = _field(int, key="id")
    what: str = _field(str)
    args: dict[str, Any] = _field(lambda v: dict(v or {}))


@_kind("reply", WORKER)
@dataclasses.dataclass(frozen=True)
class Reply(Kind):
    key: int = _field(int, key="id")
    data: Any = _field(lambda v: v)


@_kind("stop", CHIEF)
@dataclasses.dataclass(frozen=True)
class Stop(Kind):
    failure: Failure | None = _field(_failure, write=_failure_json)


@_kind("request", CHIEF)
@dataclasses.dataclass(frozen=True)
class Request(Kind):
    key: int = _field(int, key="id")
    what: str = _field(str)
    args: dict[str, Any] = _field(lambda v: dict(v or {}))


@_kind("answer", CHIEF)
@dataclasses.dataclass(frozen=True)
class Answer(Kind):
    key: int = _field(int, key="id")
    data: dict[str, Any] = _field(lambda v: dict(v or {}))


@_kind("restart", CHIEF)
@dataclasses.dataclass(frozen=True)
class Restart(Kind):
    attempt: int = _field(int)
    delay: float | None = _field(lambda v: None if v is None else float(v))  # None: wait for go


@_kind("go", CHIEF)
@dataclasses.dataclass(frozen=True)
class Go(Kind):
    attempt: int = _field(int)
    # The places that run `attempt`, in node-rank order (planning/membership.py); None: as the last attempt.
    members: tuple[int, ...] | None = _field(lambda v: None if v is None else tuple(_integer(x) for x in v),
                                             write=lambda v: None if v is None else list(v), optional=True)


@_kind("end", CHIEF)
@dataclasses.dataclass(frozen=True)
class End(Kind):
    failure: Failure | None = _field(_failure, write=_failure_json)


@_kind("promote", CHIEF)
@dataclasses.dataclass(frozen=True)
class Promote(Kind):
    place: int = _field(_integer)


@_kind("members", CHIEF)
@dataclasses.dataclass(frozen=True)
class Members(Kind):
    m: Membership = _field(Membership.from_json, write=lambda m: m.to_json())


@_kind("members_change", CHIEF)
@dataclasses.dataclass(frozen=True)
class MembersChange(Kind):
    c: MembershipChange = _field(MembershipChange.from_json, write=lambda c: c.to_json())


Message = (Heartbeat | Challenge | Auth | Welcome | RankExit | Failed | Bye | Ask | Reply | Stop | Request | Answer
           | Restart | Go | End | Promote | Members | MembersChange)


def statuses_in(m: Message) -> tuple[RankStatus, ...]:
    """The rank statuses a worker's message carries: the chief takes them only when each is of that worker's node."""
    match m:
        case RankExit(status=status):
            return (status,)
        case Bye(ranks=ranks):
            return ranks
        case Failed(failure=failure) if failure is not None and failure.rank is not None:
            return (failure.rank,)
    return ()


# -- reading and writing ---------------------------------------------------------------------------------
def decode(line: bytes, sent_by: str) -> Message:
    """The message on one line from the `sent_by` side (CHIEF or WORKER); NotAMessage when it is none."""
    try:
        raw = json.loads(line)
    except (ValueError, RecursionError):  # RecursionError: "[[[[...", which anyone may send before auth
        raise Malformed("what is not JSON") from None
    if not isinstance(raw, dict):
        raise UnknownKind("what is not a JSON object")
    name = raw.get("t")
    cls = KINDS.get(name) if isinstance(name, str) else None
    if cls is None:
        raise UnknownKind(f"a message of unknown kind {name!r}"[:100])
    if cls.sender not in (sent_by, BOTH):
        raise UnknownKind(f"a message of kind {name!r}, which a {sent_by} never sends")
    values = {}
    for f in dataclasses.fields(cast(Any, cls)):
        key = f.metadata["key"] or f.name
        try:
            values[f.name] = f.metadata["read"](raw.get(key))
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as e:
            raise Malformed(f"a message of kind {name!r} with a bad {key!r} ({e})"[:200]) from None
    return cast(Message, cls(**values))


def encode(message: Message) -> bytes:
    """One message as one line's bytes (without the newline)."""
    fields = {f.metadata["key"] or f.name: f.metadata["write"](getattr(message, f.name))
              for f in dataclasses.fields(message)}
    return json.dumps({"t": message.kind, **fields}).encode()
