"""Failures of a turn (rules R8.6, R15, P16 cases 1-2): classification into the durable and
settle reasons, and the closing appends that a refusal turns into the turn's failure."""
from __future__ import annotations

from collections.abc import Generator

from machine import decisions
from machine import events as ev
from machine.core.drains import Drains
from machine.core.records import (
    ABORTED,
    DISPOSED,
    _Aborted,
    _Failure,
    _Mail,
    _Proc,
    _Wait,
    frozen_json,
)
from machine.events import LiveEvent
from machine.io import (
    Live,
    Output,
)
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
)
from machine.vocabulary import (
    internal_error,
)


class Failures(Drains):
    """How a failed turn is classified and closed."""

    def _fail_turn(self, turn: int, failure: _Aborted | _Failure) -> _Proc:
        """R8.6: close an open step, then classify the failure (R15)."""
        if self.log.open_step is not None:
            yield from self._closing(ev.STEP_END, turn)
        yield from self._classify(failure)

    def _closing(self, type_: str, turn: int) -> _Proc:
        """P16: an append that closes the turn (its step/end or turn/end). If the log refuses
        it, that refusal becomes the turn's failure (R15: agent/error, an error reason) and
        the append is tried once more, with the new reason; a second refusal stops the core."""
        try:
            durable = self._commit(type_, self._closing_data(type_, turn))
        except Exception as error:
            yield from self._classify(_Failure(internal_error(error)))
            durable = self._commit(type_, self._closing_data(type_, turn))
        yield durable

    def _closing_data(self, type_: str, turn: int) -> dict[str, Frozen]:
        if type_ == ev.TURN_END:
            return {"turn": turn, "reason": self._reason}
        return {"turn": turn, "step": self._step}

    def _classify(self, failure: _Aborted | _Failure) -> Generator[Output | _Wait, _Mail | None, None]:
        """R15: set the durable reason and settle reason; report errors."""
        ctrl = self._ctrl
        outcome = decisions.classify(
            ctrl.reason.kind if ctrl is not None and ctrl.reason is not None else None,
            isinstance(failure, _Failure) and failure.request_failure is not None)
        if not decisions.reports_error(outcome):                  # R15.1
            self._reason = DISPOSED if outcome == "disposed" else ABORTED
            self._settle = ABORTED
            return
        assert isinstance(failure, _Failure)
        error = failure.error
        yield Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": self._step,
                                                   "error": frozen_json(error)})))
        if failure.request_failure is not None:                   # R15.2
            facts = frozen_json(failure.request_failure.with_message(error.rendered()))
            self._reason = FrozenDict({"kind": "error", "step": self._step, "failure": facts})
            self._settle = FrozenDict({"kind": "error", "error": frozen_json(error),
                                       "failure": facts})
        else:                                                     # R15.3
            reason: dict[str, Frozen] = {"kind": "error", "step": self._step,
                                         "message": error.rendered()}
            if failure.code is not None:
                reason["code"] = failure.code
            self._reason = FrozenDict(reason)
            self._settle = FrozenDict({"kind": "error", "error": frozen_json(error)})
