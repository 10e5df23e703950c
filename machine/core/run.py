"""A run (rules R8, R12, R13): turns, their steps and turn-stopping, the flush and
settlement, and a retry as a new turn."""
from __future__ import annotations

from dataclasses import dataclass

from machine import decisions
from machine import events as ev
from machine.core.failures import Failures
from machine.core.records import (
    COMPLETED,
    DONE,
    MAX_TOKENS,
    RETRY_TRIGGER,
    SETTLED_COMPLETED,
    Action,
    Frame,
    _Aborted,
    _Failure,
    _Mail,
    _StepOutcome,
    _Wait,
    frozen_json,
    record_json,
)
from machine.core.step import Step
from machine.events import LiveEvent
from machine.io import (
    FLUSH,
    TURN_STOPPING,
    Live,
)
from machine.jsonvalue import (
    FrozenDict,
)
from machine.vocabulary import (
    ErrorInfo,
    Message,
    TurnTrigger,
    internal_error,
)


@dataclass(slots=True, kw_only=True)
class RunFrame(Frame):
    """A run in progress (R8, R12, R13): what started it (its trigger, the admitted messages
    and how much staged context it inherited), how many admitted messages are appended, its
    turn, and the flush effect and its failure."""

    trigger: TurnTrigger
    admitted: tuple[Message, ...]
    inherited: int
    appended: int = 0
    turn: int = 0
    flush: int = -1
    flush_error: ErrorInfo | None = None


@dataclass(slots=True, kw_only=True)
class StepsFrame(Frame):
    """R8.4-R8.5: the step loop of one turn; ``stopping`` is the turn-stopping effect."""

    stopping: int = -1


class Run(Step):
    """The run of an admitted prompt, retries included (R8, R12, R13)."""

    def _run(self, trigger: TurnTrigger, admitted: list[Message], inherited: int) -> RunFrame:
        return RunFrame(phase=Run._run_turn, trigger=trigger, admitted=tuple(admitted),
                        inherited=inherited)

    def _run_turn(self, frame: RunFrame, _sent: object) -> Action:
        self._new_controller("run")                               # R8.1
        self.window.fire("start_run")
        turn = frame.turn = self._turn = self.log.last_turn + 1
        self._reason = COMPLETED
        self._settle = SETTLED_COMPLETED
        self._step = 0
        try:
            started = self._commit(ev.TURN_START, {"turn": turn,
                                                   "trigger": record_json(frame.trigger)})  # R8.2
        except Exception as error:                                # P16: no turn at all
            return self._not_started(frame, error)
        frame.phase = Run._run_inherited
        return started

    def _not_started(self, frame: RunFrame, error: Exception) -> Action:
        """P16 case 3: the log refused the run's turn/start (a direct append left a turn open,
        say): there is no turn; `agent/error` reports the refusal at step 0, the prompt and
        contexts stay unwritten, and continue-or-idle follows (as after a rejected admission).
        """
        self.window.fire("end_run")
        self.lifecycle.fire("close")
        self.lifecycle.fire("flush")
        self._owner = None
        self._ctrl = None
        self._pending_retry = False
        frame.phase = Failures._finished
        return Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": 0,
                                                   "error": frozen_json(internal_error(error))})))

    # The turn's body, R8.3-R8.5: a failure raised in it fails the turn (R8.6).

    def _run_inherited(self, frame: RunFrame, _sent: object) -> Action:
        frame.handler = Run._run_failed
        return self._drain(frame, Run._run_admitted, limit=decisions.inherited_take(
            frame.inherited, len(self.outbox)))                   # R8.3.1

    def _run_admitted(self, frame: RunFrame, _sent: object) -> Action:
        admitted = frame.admitted
        if frame.appended < len(admitted):                        # R8.3.2
            message = admitted[frame.appended]
            frame.appended += 1
            return self._commit(ev.USER_MESSAGE, message, surface=True)
        self._check_signal()                                      # R8.3.3
        return self._drain(frame, Run._run_steps)                 # R8.3.4

    def _run_steps(self, frame: RunFrame, _sent: object) -> Action:
        frame.phase = Run._run_close
        return StepsFrame(phase=Run._steps_begin)                 # R8.4-R8.5

    def _run_failed(self, frame: RunFrame, error: Exception) -> Action:
        """R8.6: the turn fails; an internal failure fails it too (P16)."""
        failure = error if isinstance(error, (_Aborted, _Failure)) else _Failure(
            internal_error(error))
        frame.phase = Run._run_close
        return self._fail_turn(frame.turn, failure)

    def _run_close(self, frame: RunFrame, _sent: object) -> Action:
        frame.handler = None
        self.window.fire("end_run")                               # R8.7
        self.lifecycle.fire("close")
        frame.phase = Run._run_flush
        return self._closing(ev.TURN_END, frame.turn)

    def _run_flush(self, frame: RunFrame, _sent: object) -> Action:
        self._owner = None
        self._ctrl = None
        self.lifecycle.fire("flush")                              # R12.4
        flush = self._new_effect(FLUSH, FrozenDict._adopt({"turn": frame.turn}))
        frame.flush = flush.id
        frame.phase = Run._run_flush_wait
        return flush

    def _run_flush_wait(self, frame: RunFrame, _sent: object) -> Action:
        frame.phase = Run._run_flushed
        return _Wait(frozenset((frame.flush,)))

    def _run_flushed(self, frame: RunFrame, mail: _Mail) -> Action:
        _, kind, value = mail
        if kind == "raise":
            assert isinstance(value, ErrorInfo)
            frame.flush_error = value
            frame.phase = Run._run_flush_failed
            return self._warn(f"session flush failed at turn {frame.turn}: {value.rendered()}")
        return Run._run_settle(self, frame, None)

    def _run_flush_failed(self, frame: RunFrame, _sent: object) -> Action:
        error = frame.flush_error
        assert error is not None
        frame.flush_error = None
        frame.phase = Run._run_settle
        return Live(LiveEvent(ev.ERROR, FrozenDict({"turn": frame.turn, "step": self._step,
                                                   "error": frozen_json(error)})))

    def _run_settle(self, frame: RunFrame, _sent: object) -> Action:
        if self._pending_retry:                                   # R12.5 / R13.3
            self._pending_retry = False
            self.lifecycle.fire("retry")
            frame.trigger, frame.admitted, frame.inherited = RETRY_TRIGGER, (), 0
            frame.appended = 0
            return Run._run_turn(self, frame, None)
        frame.phase = Failures._finished
        return Live(LiveEvent(ev.SETTLED, FrozenDict._adopt({
            "turn": frame.turn, "reason": record_json(self._settle)})))

    def _steps_begin(self, frame: StepsFrame, _sent: object) -> Action:
        """R8.4-R8.5: the step loop of one turn."""
        self.lifecycle.fire("begin_step")
        return Run._steps_next(self, frame, None)

    def _steps_next(self, frame: StepsFrame, _sent: object) -> Action:
        self._step += 1
        frame.phase = Run._steps_stepped
        return self._one_step()

    def _steps_stepped(self, frame: StepsFrame, outcome: _StepOutcome) -> Action:
        if outcome.request_failed:                                # R8.4 / R13
            return DONE
        self._prior_failures = []                                 # R13.4
        if outcome.max_tokens:                                    # R14.3
            self._reason = MAX_TOKENS
        following = decisions.after_step(outcome.had_calls, outcome.concluded,
                                         outcome.took_steering, self.outbox.has_steering)
        if following == "close":                                  # R8.4: no check here
            return DONE
        if following == "next-step":
            return Run._steps_begin(self, frame, None)
        self.lifecycle.fire("stop_turn")                          # R8.5
        stopping = self._new_effect(TURN_STOPPING, FrozenDict._adopt({
            "turn": self._turn, "signal": self._signal()}))
        frame.stopping = stopping.id
        frame.phase = Run._steps_stopping_wait
        return stopping

    def _steps_stopping_wait(self, frame: StepsFrame, _sent: object) -> Action:
        frame.phase = Run._steps_stopped
        return _Wait(frozenset((frame.stopping,)))

    def _steps_stopped(self, frame: StepsFrame, mail: _Mail) -> Action:
        _, kind, value = mail
        if kind == "raise":
            assert isinstance(value, ErrorInfo)
            raise _Failure(value)
        self._check_signal()
        return self._drain(frame, Run._steps_stop_drained)

    def _steps_stop_drained(self, frame: StepsFrame, took_steering: bool) -> Action:
        if not took_steering:                                     # R8.5: the turn ends
            return DONE
        return Run._steps_begin(self, frame, None)
