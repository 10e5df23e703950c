"""The running interval and admission (rules R4.2, R6.2, R7, R12.7): claims of the inbox's head,
prompt admission, the rejected admission's tail, continue-or-idle."""
from __future__ import annotations

from typing import TYPE_CHECKING, Final

from machine import decisions
from machine import events as ev
from machine.core.loop import (
    DONE,
    Action,
    ClaimFrame,
    IntervalFrame,
    RejectFrame,
    TickFrame,
    finished,
    goto,
    phase,
    wait_for,
)
from machine.core.records import Mail, frozen_message, warning
from machine.core.run import run
from machine.errors import ValidationError
from machine.events import LiveEvent
from machine.io import PROMPT_SUBMIT, TICK, Live
from machine.jsonvalue import FrozenDict
from machine.vocabulary import (
    DISPOSED_CAUSE,
    Allow,
    ErrorInfo,
    Message,
    TurnTrigger,
    decision_from_json,
    failure_text,
)

if TYPE_CHECKING:
    from machine.core.state import CoreState

#: R7.4 / R12.7: the status notices of a running interval (outputs are immutable values).
STATUS_RUNNING: Final = Live(LiveEvent(ev.STATUS, FrozenDict({"status": "running"})))
STATUS_IDLE: Final = Live(LiveEvent(ev.STATUS, FrozenDict({"status": "idle"})))


# -- the running interval (R4.2, R12.7) ---------------------------------------------------


@phase("interval", "claim")
def interval_claim(core: CoreState, frame: IntervalFrame, _sent: object) -> Action:
    """R7.1: claim the head of the inbox (a waking item is queued)."""
    frame.phase = interval_claimed
    return ClaimFrame(phase=claim_begin)


@phase("interval", "claimed")
def interval_claimed(core: CoreState, frame: IntervalFrame, _sent: object) -> Action:
    """R12.7 continue-or-idle (R17.4: while disposing, nothing new is claimed)."""
    if core.disposing and core.inbox.has_waking:
        core.cancel(DISPOSED_CAUSE, False)   # its outputs precede the next one
    if core.inbox.has_waking:
        return goto(core, frame, interval_claim)
    core.go_idle()
    frame.phase = finished
    return STATUS_IDLE


# -- one claim and its admission (R7) --------------------------------------------------


@phase("claim", "begin")
def claim_begin(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
    """R7.2-R7.4: claim the head of the inbox; a claim while not busy starts the interval."""
    frame.inherited = len(core.outbox)
    message, frame.ctrl, was_busy = core.claim()
    frame.message = message
    frame.dequeue = Live(LiveEvent(ev.INBOX_DEQUEUE, FrozenDict._adopt({
        "message": frozen_message(message), "placement": "queued"})))
    if not was_busy:                                          # R7.4
        frame.phase = claim_submit
        return STATUS_RUNNING
    return goto(core, frame, claim_submit)


@phase("claim", "submit")
def claim_submit(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
    ctrl, message = frame.ctrl, frame.message
    assert ctrl is not None and message is not None
    if ctrl.aborted:                                          # R7.5
        # As in the original, the rejected path runs up to its tick before the dequeue
        # notice: the claim emits it once the admission has yielded (P15).
        frame.phase = claim_early_dequeue
        return reject()
    request = core.new_effect(PROMPT_SUBMIT, FrozenDict._adopt({
        "message": frozen_message(message), "signal": ctrl.signal}))
    frame.effect = request.id
    frame.phase = claim_dequeue
    return request


@phase("claim", "early_dequeue")
def claim_early_dequeue(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
    assert frame.dequeue is not None
    frame.phase = claim_tick
    return frame.dequeue


@phase("claim", "dequeue")
def claim_dequeue(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
    assert frame.dequeue is not None
    frame.phase = claim_await_decision
    return frame.dequeue                                      # R7.6


@phase("claim", "await_decision")
def claim_await_decision(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
    return wait_for(frame, claim_decided, frame.effect)


@phase("claim", "decided")
def claim_decided(core: CoreState, frame: ClaimFrame, mail: Mail) -> Action:
    """R7.7, R7.11: an allowed decision admits the prompt (as rewritten) and its contexts;
    a block, a failure or an invalid decision rejects it (the last two with a warning); an
    aborted admission ignores the decision."""
    _, kind, value = mail
    ctrl, message = frame.ctrl, frame.message
    assert ctrl is not None and message is not None
    if ctrl.aborted:                                          # R7.7: ignored, no warning
        pass
    elif kind == "raise":
        assert isinstance(value, ErrorInfo)
        frame.phase = claim_admit
        return warning(f"prompt admission failed: {value.rendered()}")
    else:
        try:
            decision = decision_from_json(value)
        except ValidationError as problem:                   # R7.11
            frame.phase = claim_admit
            return warning(f"prompt admission returned an invalid decision: {problem}")
        if isinstance(decision, Allow):
            prompt = message if decision.content is None else Message(
                id=message.id, role=message.role, content=decision.content,
                source=message.source)
            frame.admitted = (prompt, *decision.additional_contexts)
    return goto(core, frame, claim_admit)


@phase("claim", "admit")
def claim_admit(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
    """R7.8-R7.10: the admission's owner goes away; admitted, its run starts; else the
    rejected path, then its tick."""
    message = frame.message
    assert message is not None
    if frame.admitted is not None:                            # R7.9
        core.admit()
        frame.phase = finished
        return run(TurnTrigger._of_message(message), list(frame.admitted), frame.inherited)
    frame.phase = claim_tick
    return reject()                                           # R7.10


@phase("claim", "tick")
def claim_tick(core: CoreState, frame: ClaimFrame, _sent: object) -> Action:
    frame.phase = finished
    return TickFrame(phase=tick_request)


# -- the rejected admission (R7.10) -------------------------------------------------------


def reject() -> RejectFrame:
    """R7.10 steps 1-2: the window closes; staged context is appended unless steering is."""
    return RejectFrame(phase=reject_begin)


@phase("reject", "begin")
def reject_begin(core: CoreState, frame: RejectFrame, _sent: object) -> Action:
    core.reject()
    frame.flushing = decisions.rejected_flush_appends(core.outbox.has_steering,
                                                      len(core.outbox))
    return goto(core, frame, reject_append)


@phase("reject", "append")
def reject_append(core: CoreState, frame: RejectFrame, _sent: object) -> Action:
    if frame.flushing and len(core.outbox) and not core.outbox.has_steering:
        context, _ = core.outbox.front
        try:
            durable = core.commit(ev.USER_MESSAGE, context, surface=True)
        except Exception as error:              # P16: the context stays staged
            frame.phase = finished
            return warning(f"staged context could not be written: {failure_text(error)}")
        core.outbox.take()
        return durable
    return DONE


@phase("tick", "request")
def tick_request(core: CoreState, frame: TickFrame, _sent: object) -> Action:
    """R7.10 step 3: the rejected admission's tick."""
    tick = core.new_effect(TICK, FrozenDict._adopt({"purpose": "rejected-admission"}))
    frame.effect = tick.id
    frame.phase = tick_await
    return tick


@phase("tick", "await_tick")
def tick_await(core: CoreState, frame: TickFrame, _sent: object) -> Action:
    return wait_for(frame, tick_done, frame.effect)


@phase("tick", "ticked")
def tick_done(core: CoreState, frame: TickFrame, _mail: Mail) -> Action:
    return DONE
