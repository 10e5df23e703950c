"""The running interval and admission (rules R6.2, R7, R12.7): the wake, the claim of the
inbox's head, prompt admission, the rejected-admission tail, continue-or-idle."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from machine import decisions
from machine import events as ev
from machine.core.failures import Failures
from machine.core.records import (
    DONE,
    Action,
    Frame,
    _Controller,
    _Mail,
    _Wait,
    frozen_message,
)
from machine.core.run import Run
from machine.errors import (
    ValidationError,
)
from machine.events import LiveEvent
from machine.io import (
    PROMPT_SUBMIT,
    TICK,
    Live,
)
from machine.jsonvalue import (
    FrozenDict,
)
from machine.vocabulary import (
    DISPOSED_CAUSE,
    Allow,
    ErrorInfo,
    Message,
    TurnTrigger,
    decision_from_json,
    failure_text,
)

#: R7.4 / R12.7: the status notices of a running interval (outputs are immutable values).
STATUS_RUNNING: Final = Live(LiveEvent(ev.STATUS, FrozenDict({"status": "running"})))
STATUS_IDLE: Final = Live(LiveEvent(ev.STATUS, FrozenDict({"status": "idle"})))


@dataclass(slots=True, kw_only=True)
class IntervalFrame(Frame):
    """A running interval (R4.2, R12.7): claims of the inbox's head until none wakes."""


@dataclass(slots=True, kw_only=True)
class ClaimFrame(Frame):
    """R7: a claimed prompt's admission: the message, the staged context it inherits, its
    controller, its inbox/dequeue notice, the prompt-submit effect and what it admitted."""

    message: Message | None = None
    inherited: int = 0
    ctrl: _Controller | None = None
    dequeue: Live | None = None
    effect: int = -1
    admitted: tuple[Message, ...] | None = None


@dataclass(slots=True, kw_only=True)
class RejectFrame(Frame):
    """R7.10 steps 1-2: a rejected admission's staged context being appended."""

    flushing: bool = False


@dataclass(slots=True, kw_only=True)
class TickFrame(Frame):
    """R7.10 step 3: the rejected-admission tick, waited for."""

    effect: int = -1


class Admission(Run):
    """The interval: wake, claims and admissions, continue-or-idle."""

    def _advance_idle(self) -> bool:
        wake = self._wake_effect
        if wake is not None:
            mail = self._take_mail(frozenset((wake,)))
            if mail is None:
                return False
            self._wake_effect = None
            self._retro = None          # the loop moves on (P7)
            self._wake()
            return True
        if self._disposing and not self._disposed and self.is_quiescent:
            self._retro = None
            self._teardown()
            return True
        return False

    def _wake(self) -> None:
        """R6.2 (and R17.4: while disposing, a wake never claims)."""
        if self._disposing and self.inbox.has_waking:
            self._cancel(DISPOSED_CAUSE, False)
        if self.inbox.has_waking:
            self._frames.append(IntervalFrame(phase=Admission._interval_claim))
        else:
            self.lifecycle.fire("wake_empty")

    def _interval_claim(self, frame: IntervalFrame, _sent: object) -> Action:
        frame.phase = Admission._interval_claimed
        return ClaimFrame(phase=Admission._claim)

    def _interval_claimed(self, frame: IntervalFrame, _sent: object) -> Action:
        # R12.7 continue-or-idle (R17.4: while disposing, nothing new is claimed)
        if self._disposing and self.inbox.has_waking:
            self._cancel(DISPOSED_CAUSE, False)   # its outputs precede the next one
        if self.inbox.has_waking:
            return Admission._interval_claim(self, frame, None)
        self.lifecycle.fire("go_idle")
        frame.phase = Failures._finished
        return STATUS_IDLE

    def _claim(self, frame: ClaimFrame, _sent: object) -> Action:
        """R7: claim the head of the inbox and admit it."""
        message, _wakeup = self.inbox.claim()                    # R7.2
        frame.message = message
        frame.inherited = len(self.outbox)
        was_busy = self.lifecycle.busy
        self.lifecycle.fire("claim")
        frame.ctrl = self._new_controller("admission")            # R7.3
        self.window.fire("claim")
        frame.dequeue = Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict._adopt({
            "message": frozen_message(message), "placement": "queued"})))
        frame.phase = Admission._claim_submit
        if not was_busy:                                          # R7.4
            return STATUS_RUNNING
        return Admission._claim_submit(self, frame, None)

    def _claim_submit(self, frame: ClaimFrame, _sent: object) -> Action:
        ctrl, message = frame.ctrl, frame.message
        assert ctrl is not None and message is not None
        if ctrl.aborted:                                          # R7.5
            # As in the original, the rejected path runs up to its tick before the dequeue
            # notice: the claim emits it once the admission has yielded (P15).
            self._owner = None                                    # R7.8
            frame.phase = Admission._claim_aborted_dequeue
            return self._reject()
        request = self._new_effect(PROMPT_SUBMIT, FrozenDict._adopt({
            "message": frozen_message(message), "signal": ctrl.signal}))
        frame.effect = request.id
        frame.phase = Admission._claim_dequeue
        return request

    def _claim_aborted_dequeue(self, frame: ClaimFrame, _sent: object) -> Action:
        assert frame.dequeue is not None
        frame.phase = Admission._claim_aborted_tick
        return frame.dequeue

    def _claim_aborted_tick(self, frame: ClaimFrame, _sent: object) -> Action:
        frame.phase = Failures._finished
        return self._rejected_tick()

    def _claim_dequeue(self, frame: ClaimFrame, _sent: object) -> Action:
        assert frame.dequeue is not None
        frame.phase = Admission._claim_wait
        return frame.dequeue                                      # R7.6

    def _claim_wait(self, frame: ClaimFrame, _sent: object) -> Action:
        frame.phase = Admission._claim_decided
        return _Wait(frozenset((frame.effect,)))

    def _claim_decided(self, frame: ClaimFrame, mail: _Mail) -> Action:
        _, kind, value = mail
        ctrl, message = frame.ctrl, frame.message
        assert ctrl is not None and message is not None
        frame.phase = Admission._claim_admit
        if ctrl.aborted:                                          # R7.7: ignored, no warning
            pass
        elif kind == "raise":
            assert isinstance(value, ErrorInfo)
            return self._warn(f"prompt admission failed: {value.rendered()}")
        else:
            try:
                decision = decision_from_json(value)
            except ValidationError as problem:                   # R7.11
                return self._warn(f"prompt admission returned an invalid decision: {problem}")
            if isinstance(decision, Allow):
                prompt = message if decision.content is None else Message(
                    id=message.id, role=message.role, content=decision.content,
                    source=message.source)
                frame.admitted = (prompt, *decision.additional_contexts)
        return Admission._claim_admit(self, frame, None)

    def _claim_admit(self, frame: ClaimFrame, _sent: object) -> Action:
        self._owner = None                                        # R7.8
        message = frame.message
        assert message is not None
        frame.phase = Failures._finished
        if frame.admitted is not None:                            # R7.9
            self.lifecycle.fire("admit")
            self._prior_failures = []
            return self._run(TurnTrigger._of_message(message),
                             list(frame.admitted), frame.inherited)
        frame.phase = Admission._claim_aborted_tick
        return self._reject()                                     # R7.10

    def _reject(self) -> RejectFrame:
        """R7.10 steps 1-2: the window closes; staged context is appended unless steering is."""
        return RejectFrame(phase=Admission._reject_begin)

    def _reject_begin(self, frame: RejectFrame, _sent: object) -> Action:
        self.window.fire("reject")
        self.lifecycle.fire("reject")
        self._ctrl = None
        frame.flushing = decisions.rejected_flush_appends(self.outbox.has_steering,
                                                          len(self.outbox))
        frame.phase = Admission._reject_next
        return Admission._reject_next(self, frame, None)

    def _reject_next(self, frame: RejectFrame, _sent: object) -> Action:
        if frame.flushing and len(self.outbox) and not self.outbox.has_steering:
            context, _ = self.outbox.front
            try:
                durable = self._commit(ev.USER_MESSAGE, context, surface=True)
            except Exception as error:              # P16: the context stays staged
                frame.phase = Failures._finished
                return self._warn(f"staged context could not be written: "
                                  f"{failure_text(error)}")
            self.outbox.take()
            return durable
        return DONE

    def _rejected_tick(self) -> TickFrame:
        """R7.10 step 3: the rejected-admission tick."""
        return TickFrame(phase=Admission._tick_request)

    def _tick_request(self, frame: TickFrame, _sent: object) -> Action:
        tick = self._new_effect(TICK, FrozenDict._adopt({"purpose": "rejected-admission"}))
        frame.effect = tick.id
        frame.phase = Admission._tick_wait
        return tick

    def _tick_wait(self, frame: TickFrame, _sent: object) -> Action:
        frame.phase = Admission._tick_done
        return _Wait(frozenset((frame.effect,)))

    def _tick_done(self, _frame: TickFrame, _mail: _Mail) -> Action:
        return DONE
