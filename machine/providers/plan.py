"""The conversation a request carries (specs/providers.md W2) and its incremental encoding (W10).

A derived history (L13) is almost always a conversation the providers accept as it is. The
plan is what makes *every* history one: it walks the messages once, in order, and turns them
into *units* that both request mappings encode in their own terms:

* an `AssistantUnit` for an assistant message with something to send; its tool calls get the
  ids they carry on the wire (`Ids`: valid for the provider and unique in the request);
* a `ResultUnit` for each call of that message: the tool-result message that answers it, or,
  when the history has none before the next assistant message, a missing result;
* a `UserUnit` for everything else: user messages, injected context, steering, system
  messages, and tool results that answer no call of their group (*orphans*, sent as text).

A message that sits between an assistant message's calls and their results is sent after the
results (W2.3). `Planner` is that walk; `IncrementalEncoder` keeps a planner's state at the
last *clean* point of the previous request, so that each request encodes only what it adds.
"""

from __future__ import annotations

import json
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any, Final, Protocol

from machine.log import shares_items
from machine.providers.history import result_block
from machine.vocabulary import Message

__all__ = ["AssistantUnit", "Codec", "IncrementalEncoder", "OpeningUnit", "Planner",
           "ResultUnit", "Unit", "UserUnit", "dumps", "plan_units"]


@dataclass(frozen=True, slots=True)
class AssistantUnit:
    """An assistant message; ``call_ids`` are the wire ids of its tool calls, in content order;
    ``structured``: its calls are sent as the provider's tool calls, not as text (W2.7)."""

    message: Message
    call_ids: tuple[str, ...]
    structured: bool = True


@dataclass(frozen=True, slots=True)
class ResultUnit:
    """The result of the call with wire id ``call_id``: ``message`` answers it, or is None when
    the history holds no result for it (W2.2); ``structured`` as its call's."""

    call_id: str
    message: Message | None
    structured: bool = True


@dataclass(frozen=True, slots=True)
class UserUnit:
    """A user, context, steering or system message; ``orphan``: a tool result that answers no
    call of its group, sent as text (W2.4)."""

    message: Message
    orphan: bool = False


@dataclass(frozen=True, slots=True)
class OpeningUnit:
    """What a request opens with when the provider wants a user message first and the history
    gives none (W2.8)."""

    message: None = None


Unit = AssistantUnit | ResultUnit | UserUnit | OpeningUnit


class Codec(Protocol):
    """What a provider's mapping tells the plan and the encoder."""

    #: consecutive units of one role form one wire message (the Messages API)
    merges: bool

    def sendable(self, message: Message) -> bool:
        """Whether an assistant message has anything this provider can be sent."""
        ...

    def structured(self, message: Message, *, merged: bool = False) -> bool:
        """Whether an assistant message's calls are sent as tool calls (else as text, W2.7);
        *merged*: its blocks join an assistant wire message already open (``merges``)."""
        ...

    def opens(self, role: str | None) -> bool:
        """Whether a request whose first wire message has *role* (None: no message at all)
        needs an `OpeningUnit` first (W2.8)."""
        ...

    def wire_id(self, call_id: str, taken: int) -> str:
        """The id a call carries on the wire: *call_id* made valid for the provider, and
        different for each *taken* (1 for the first call of that id in the request)."""
        ...

    def role(self, unit: Unit) -> str:
        """The role of the wire message *unit* is sent in."""
        ...

    def encode(self, unit: Unit) -> list[dict[str, Any]]:
        """The parts of *unit*: whole wire messages, or (``merges``) the content blocks of
        one; no parts: nothing is sent for it."""
        ...


def dumps(value: object) -> bytes:
    """JSON as the SDKs send it: compact, UTF-8, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                      allow_nan=False).encode()


class Ids:
    """The wire ids taken in one request (W2.5), with marks to roll back to."""

    __slots__ = ("_codec", "_order", "_taken")

    def __init__(self, codec: Codec) -> None:
        self._codec = codec
        self._taken: set[str] = set()
        self._order: list[str] = []

    def take(self, call_id: str) -> str:
        taken = 1
        wire = self._codec.wire_id(call_id, taken)
        while wire in self._taken:
            taken += 1
            wire = self._codec.wire_id(call_id, taken)
        self._taken.add(wire)
        self._order.append(wire)
        return wire

    def mark(self) -> int:
        return len(self._order)

    def rollback(self, mark: int) -> None:
        while len(self._order) > mark:
            self._taken.discard(self._order.pop())


class _Group:
    """The calls of one assistant message and what waits for their results."""

    __slots__ = ("deferred", "pending", "slots", "structured")

    def __init__(self, slots: list[list[Any]], structured: bool) -> None:
        self.slots = slots            # [call id, wire id, answered]
        self.pending = len(slots)
        self.deferred: list[Unit] = []
        self.structured = structured

    def answer(self, call_id: str) -> str | None:
        for slot in self.slots:
            if not slot[2] and slot[0] == call_id:
                slot[2] = True
                self.pending -= 1
                return str(slot[1])
        return None


class Sink(Protocol):
    def add(self, role: str, unit: Unit, parts: Callable[[], list[Any]]) -> None: ...


class Planner:
    """The plan's walk (W2): feed the history's messages in order, then `finish`."""

    __slots__ = ("codec", "group", "ids", "last_role", "sink", "started")

    def __init__(self, codec: Codec, sink: Sink) -> None:
        self.codec = codec
        self.sink = sink
        self.ids = Ids(codec)
        self.group: _Group | None = None
        self.started = False
        #: the role of the last unit emitted (what a merging codec's next unit joins)
        self.last_role: str | None = None

    def mark(self) -> tuple[int, _Group | None, bool, str | None]:
        """The planner's state at a clean point (its group, if any, no longer changes)."""
        return self.ids.mark(), self.group, self.started, self.last_role

    def rollback(self, mark: tuple[int, _Group | None, bool, str | None]) -> None:
        self.ids.rollback(mark[0])
        self.group, self.started, self.last_role = mark[1], mark[2], mark[3]

    @property
    def clean(self) -> bool:
        """No call waits for its result and nothing is deferred: what has been emitted is
        final whatever follows (a checkpoint, W10)."""
        group = self.group
        return group is None or (group.pending == 0 and not group.deferred)

    def feed(self, message: Message) -> None:
        if message.role == "assistant":
            self._close()
            if not self.codec.sendable(message):
                return
            calls = message.tool_calls
            wire = tuple(self.ids.take(str(call.get("id"))) for call in calls)
            # W2.7: joined to an assistant message already open, it does not open the wire
            # message, so with thinking on its calls cannot be sent as blocks (W5.7)
            structured = self.codec.structured(
                message, merged=self.codec.merges and self.last_role == "assistant")
            self._emit(AssistantUnit(message, wire, structured))
            if calls:
                self.group = _Group([[str(call.get("id")), w, False]
                                     for call, w in zip(calls, wire, strict=True)], structured)
            return
        group = self.group
        block = result_block(message)
        if block is not None and group is not None:
            wire_id = group.answer(str(block.get("toolCallId")))
            if wire_id is not None:
                self._emit(ResultUnit(wire_id, message, group.structured))
                if group.pending == 0 and group.deferred:
                    deferred, group.deferred = group.deferred, []
                    for unit in deferred:
                        self._emit(unit)
                return
        unit = UserUnit(message, orphan=block is not None)
        if group is not None and group.pending:
            group.deferred.append(unit)         # W2.3: after the results
        else:
            self._emit(unit)

    def finish(self) -> None:
        self._close()
        if not self.started and self.codec.opens(None):
            self.started = True
            self._emit(OpeningUnit())

    def _close(self) -> None:
        """The group ends (an assistant message, or the history's end): its unanswered calls
        get missing results (W2.2), then what waited for them is sent."""
        group = self.group
        if group is None:
            return
        self.group = None
        for _, wire, answered in group.slots:
            if not answered:
                self._emit(ResultUnit(wire, None, group.structured))
        for unit in group.deferred:
            self._emit(unit)

    def _emit(self, unit: Unit) -> None:
        codec = self.codec
        role = codec.role(unit)
        if not self.started:
            parts = codec.encode(unit)
            if not parts:
                return                          # nothing sent: not the first message either
            self.started = True
            if codec.opens(role):
                opening = OpeningUnit()
                self.sink.add(codec.role(opening), opening, lambda: codec.encode(opening))
            self.sink.add(role, unit, lambda: parts)
            self.last_role = role
            return
        self.sink.add(role, unit, lambda: codec.encode(unit))
        self.last_role = role


class _ListSink:
    """Collects the wire messages as JSON values (the mappings' plain form)."""

    def __init__(self, merges: bool) -> None:
        self.merges = merges
        self.out: list[dict[str, Any]] = []
        self._role: str | None = None

    def add(self, role: str, unit: Unit, parts: Callable[[], list[Any]]) -> None:
        made = parts()
        if not made:
            return
        if not self.merges:
            self.out.extend(made)
        elif role == self._role:
            self.out[-1]["content"].extend(made)
        else:
            self._role = role
            self.out.append({"role": role, "content": list(made)})


def plan_units(codec: Codec, messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The wire messages of *messages*, planned and encoded by *codec* (the plain form)."""
    sink = _ListSink(codec.merges)
    planner = Planner(codec, sink)
    for message in messages:
        planner.feed(message)
    planner.finish()
    return sink.out


# --------------------------------------------------------------------------
# Incremental encoding (W10)
# --------------------------------------------------------------------------

_CACHE_LIMIT: Final = 512


class _ByteSink:
    """The wire messages as JSON bytes: finished ones in one buffer, the last one open (it may
    still take parts when the codec merges); marks to roll back to."""

    __slots__ = ("cache", "finished", "merges", "open_parts", "open_role")

    def __init__(self, merges: bool) -> None:
        self.merges = merges
        self.finished = bytearray()          # the finished wire messages, comma-separated
        self.open_role: str | None = None
        self.open_parts: list[bytes] = []
        #: a unit's key -> its message and encoded parts, for the units planned again at the
        #: tail of each request (W10); keyed by the message's identity, which the entry holds
        self.cache: dict[tuple[object, ...], tuple[Message | None, list[bytes]]] = {}

    def add(self, role: str, unit: Unit, parts: Callable[[], list[Any]]) -> None:
        encoded = self._encoded(unit, parts)
        if not encoded:
            return
        if not self.merges:
            for part in encoded:
                self._finish(part)
            return
        if role == self.open_role:
            self.open_parts.extend(encoded)
            return
        self._close_open()
        self.open_role = role
        self.open_parts = list(encoded)

    def _encoded(self, unit: Unit, parts: Callable[[], list[Any]]) -> list[bytes]:
        key = _unit_key(unit)
        hit = self.cache.get(key)
        if hit is not None and hit[0] is unit.message:
            return hit[1]
        encoded = [dumps(part) for part in parts()]
        if len(self.cache) >= _CACHE_LIMIT:
            del self.cache[next(iter(self.cache))]
        self.cache[key] = (unit.message, encoded)
        return encoded

    def _finish(self, message: bytes) -> None:
        if self.finished:
            self.finished += b","
        self.finished += message

    def _close_open(self) -> None:
        if self.open_role is not None:
            self._finish(self._message(self.open_role, self.open_parts))
        self.open_role = None
        self.open_parts = []

    @staticmethod
    def _message(role: str, parts: list[bytes]) -> bytes:
        return b'{"role":' + dumps(role) + b',"content":[' + b",".join(parts) + b"]}"

    def mark(self) -> tuple[int, str | None, list[bytes], int]:
        return len(self.finished), self.open_role, self.open_parts, len(self.open_parts)

    def rollback(self, mark: tuple[int, str | None, list[bytes], int]) -> None:
        del self.finished[mark[0]:]
        self.open_role, self.open_parts = mark[1], mark[2]
        del self.open_parts[mark[3]:]

    def items(self) -> list[bytes | bytearray]:
        """The JSON text of every wire message so far, comma-separated, as pieces to join
        (the finished ones not copied: join them before the sink changes)."""
        items: list[bytes | bytearray] = [self.finished] if self.finished else []
        if self.open_role is not None:
            opened = self._message(self.open_role, self.open_parts)
            items += [b",", opened] if items else [opened]
        return items


def _unit_key(unit: Unit) -> tuple[object, ...]:
    """A unit's cache key: its kind, its message's identity (never its contents: hashing a
    message would cost what encoding it does) and what else its parts depend on."""
    if isinstance(unit, AssistantUnit):
        return ("assistant", id(unit.message), unit.call_ids, unit.structured)
    if isinstance(unit, ResultUnit):
        return ("result", id(unit.message), unit.call_id, unit.structured)
    if isinstance(unit, UserUnit):
        return ("user", id(unit.message), unit.orphan)
    return ("opening",)


class _Lineage:
    """One conversation's encoding state: the previous request's history and the planner at
    its last clean point (``stable`` messages in)."""

    __slots__ = ("history", "planner", "sink", "stable")

    def __init__(self, codec: Codec) -> None:
        self.sink = _ByteSink(codec.merges)
        self.planner = Planner(codec, self.sink)
        self.history: Sequence[Message] = ()
        self.stable = 0

    def encode(self, history: Sequence[Message], prefix: bytes, suffix: bytes, first: bytes,
               empty: bytes) -> bytes:
        """``prefix`` + the JSON array of *first* (if any) and *history*'s wire messages (or
        *empty* when there is none) + ``suffix``."""
        planner, sink = self.planner, self.sink
        start = self.stable
        checkpoint = (start, planner.mark(), sink.mark())
        for index, message in enumerate(islice(history, start, None), start):
            if planner.clean:
                checkpoint = (index, planner.mark(), sink.mark())
            planner.feed(message)
        if planner.clean:
            checkpoint = (len(history), planner.mark(), sink.mark())
        planner.finish()
        items = sink.items()
        if first:
            items = [first, b",", *items] if items else [first]
        body = b"".join((prefix, b"[", *(items or (empty,)), b"]", suffix))   # the one copy
        # back to the last clean point: what follows it is planned again next time
        self.stable = checkpoint[0]
        planner.rollback(checkpoint[1])
        sink.rollback(checkpoint[2])
        self.history = history
        return body


class IncrementalEncoder:
    """The JSON bytes of a request's message list, each message encoded once (W10).

    A request's history usually extends the previous one's: its messages up to the previous
    request's last clean point are the same objects (the log's history views share one
    append-only list, L13), so their bytes are reused and only the messages after that point
    are planned and encoded. A history that does not extend it (another conversation, or a
    compaction's replace) is a lineage of its own: up to ``lineages`` are kept, the least
    recently used dropped."""

    def __init__(self, codec: Callable[[], Codec], *, lineages: int = 8) -> None:
        self._codec = codec
        self._limit = lineages
        self._lineages: dict[int, tuple[Message, _Lineage]] = {}

    def encode(self, history: Sequence[Message], prefix: bytes = b"", suffix: bytes = b"", *,
               first: bytes = b"", empty: bytes = b"") -> bytes:
        """``prefix`` + the JSON array of *first* (one wire message's JSON, if given) and
        *history*'s wire messages, or *empty* when that makes none, + ``suffix``: a request
        body, built with one copy of the history's bytes."""
        if len(history) == 0:
            return _Lineage(self._codec()).encode(history, prefix, suffix, first, empty)
        opener = history[0]                # a conversation is known by its first message
        held = self._lineages.pop(id(opener), None)
        if held is not None and held[0] is opener and _extends(history, held[1].history,
                                                                held[1].stable):
            lineage = held[1]
        else:
            lineage = _Lineage(self._codec())
        self._lineages[id(opener)] = (opener, lineage)     # the most recently used last
        while len(self._lineages) > self._limit:
            del self._lineages[next(iter(self._lineages))]
        return lineage.encode(history, prefix, suffix, first, empty)


def _extends(new: Sequence[Message], old: Sequence[Message], length: int) -> bool:
    """Whether ``new[:length]`` holds exactly the objects of ``old[:length]``."""
    if len(new) < length or len(old) < length:
        return False
    if shares_items(new, old):              # two views of one append-only list: O(1)
        return True
    return all(map(operator.is_, islice(new, length), islice(old, length)))
