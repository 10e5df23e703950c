"""Drains (rule R11): staged steering and context taken from the outbox's front."""
from __future__ import annotations

from collections.abc import Generator

from machine import events as ev
from machine.core.commands import Commands
from machine.core.records import (
    _Mail,
    _Wait,
    frozen_message,
)
from machine.events import LiveEvent
from machine.io import (
    Live,
    Output,
)
from machine.jsonvalue import (
    FrozenDict,
)


class Drains(Commands):
    """The outbox drains at the loop's drain points."""

    def _drain(self, limit: int | None = None) -> Generator[Output | _Wait, _Mail | None, bool]:
        took_steering = False
        taken = 0
        while len(self.outbox) and (limit is None or taken < limit):
            message, steering = self.outbox.front
            taken += 1
            if steering:
                self.outbox.take()
                took_steering = True
                yield Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict({
                    "message": frozen_message(message), "placement": "steering"})))
                yield self._commit(ev.STEERING_MESSAGE, {"turn": self._turn,
                                                         "message": frozen_message(message)},
                                   surface=True)
            else:
                # P16: taken once written, so a refused append leaves the context staged.
                durable = self._commit(ev.USER_MESSAGE, message, surface=True)
                self.outbox.take()
                yield durable
        return took_steering
