"""Failures of a turn (rules R8.6, R15, P16 cases 1-2): the failed turn's open step closed, the
failure classified into the turn's reasons, and the closing appends that a refusal turns into
the turn's failure."""
from __future__ import annotations

from typing import TYPE_CHECKING

from machine import decisions
from machine import events as ev
from machine.core.loop import (
    DONE,
    Action,
    ClassifyFrame,
    ClosingFrame,
    FailTurnFrame,
    finished,
    goto,
    phase,
)
from machine.core.records import Failure, TurnFailure, frozen_json, record_json
from machine.events import LiveEvent
from machine.io import Live
from machine.jsonvalue import Frozen, FrozenDict
from machine.vocabulary import (
    END_ABORTED,
    END_DISPOSED,
    SETTLE_ABORTED,
    SettleReason,
    TurnEndReason,
    internal_error,
)

if TYPE_CHECKING:
    from machine.core.state import CoreState


def fail_turn(turn: int, failure: TurnFailure) -> FailTurnFrame:
    """R8.6: close an open step, then classify the failure (R15)."""
    return FailTurnFrame(phase=fail_turn_begin, turn=turn, failure=failure)


@phase("fail-turn", "begin")
def fail_turn_begin(core: CoreState, frame: FailTurnFrame, _sent: object) -> Action:
    if core.log.open_step is not None:
        frame.phase = fail_turn_classify
        return closing(ev.STEP_END, frame.turn)
    return goto(core, frame, fail_turn_classify)


@phase("fail-turn", "classify")
def fail_turn_classify(core: CoreState, frame: FailTurnFrame, _sent: object) -> Action:
    frame.phase = finished
    return classify(frame.failure)


def closing(type_: str, turn: int) -> ClosingFrame:
    """P16: an append that closes the turn (its step/end or turn/end). If the log refuses
    it, that refusal becomes the turn's failure (R15: agent/error, an error reason) and
    the append is tried once more, with the new reason; a second refusal stops the core."""
    return ClosingFrame(phase=closing_begin, type=type_, turn=turn)


@phase("closing", "begin")
def closing_begin(core: CoreState, frame: ClosingFrame, _sent: object) -> Action:
    try:
        durable = core.commit(frame.type, _closing_data(core, frame.type, frame.turn))
    except Exception as error:
        frame.phase = closing_again
        return classify(Failure(internal_error(error)))
    frame.phase = finished
    return durable


@phase("closing", "again")
def closing_again(core: CoreState, frame: ClosingFrame, _sent: object) -> Action:
    frame.phase = finished
    return core.commit(frame.type, _closing_data(core, frame.type, frame.turn))


def _closing_data(core: CoreState, type_: str, turn: int) -> dict[str, Frozen]:
    if type_ == ev.TURN_END:
        return {"turn": turn, "reason": record_json(core.reason)}
    return {"turn": turn, "step": core.step}


def classify(failure: TurnFailure) -> ClassifyFrame:
    """R15: set the durable reason and the settle reason; report errors."""
    return ClassifyFrame(phase=classify_begin, failure=failure)


@phase("classify", "begin")
def classify_begin(core: CoreState, frame: ClassifyFrame, _sent: object) -> Action:
    failure = frame.failure
    ctrl = core.controller
    outcome = decisions.classify(
        ctrl.reason.kind if ctrl is not None and ctrl.reason is not None else None,
        isinstance(failure, Failure) and failure.request_failure is not None)
    if not decisions.reports_error(outcome):                  # R15.1
        core.set_reasons(END_DISPOSED if outcome == "disposed" else END_ABORTED, SETTLE_ABORTED)
        return DONE
    assert isinstance(failure, Failure)
    error = failure.error
    if failure.request_failure is not None:                   # R15.2
        facts = failure.request_failure.with_message(error.rendered())
        frame.reasons = (TurnEndReason.request_failure(core.step, facts),
                         SettleReason("error", error=error, failure=facts))
    else:                                                     # R15.3
        frame.reasons = (TurnEndReason.failed(core.step, error.rendered(), failure.code),
                         SettleReason("error", error=error))
    frame.phase = classify_reasons
    return Live(LiveEvent(ev.ERROR, FrozenDict({"turn": core.turn, "step": core.step,
                                               "error": frozen_json(error)})))


@phase("classify", "reasons")
def classify_reasons(core: CoreState, frame: ClassifyFrame, _sent: object) -> Action:
    """R15.2 / R15.3: the reasons take effect once the report is out."""
    assert frame.reasons is not None
    core.set_reasons(*frame.reasons)
    return DONE
