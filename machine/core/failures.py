"""Failures of a turn (rules R8.6, R15, P16 cases 1-2): classification into the durable and
settle reasons, and the closing appends that a refusal turns into the turn's failure."""
from __future__ import annotations

from dataclasses import dataclass

from machine import decisions
from machine import events as ev
from machine.core.drains import Drains
from machine.core.records import (
    ABORTED,
    DISPOSED,
    DONE,
    SETTLED_ABORTED,
    Action,
    Frame,
    _Aborted,
    _Failure,
    frozen_json,
    record_json,
)
from machine.events import LiveEvent
from machine.io import Live
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
)
from machine.vocabulary import (
    SettleReason,
    TurnEndReason,
    internal_error,
)


@dataclass(slots=True, kw_only=True)
class FailTurnFrame(Frame):
    """R8.6: a failed turn being closed: its open step's end, then the classification."""

    turn: int
    failure: _Aborted | _Failure


@dataclass(slots=True, kw_only=True)
class ClosingFrame(Frame):
    """P16: an append that closes the turn (``type`` is step/end or turn/end)."""

    type: str
    turn: int


@dataclass(slots=True, kw_only=True)
class ClassifyFrame(Frame):
    """R15: a failure being classified; ``reasons`` are set once its report is out."""

    failure: _Aborted | _Failure
    reasons: tuple[TurnEndReason, SettleReason] | None = None


class Failures(Drains):
    """How a failed turn is classified and closed."""

    def _fail_turn(self, turn: int, failure: _Aborted | _Failure) -> FailTurnFrame:
        """R8.6: close an open step, then classify the failure (R15)."""
        return FailTurnFrame(phase=Failures._fail_turn_start, turn=turn, failure=failure)

    def _fail_turn_start(self, frame: FailTurnFrame, _sent: object) -> Action:
        frame.phase = Failures._fail_turn_classify
        if self.log.open_step is not None:
            return self._closing(ev.STEP_END, frame.turn)
        return Failures._fail_turn_classify(self, frame, None)

    def _fail_turn_classify(self, frame: FailTurnFrame, _sent: object) -> Action:
        frame.phase = Failures._finished
        return self._classify(frame.failure)

    def _finished(self, _frame: Frame, _sent: object) -> Action:
        """The phase of an activity whose last output is out: it ends."""
        return DONE

    def _closing(self, type_: str, turn: int) -> ClosingFrame:
        """P16: an append that closes the turn (its step/end or turn/end). If the log refuses
        it, that refusal becomes the turn's failure (R15: agent/error, an error reason) and
        the append is tried once more, with the new reason; a second refusal stops the core."""
        return ClosingFrame(phase=Failures._closing_start, type=type_, turn=turn)

    def _closing_start(self, frame: ClosingFrame, _sent: object) -> Action:
        try:
            durable = self._commit(frame.type, self._closing_data(frame.type, frame.turn))
        except Exception as error:
            frame.phase = Failures._closing_again
            return self._classify(_Failure(internal_error(error)))
        frame.phase = Failures._finished
        return durable

    def _closing_again(self, frame: ClosingFrame, _sent: object) -> Action:
        frame.phase = Failures._finished
        return self._commit(frame.type, self._closing_data(frame.type, frame.turn))

    def _closing_data(self, type_: str, turn: int) -> dict[str, Frozen]:
        if type_ == ev.TURN_END:
            return {"turn": turn, "reason": record_json(self._reason)}
        return {"turn": turn, "step": self._step}

    def _classify(self, failure: _Aborted | _Failure) -> ClassifyFrame:
        """R15: set the durable reason and settle reason; report errors."""
        return ClassifyFrame(phase=Failures._classify_start, failure=failure)

    def _classify_start(self, frame: ClassifyFrame, _sent: object) -> Action:
        failure = frame.failure
        ctrl = self._ctrl
        outcome = decisions.classify(
            ctrl.reason.kind if ctrl is not None and ctrl.reason is not None else None,
            isinstance(failure, _Failure) and failure.request_failure is not None)
        if not decisions.reports_error(outcome):                  # R15.1
            self._reason = DISPOSED if outcome == "disposed" else ABORTED
            self._settle = SETTLED_ABORTED
            return DONE
        assert isinstance(failure, _Failure)
        error = failure.error
        if failure.request_failure is not None:                   # R15.2
            facts = failure.request_failure.with_message(error.rendered())
            frame.reasons = (TurnEndReason.request_failure(self._step, facts),
                             SettleReason("error", error=error, failure=facts))
        else:                                                     # R15.3
            frame.reasons = (TurnEndReason.failed(self._step, error.rendered(), failure.code),
                             SettleReason("error", error=error))
        frame.phase = Failures._classify_reasons
        return Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": self._step,
                                                   "error": frozen_json(error)})))

    def _classify_reasons(self, frame: ClassifyFrame, _sent: object) -> Action:
        """R15.2 / R15.3: the reasons take effect once the report is out."""
        assert frame.reasons is not None
        self._reason, self._settle = frame.reasons
        return DONE
