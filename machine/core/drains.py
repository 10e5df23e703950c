"""Drains (rule R11): staged steering and context taken from the outbox's front."""
from __future__ import annotations

from dataclasses import dataclass

from machine import events as ev
from machine.core.commands import Commands
from machine.core.records import (
    DONE,
    Action,
    Frame,
    Phase,
    frozen_message,
)
from machine.events import LiveEvent
from machine.io import Live
from machine.jsonvalue import FrozenDict
from machine.vocabulary import Message


@dataclass(slots=True, kw_only=True)
class DrainFrame(Frame):
    """A drain in progress (R11): how many items it may still take, whether it took
    steering (its result), and the steering message whose append comes next."""

    limit: int | None = None
    taken: int = 0
    steering: Message | None = None


class Drains(Commands):
    """The outbox drains at the loop's drain points."""

    def _drain(self, frame: Frame, then: Phase, limit: int | None = None) -> Action:
        """R11: a drain of the outbox's front (at most *limit* items), after which *frame*
        goes on with *then*, given whether the drain took steering."""
        frame.phase = then
        if not len(self.outbox) or limit == 0:  # Why: usually nothing is staged; no frame then
            return then(self, frame, False)
        return DrainFrame(phase=Drains._drain_next, limit=limit, result=False)

    def _drain_next(self, frame: DrainFrame, _sent: object) -> Action:
        limit = frame.limit
        if not len(self.outbox) or (limit is not None and frame.taken >= limit):
            return DONE
        message, steering = self.outbox.front
        frame.taken += 1
        if steering:
            self.outbox.take()
            frame.result = True
            frame.steering = message
            frame.phase = Drains._drain_steering
            return Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict._adopt({
                "message": frozen_message(message), "placement": "steering"})))
        # P16: taken once written, so a refused append leaves the context staged.
        durable = self._commit(ev.USER_MESSAGE, message, surface=True)
        self.outbox.take()
        return durable

    def _drain_steering(self, frame: DrainFrame, _sent: object) -> Action:
        message = frame.steering
        assert message is not None
        frame.steering = None
        frame.phase = Drains._drain_next
        return self._commit(ev.STEERING_MESSAGE, {"turn": self._turn,
                                                  "message": frozen_message(message)},
                            surface=True)
