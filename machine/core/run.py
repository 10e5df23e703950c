"""A run (rules R8, R12, R13): turns, their steps and turn-stopping, the flush and
settlement, and a retry as a new turn."""
from __future__ import annotations

from machine import decisions
from machine import events as ev
from machine.core.records import (
    COMPLETED,
    MAX_TOKENS,
    RETRY_TRIGGER,
    _Aborted,
    _Failure,
    _Proc,
    _StepOutcome,
    frozen_json,
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
    internal_error,
)


class Run(Step):
    """The run of an admitted prompt, retries included (R8, R12, R13)."""

    def _run(self, trigger: FrozenDict, admitted: list[Message], inherited: int) -> _Proc:
        while True:
            self._new_controller("run")                           # R8.1
            self.window.fire("start_run")
            self._turn = self.log.last_turn + 1
            self._reason = COMPLETED
            self._settle = COMPLETED
            self._step = 0
            turn = self._turn
            try:
                started = self._commit(ev.TURN_START, {"turn": turn, "trigger": trigger})  # R8.2
            except Exception as error:                            # P16: no turn at all
                yield from self._not_started(error)
                return
            yield started
            try:
                yield from self._drain(                           # R8.3.1
                    limit=decisions.inherited_take(inherited, len(self.outbox)))
                for message in admitted:                          # R8.3.2
                    yield self._commit(ev.USER_MESSAGE, message, surface=True)
                self._check_signal()                              # R8.3.3
                yield from self._drain()                          # R8.3.4
                yield from self._steps()                          # R8.4-R8.5
            except (_Aborted, _Failure) as failure:               # R8.6
                yield from self._fail_turn(turn, failure)
            except Exception as error:                            # P16: fails the turn
                yield from self._fail_turn(turn, _Failure(internal_error(error)))
            self.window.fire("end_run")                           # R8.7
            self.lifecycle.fire("close")
            yield from self._closing(ev.TURN_END, turn)
            self._owner = None
            self._ctrl = None
            self.lifecycle.fire("flush")                          # R12.4
            flush = self._new_effect(FLUSH, FrozenDict({"turn": turn}))
            yield flush
            _, kind, value = yield from self._await(flush.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                yield self._warn(f"session flush failed at turn {turn}: {value.rendered()}")
                yield Live(LiveEvent(ev.ERROR, FrozenDict({"turn": turn, "step": self._step,
                                                           "error": frozen_json(value)})))
            if self._pending_retry:                               # R12.5 / R13.3
                self._pending_retry = False
                self.lifecycle.fire("retry")
                trigger, admitted, inherited = RETRY_TRIGGER, [], 0
                continue
            yield Live(LiveEvent(ev.SETTLED, FrozenDict({"turn": turn, "reason": self._settle})))
            return

    def _not_started(self, error: Exception) -> _Proc:
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
        yield Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": 0,
                                                   "error": frozen_json(internal_error(error))})))

    def _steps(self) -> _Proc:
        """R8.4-R8.5: the step loop of one turn."""
        self.lifecycle.fire("begin_step")
        while True:
            self._step += 1
            outcome: _StepOutcome = yield from self._one_step()
            if outcome.request_failed:                            # R8.4 / R13
                return
            self._prior_failures = []                             # R13.4
            if outcome.max_tokens:                                # R14.3
                self._reason = MAX_TOKENS
            following = decisions.after_step(outcome.had_calls, outcome.concluded,
                                             outcome.took_steering, self.outbox.has_steering)
            if following == "close":                              # R8.4: no check here
                return
            if following == "next-step":
                self.lifecycle.fire("begin_step")
                continue
            self.lifecycle.fire("stop_turn")                      # R8.5
            stopping = self._new_effect(TURN_STOPPING, FrozenDict({
                "turn": self._turn, "signal": self._signal()}))
            yield stopping
            _, kind, value = yield from self._await(stopping.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                raise _Failure(value)
            self._check_signal()
            took_steering = yield from self._drain()
            if not took_steering:                                 # R8.5: the turn ends
                return
            self.lifecycle.fire("begin_step")
