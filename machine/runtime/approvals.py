"""Approvals: a tool call held until the application approves or denies it (specs/runtime.md
RT25).

A tool marked ``requires_approval`` (or given a policy, a function of the call) has each of
its calls announced by a durable ``approval/request`` event when the model's message asks for
it, and held at its ``{tool-prepare}`` until ``agent.approve(call_id)`` or
``agent.deny(call_id, reason)``; the decision is a durable ``approval/decision`` event. Both
are extension events of the session log (L10), flushed as soon as they are written, so a
pending approval survives a crash: the next agent that resumes the session offers it again.

This module keeps the book of approvals; the agent writes the events and the environment
holds the calls.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias

from machine.errors import TurnstileError
from machine.events import Event
from machine.jsonvalue import thaw
from machine.runtime.hooks import JsonValue
from machine.runtime.signal import Signal

__all__ = ["APPROVAL_DECISION", "APPROVAL_REQUEST", "Approval", "ApprovalError", "Decision",
           "denied_result"]

APPROVAL_REQUEST: Final = "approval/request"
APPROVAL_DECISION: Final = "approval/decision"
#: ``approved`` and ``denied`` are the application's; ``cancelled`` is written when the call
#: can no longer run (its turn was cancelled, disposed or failed, or a limit refused it).
Decision: TypeAlias = Literal["approved", "denied", "cancelled"]


class ApprovalError(TurnstileError):
    """``approve`` or ``deny`` of a call that has no pending approval (never asked, already
    decided, or unknown): nothing is written."""

    code = "NO_PENDING_APPROVAL"


@dataclass(frozen=True, slots=True)
class Approval:
    """A pending approval (RT25): the call (``call_id``, ``name``, ``arguments`` as planned,
    R10.1), where it was asked (``turn``, ``step``, the ``seq`` of its ``approval/request``),
    and ``resumed``: offered again after a crash, its turn closed by the repair (approving it
    runs the tool and hands its result to the model in a new turn)."""

    call_id: str
    name: str
    arguments: JsonValue
    turn: int
    step: int
    seq: int
    resumed: bool = False


def denied_result(reason: str | None) -> dict[str, JsonValue]:
    """The error result of a denied call: the model reads why."""
    message = "the tool call was denied" + (f": {reason}" if reason else "")
    return {"content": [{"type": "text", "text": f"Error: {message}"}], "isError": True,
            "error": {"name": "ToolCallDenied", "message": message, "code": "TOOL_CALL_DENIED"}}


class _Held:
    """One approval asked: *decided* is the decision once it is made; a live call's prepare
    waits on *ready* (None for a resumed approval, whose turn is over)."""

    __slots__ = ("approval", "decided", "ready")

    def __init__(self, approval: Approval, ready: asyncio.Future[None] | None) -> None:
        self.approval = approval
        self.decided: tuple[Decision, str | None] | None = None
        self.ready = ready


class Approvals:
    """The agent's book of approvals, by call id: asked and not decided (pending), or
    decided and not yet taken by the call's prepare."""

    def __init__(self, cancel: Callable[[str, str], object]) -> None:
        self._held: dict[str, _Held] = {}
        #: The sink flush that makes the latest approval event durable, if it is running.
        self.flushing: asyncio.Future[None] | None = None
        #: Writes a pending approval ``cancelled`` with a reason (the agent's).
        self.cancel = cancel

    def pending(self) -> tuple[Approval, ...]:
        return tuple(held.approval for held in self._held.values() if held.decided is None)

    def get(self, call_id: str) -> Approval | None:
        """The pending approval of *call_id* (None when there is none, or it is decided)."""
        held = self._held.get(call_id)
        return held.approval if held is not None and held.decided is None else None

    def holds(self, call_id: str) -> bool:
        """Whether the call's prepare must take a decision first (asked live)."""
        held = self._held.get(call_id)
        return held is not None and held.ready is not None

    def asked(self, approval: Approval, loop: asyncio.AbstractEventLoop | None) -> None:
        """A request was written: live (the call's prepare will wait) or resumed."""
        ready = None if approval.resumed or loop is None else loop.create_future()
        self._held[approval.call_id] = _Held(approval, ready)

    def decide(self, call_id: str, decision: Decision, reason: str | None, *,
               final: bool = False) -> Approval:
        """Record the decision (the agent has written it) and release the held call. A
        resumed approval (no call waits), or a *final* one (the call will not be prepared),
        is done with."""
        held = self._held[call_id]
        held.decided = (decision, reason)
        if held.ready is None or final:
            del self._held[call_id]
        elif not held.ready.done():
            held.ready.set_result(None)
        return held.approval

    async def take(self, call_id: str, signal: Signal) -> tuple[Decision, str | None] | None:
        """At the call's prepare: the decision, once made; None when the signal is aborted
        first (the approval stays pending for the agent to cancel)."""
        held = self._held.get(call_id)
        if held is None or held.ready is None:
            return None
        if held.decided is None and not signal.aborted:
            aborted = asyncio.ensure_future(signal.wait())
            try:
                await asyncio.wait((held.ready, aborted), return_when=asyncio.FIRST_COMPLETED)
            finally:
                aborted.cancel()
        decided = held.decided
        if decided is not None:
            del self._held[call_id]
        return decided

    def forget(self, call_id: str) -> bool:
        """The call will not be prepared any more (it has its result): True when it was
        still pending (the agent then writes it cancelled)."""
        held = self._held.get(call_id)
        if held is None or held.ready is None:
            return False
        if held.decided is not None:
            del self._held[call_id]
            return False
        return True

    def of_turn(self, turn: int) -> list[str]:
        """The live calls of *turn* the book still holds."""
        return [call_id for call_id, held in self._held.items()
                if held.approval.turn == turn and held.ready is not None]


def request_data(approval: Approval, *, reoffer: bool = False) -> dict[str, JsonValue]:
    data: dict[str, JsonValue] = {"turn": approval.turn, "step": approval.step,
                                  "callId": approval.call_id, "name": approval.name,
                                  "arguments": approval.arguments}
    if reoffer:
        data["reoffer"] = True
    return data


def decision_data(approval: Approval, decision: Decision, reason: str | None
                  ) -> dict[str, JsonValue]:
    data: dict[str, JsonValue] = {"turn": approval.turn, "callId": approval.call_id,
                                  "decision": decision}
    if reason is not None:
        data["reason"] = reason
    return data


def pending_in(events: Iterable[Event]) -> list[Approval]:
    """The approvals a stored session left pending: each ``approval/request`` with no later
    ``approval/decision`` for its call (a later request for the same call, a re-offer,
    supersedes the earlier one). They are offered again as *resumed*."""
    found: dict[str, Approval] = {}
    for event in events:
        data = event.data
        call_id = data.get("callId")
        if not isinstance(call_id, str):
            continue
        if event.type == APPROVAL_REQUEST:
            turn, step, name = data.get("turn"), data.get("step"), data.get("name")
            if type(turn) is int and type(step) is int and isinstance(name, str):
                found[call_id] = Approval(call_id, name, thaw(data.get("arguments")), turn,
                                          step, event.seq, resumed=True)
        elif event.type == APPROVAL_DECISION:
            found.pop(call_id, None)
    return list(found.values())
