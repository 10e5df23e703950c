"""Messages' fates (specs/runtime.md RT26) checked against the R20.1 ledger, for the property
tests that drive the core directly (tests/test_hostile_inputs.py, tests/test_differential.py).

`LedgeredCore` is an `AgentCore` that keeps a `FateLedger` of its own acceptances: every
send the core routes (R5, whichever command or ``feed`` brought it), every direct append,
every dispose and every completion; the test feeds the ledger every output it pulls.
`fate_problems` then says, at a quiet point, where the fates disagree with the core and with
`machine.checking.invariants.InvariantMonitor`'s counts: every accepted message has exactly one fate,
and the fates add up to what the R20.1 ledger saw.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from machine.checking.invariants import InvariantMonitor
from machine.core import AgentCore, commands, state_of
from machine.events import Event
from machine.jsonvalue import JsonLike, snapshot
from machine.runtime.fates import FateLedger, MessageFate
from machine.vocabulary import (
    FOLLOWUP,
    INJECT,
    STEER,
    ErrorInfo,
    Message,
    SendOptions,
    validate_user_message,
)


class LedgeredCore(AgentCore):
    """An `AgentCore` that records its acceptances in ``self.ledger`` (see the module
    docstring). Its outputs are the core's, unchanged."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger = FateLedger(self, keep=1_000_000)
        self.direct_ids: set[object] = set()       # ids of user/messages appended directly

    # The sends go through the core's own steps (`machine.core.commands`: check, take each
    # argument once, validate, route) so that the routed message is the one recorded; the
    # tests compare this core's outputs with a plain `AgentCore`'s at every step.
    def send(self, message: JsonLike, options: JsonLike) -> None:
        state = state_of(self)
        commands.check_live(state)
        opts = SendOptions.from_json(snapshot(options))
        self._route(validate_user_message(snapshot(message)), opts)

    def followup(self, message: JsonLike) -> None:
        self._send_preset(message, FOLLOWUP)

    def steer(self, message: JsonLike) -> None:
        self._send_preset(message, STEER)

    def inject(self, message: JsonLike) -> None:
        self._send_preset(message, INJECT)

    def _send_preset(self, message: JsonLike, preset: SendOptions) -> None:
        commands.check_live(state_of(self))
        self._route(validate_user_message(snapshot(message)), preset)

    def _route(self, message: Message, options: SendOptions) -> None:
        window, seq = self.accepts_next_step, len(self.log)
        commands.route(state_of(self), message, options)
        self.ledger.accept(message.id, options, window, seq)

    def append(self, type: str, data: JsonLike, *, surface_op: JsonLike = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False
               ) -> Event:
        event = super().append(type, data, surface_op=surface_op,
                               source_event_seqs=source_event_seqs, ignorable=ignorable)
        self.ledger.direct_append(event.seq)
        if event.type == "user/message":
            self.direct_ids.add(event.data.get("id"))
        return event

    def dispose(self) -> None:
        if not self.disposed:
            self.ledger.dispose_requested()
        super().dispose()

    def resolve(self, effect: int, value: JsonLike = None) -> None:
        super().resolve(effect, value)
        self.ledger.completion(effect, "resolve", value)

    def fail(self, effect: int, error: ErrorInfo) -> None:
        super().fail(effect, error)
        self.ledger.completion(effect, "raise", error)


def _count(fates: list[MessageFate], test: Callable[[MessageFate], bool]) -> int:
    return sum(1 for fate in fates if test(fate))


def fate_problems(core: LedgeredCore, monitor: InvariantMonitor) -> list[str]:
    """At a quiet point (the core has no output to give): what does not add up (empty when
    all is well). *monitor* watched the same outputs."""
    ledger = core.ledger
    problems = list(ledger.problems(core))
    fates = ledger.fates()
    if len(fates) != ledger.accepted:
        problems.append(f"{ledger.accepted} messages accepted, {len(fates)} fates")
    queued = Counter(core.queued_ids())
    staged = Counter(message_id for message_id, steering in core.staged() if steering)
    contexts = Counter(message_id for message_id, steering in core.staged() if not steering)
    by_id: dict[str, list[MessageFate]] = {}
    for fate in fates:
        by_id.setdefault(fate.message_id, []).append(fate)
    for message_id, mine in sorted(by_id.items()):
        sent = [f for f in mine if f.route != "context"]
        injected = [f for f in mine if f.route == "context"]
        checks = {
            # every send but an inject is announced by one enqueue (R5.5)
            "enqueued": (len(sent), monitor.enqueued.get(message_id, 0)),
            # ... then dequeued (a claim, or a steering drain) or discarded, or still pending
            "dequeued": (_count(sent, lambda f: f.kind in ("delivered", "rejected")
                                or f.waiting in ("admitting", "in-log")),
                         monitor.dequeued.get(message_id, 0)),
            "discarded": (_count(sent, lambda f: f.kind == "discarded"),
                          monitor.discarded.get(message_id, 0)),
            "queued": (_count(sent, lambda f: f.kind == "pending" and f.waiting == "queued"),
                       queued.get(message_id, 0)),
            "staged steering": (_count(sent, lambda f: f.kind == "pending"
                                       and f.waiting == "staged"), staged.get(message_id, 0)),
        }
        if injected and not sent and message_id not in core.direct_ids:
            # an id only injected: R20.1c's command ledger
            checks["appended"] = (_count(injected, lambda f: f.kind in ("delivered", "appended")
                                         or f.waiting == "in-log"),
                                  monitor.logged.get(message_id, 0))
            checks["context discarded"] = (_count(injected, lambda f: f.kind == "discarded"),
                                           monitor.context_reports.get(message_id, 0))
            checks["staged context"] = (_count(injected, lambda f: f.waiting == "staged"),
                                        contexts.get(message_id, 0))
        for what, (fated, counted) in checks.items():
            if fated != counted:
                problems.append(f"message {message_id!r}: {fated} {what} by their fates, "
                                f"{counted} by the core and the R20.1 ledger "
                                f"({[f.describe() for f in mine]})")
        for fate in mine:
            if fate.kind == "delivered" and fate.turn is None:
                problems.append(f"message {message_id!r} delivered outside any turn")
            if fate.kind in ("delivered", "appended") and fate.seq is None:
                problems.append(f"message {message_id!r} {fate.kind} without its seq")
    return problems
