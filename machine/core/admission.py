"""The running interval and admission (rules R6.2, R7, R12.7): the wake, the claim of the
inbox's head, prompt admission, the rejected-admission tail, continue-or-idle."""
from __future__ import annotations

from machine import decisions
from machine import events as ev
from machine.core.records import (
    _Proc,
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
    decision_from_json,
    failure_text,
)


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
            self._proc = self._interval()
        else:
            self.lifecycle.fire("wake_empty")

    def _interval(self) -> _Proc:
        while True:
            yield from self._claim()
            # R12.7 continue-or-idle (R17.4: while disposing, nothing new is claimed)
            if self._disposing and self.inbox.has_waking:
                self._cancel(DISPOSED_CAUSE, False)   # its outputs precede the next yield
            if self.inbox.has_waking:
                continue
            self.lifecycle.fire("go_idle")
            yield Live(LiveEvent(ev.STATUS, FrozenDict({"status": "idle"})))
            return

    def _claim(self) -> _Proc:
        """R7: claim the head of the inbox and admit it."""
        message, _wakeup = self.inbox.claim()                    # R7.2
        inherited = len(self.outbox)
        was_busy = self.lifecycle.busy
        self.lifecycle.fire("claim")
        ctrl = self._new_controller("admission")                  # R7.3
        self.window.fire("claim")
        if not was_busy:                                          # R7.4
            yield Live(LiveEvent(ev.STATUS, FrozenDict({"status": "running"})))
        message_json = frozen_message(message)
        dequeue = Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict({"message": message_json,
                                                               "placement": "queued"})))
        admitted: list[Message] | None = None
        if ctrl.aborted:                                          # R7.5
            # As in the original, the rejected path runs up to its tick before the dequeue
            # notice: the claim emits it once the admission has yielded (P15).
            self._owner = None                                    # R7.8
            yield from self._reject()
            yield dequeue
            yield from self._rejected_tick()
            return
        else:
            request = self._new_effect(PROMPT_SUBMIT, FrozenDict({
                "message": message_json, "signal": ctrl.signal}))
            yield request
            yield dequeue                                         # R7.6
            _, kind, value = yield from self._await(request.id)
            if ctrl.aborted:                                      # R7.7: ignored, no warning
                admitted = None
            elif kind == "raise":
                assert isinstance(value, ErrorInfo)
                yield self._warn(f"prompt admission failed: {value.rendered()}")
            else:
                try:
                    decision = decision_from_json(value)
                except ValidationError as problem:               # R7.11
                    yield self._warn(f"prompt admission returned an invalid decision: {problem}")
                else:
                    if isinstance(decision, Allow):
                        prompt = message if decision.content is None else Message(
                            id=message.id, role=message.role, content=decision.content,
                            source=message.source)
                        admitted = [prompt, *decision.additional_contexts]
        self._owner = None                                        # R7.8
        if admitted is not None:                                  # R7.9
            self.lifecycle.fire("admit")
            self._prior_failures = []
            yield from self._run(FrozenDict({"kind": "message", "source": message.source}),
                                 admitted, inherited)
        else:
            yield from self._rejected()

    def _rejected(self) -> _Proc:
        """R7.10: the rejected-admission tail."""
        yield from self._reject()
        yield from self._rejected_tick()

    def _reject(self) -> _Proc:
        """R7.10 steps 1-2: the window closes; staged context is appended unless steering is."""
        self.window.fire("reject")
        self.lifecycle.fire("reject")
        self._ctrl = None
        if decisions.rejected_flush_appends(self.outbox.has_steering, len(self.outbox)):
            while len(self.outbox) and not self.outbox.has_steering:
                context, _ = self.outbox.front
                try:
                    durable = self._commit(ev.USER_MESSAGE, context, surface=True)
                except Exception as error:              # P16: the context stays staged
                    yield self._warn(f"staged context could not be written: "
                                     f"{failure_text(error)}")
                    break
                self.outbox.take()
                yield durable

    def _rejected_tick(self) -> _Proc:
        """R7.10 step 3: the rejected-admission tick."""
        tick = self._new_effect(TICK, FrozenDict({"purpose": "rejected-admission"}))
        yield tick
        yield from self._await(tick.id)
