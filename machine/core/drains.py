"""Drains (rule R11): staged steering and context taken from the outbox's front, one item at a
time, so that what observers of a drain's own outputs stage joins the same drain (D3)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from machine import events as ev
from machine.core.loop import DONE, Action, DrainFrame, Frame, Phase, goto, phase
from machine.core.records import frozen_message
from machine.events import LiveEvent
from machine.io import Live
from machine.jsonvalue import FrozenDict

if TYPE_CHECKING:
    from machine.core.state import CoreState


def drain(core: CoreState, frame: Frame, then: Phase, limit: int | None = None) -> Action:
    """R11: a drain of the outbox's front (at most *limit* items), after which *frame* goes on
    with phase *then*, given whether the drain took steering."""
    if not len(core.outbox) or limit == 0:  # Why: usually nothing is staged; no frame then
        return goto(core, frame, then, False)
    frame.phase = then
    return DrainFrame(phase=take_front, limit=limit, result=False)


@phase("drain", "next")
def take_front(core: CoreState, frame: DrainFrame, _sent: object) -> Action:
    """R11.1: the front item: steering is taken and announced (its append follows), context
    is appended and then taken (P16: a refused append leaves it staged)."""
    limit = frame.limit
    if not len(core.outbox) or (limit is not None and frame.taken >= limit):
        return DONE
    message, steering = core.outbox.front
    frame.taken += 1
    if steering:
        core.outbox.take()
        frame.result = True
        frame.steering = message
        frame.phase = append_steering
        return Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict._adopt({
            "message": frozen_message(message), "placement": "steering"})))
    durable = core.commit(ev.USER_MESSAGE, message, surface=True)
    core.outbox.take()
    return durable


@phase("drain", "steering")
def append_steering(core: CoreState, frame: DrainFrame, _sent: object) -> Action:
    """R11.1: the steering item just dequeued is appended to the turn."""
    message = frame.steering
    assert message is not None
    frame.steering = None
    frame.phase = take_front
    return core.commit(ev.STEERING_MESSAGE, {"turn": core.turn,
                                             "message": frozen_message(message)}, surface=True)
