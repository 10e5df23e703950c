"""Test support for the stores: a log builder and the recorded sample session.

Not imported by the library. `LogBuilder` appends well-formed events to a
`SessionLog` with a counting clock; `sample_session` is the recorded
multi-turn log the crash tests damage: context before the first turn, tool
calls, steering, between-turn injections, and (by default) an open tail with
one started and one unstarted pending call.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from machine.events import Event
from machine.jsonvalue import JsonLike
from machine.log import SessionLog
from machine.store.types import SessionStore

__all__ = ["EPOCH_MS", "LogBuilder", "sample_session", "store_events"]

EPOCH_MS = 1_764_489_600_000
_MODEL: dict[str, JsonLike] = {"kind": "model", "provider": "p", "model": "m"}


class LogBuilder:
    """Appends well-formed events to a log (time = EPOCH_MS + seq by default)."""

    def __init__(self, events: Sequence[Event] = (), *, start: int = EPOCH_MS) -> None:
        counter = itertools.count(start + len(events))
        self.log = SessionLog(events, clock=lambda: next(counter))

    @property
    def events(self) -> list[Event]:
        return list(self.log.events)

    def user(self, text: str, *, id: str | None = None, plugin: str | None = None) -> Event:
        source: dict[str, JsonLike] = ({"kind": "user"} if plugin is None
                                       else {"kind": "plugin", "plugin": plugin})
        message: dict[str, JsonLike] = {
            "id": id or f"u{len(self.log)}", "role": "user",
            "content": [{"type": "text", "text": text}], "source": source}
        return self.log.append("user/message", message, surface_op="append")

    def turn(self, turn: int) -> Event:
        return self.log.append("turn/start", {"turn": turn, "trigger": {
            "kind": "message", "source": {"kind": "user"}}})

    def end(self, turn: int, kind: str = "completed") -> Event:
        return self.log.append("turn/end", {"turn": turn, "reason": {"kind": kind}})

    def step(self, turn: int, step: int) -> Event:
        return self.log.append("step/start", {"turn": turn, "step": step})

    def step_end(self, turn: int, step: int) -> Event:
        return self.log.append("step/end", {"turn": turn, "step": step})

    def header(self, reason: str = "initial") -> Event:
        return self.log.append("request/header", {
            "header": {"config": {"provider": "p", "model": "m"}}, "reason": reason})

    def chunk(self, turn: int, step: int, text: str = "x") -> Event:
        return self.log.append("assistant/chunk", {"turn": turn, "step": step,
                                                   "chunk": {"type": "text", "text": text}})

    def assistant(self, turn: int, step: int, text: str | None = None,
                  calls: Sequence[str] = ()) -> Event:
        content: list[JsonLike] = [] if text is None else [{"type": "text", "text": text}]
        content += [{"type": "tool-call", "id": call, "name": "t", "arguments": "{}"}
                    for call in calls]
        message: dict[str, JsonLike] = {"id": f"a{len(self.log)}", "role": "assistant",
                                        "content": content, "source": _MODEL}
        return self.log.append("assistant/message",
                               {"turn": turn, "step": step, "message": message},
                               surface_op="append", source_event_seqs=[])

    def call(self, turn: int, step: int, call_id: str) -> Event:
        return self.log.append("tool/call", {"turn": turn, "step": step, "callId": call_id,
                                             "name": "t", "arguments": "{}"})

    def result(self, turn: int, step: int, call_id: str, call_seq: int | None = None) -> Event:
        message: dict[str, JsonLike] = {
            "id": f"r{len(self.log)}", "role": "user",
            "content": [{"type": "tool-result", "toolCallId": call_id,
                         "content": [{"type": "text", "text": "ok"}]}],
            "source": {"kind": "tool", "callId": call_id}}
        return self.log.append("tool/result", {"turn": turn, "step": step, "message": message},
                               surface_op="append",
                               source_event_seqs=None if call_seq is None else [call_seq])

    def steering(self, turn: int, text: str) -> Event:
        message: dict[str, JsonLike] = {
            "id": f"s{len(self.log)}", "role": "user",
            "content": [{"type": "text", "text": text}], "source": {"kind": "user"}}
        return self.log.append("steering/message", {"turn": turn, "message": message},
                               surface_op="append")


def sample_session(*, open_tail: bool = True) -> list[Event]:
    """The recorded multi-turn session of the crash tests (22 short events, about 4 KB).

    Context before turn 1; turn 1 calls tool ``c1`` and gets its result; an
    injection between turns; turn 2 answers; two injections between turns;
    then (with *open_tail*) turn 3 is interrupted inside its step with call
    ``c2`` started (a ``tool/call`` is recorded) and ``c3`` not started.
    """
    b = LogBuilder()
    b.user("ctx", plugin="p")
    b.turn(1)
    b.user("go")
    b.step(1, 1)
    b.assistant(1, 1, calls=["c1"])
    call = b.call(1, 1, "c1")
    b.result(1, 1, "c1", call.seq)
    b.step_end(1, 1)
    b.end(1)
    b.user("inj", plugin="p")
    b.turn(2)
    b.user("more")
    b.step(2, 1)
    b.assistant(2, 1, "ok")
    b.step_end(2, 1)
    b.end(2)
    b.user("i2", plugin="p")
    b.user("i3", plugin="p")
    if open_tail:
        b.turn(3)
        b.step(3, 1)
        b.assistant(3, 1, calls=["c2", "c3"])
        b.call(3, 1, "c2")
    return b.events


def store_events(store: SessionStore, session_id: str, events: Sequence[Event], *,
                 create: bool = True, flush: bool = True) -> None:
    """Create a session (unless *create* is false) and append *events* to it."""
    if create:
        store.create(session_id)
    for event in events:
        store.append(session_id, event)
    if flush:
        store.flush(session_id)
