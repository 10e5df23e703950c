"""A run (rules R8, R12.4-R12.6, R13.3): its turn and the turn's steps and turn-stopping, the
flush and settlement, and a retry as a new turn."""
from __future__ import annotations

from typing import TYPE_CHECKING

from machine import decisions
from machine import events as ev
from machine.core.drains import drain
from machine.core.failures import closing, fail_turn
from machine.core.loop import DONE, Action, RunFrame, StepsFrame, finished, goto, phase, wait_for
from machine.core.records import (
    Aborted,
    Failure,
    Mail,
    StepOutcome,
    frozen_json,
    record_json,
    warning,
)
from machine.core.step import one_step
from machine.events import LiveEvent
from machine.io import FLUSH, TURN_STOPPING, Live
from machine.jsonvalue import FrozenDict
from machine.vocabulary import (
    END_MAX_TOKENS,
    RETRY_TRIGGER,
    ErrorInfo,
    Message,
    TurnTrigger,
    internal_error,
)

if TYPE_CHECKING:
    from machine.core.state import CoreState


def run(trigger: TurnTrigger, admitted: list[Message], inherited: int) -> RunFrame:
    """R8: the run of an admitted prompt (its messages, and how many staged items it inherits)."""
    return RunFrame(phase=run_turn, trigger=trigger, admitted=tuple(admitted),
                    inherited=inherited)


@phase("run", "turn")
def run_turn(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    turn = frame.turn = core.start_run()                      # R8.1
    try:
        started = core.commit(ev.TURN_START, {"turn": turn,
                                              "trigger": record_json(frame.trigger)})  # R8.2
    except Exception as error:
        # P16 case 3: the log refused the turn/start (a direct append left a turn open,
        # say): there is no turn; agent/error reports the refusal at step 0, the prompt and
        # contexts stay unwritten, and continue-or-idle follows (as after a rejected
        # admission).
        core.run_not_started()
        frame.phase = finished
        return Live(LiveEvent(ev.ERROR, FrozenDict({"turn": core.turn, "step": 0,
                                                   "error": frozen_json(internal_error(error))})))
    frame.phase = run_inherited
    return started


# The turn's body, R8.3-R8.5: a failure raised in it fails the turn (R8.6).

@phase("run", "inherited")
def run_inherited(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    frame.handler = run_failed
    return drain(core, frame, run_admitted, limit=decisions.inherited_take(
        frame.inherited, len(core.outbox)))                   # R8.3.1


@phase("run", "admitted")
def run_admitted(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    admitted = frame.admitted
    if frame.appended < len(admitted):                        # R8.3.2
        message = admitted[frame.appended]
        frame.appended += 1
        return core.commit(ev.USER_MESSAGE, message, surface=True)
    core.check_signal()                                       # R8.3.3
    return drain(core, frame, run_steps)                      # R8.3.4


@phase("run", "steps")
def run_steps(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    frame.phase = run_close
    return StepsFrame(phase=steps_begin)                      # R8.4-R8.5


@phase("run", "failed")
def run_failed(core: CoreState, frame: RunFrame, error: Exception) -> Action:
    """R8.6: the turn fails; an internal failure fails it too (P16)."""
    failure = error if isinstance(error, (Aborted, Failure)) else Failure(internal_error(error))
    frame.phase = run_close
    return fail_turn(frame.turn, failure)


@phase("run", "close")
def run_close(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    frame.handler = None
    core.end_run()                                            # R8.7
    frame.phase = run_flush
    return closing(ev.TURN_END, frame.turn)


@phase("run", "flush")
def run_flush(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    core.start_flush()                                        # R12.4
    flush = core.new_effect(FLUSH, FrozenDict._adopt({"turn": frame.turn}))
    frame.flush = flush.id
    frame.phase = run_await_flush
    return flush


@phase("run", "await_flush")
def run_await_flush(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    return wait_for(frame, run_flushed, frame.flush)


@phase("run", "flushed")
def run_flushed(core: CoreState, frame: RunFrame, mail: Mail) -> Action:
    _, kind, value = mail
    if kind == "raise":
        assert isinstance(value, ErrorInfo)
        frame.flush_error = value
        frame.phase = run_flush_failed
        return warning(f"session flush failed at turn {frame.turn}: {value.rendered()}")
    return goto(core, frame, run_settle)


@phase("run", "flush_failed")
def run_flush_failed(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    error = frame.flush_error
    assert error is not None
    frame.flush_error = None
    frame.phase = run_settle
    return Live(LiveEvent(ev.ERROR, FrozenDict({"turn": frame.turn, "step": core.step,
                                               "error": frozen_json(error)})))


@phase("run", "settle")
def run_settle(core: CoreState, frame: RunFrame, _sent: object) -> Action:
    if core.retry_pending:                                    # R12.5 / R13.3
        core.retry()
        frame.trigger, frame.admitted, frame.inherited = RETRY_TRIGGER, (), 0
        frame.appended = 0
        return goto(core, frame, run_turn)
    frame.phase = finished
    return Live(LiveEvent(ev.SETTLED, FrozenDict._adopt({
        "turn": frame.turn, "reason": record_json(core.settle_reason)})))


# -- the steps of a turn (R8.4-R8.5) -----------------------------------------------------


@phase("steps", "begin")
def steps_begin(core: CoreState, frame: StepsFrame, _sent: object) -> Action:
    """R8.4: the next step."""
    core.begin_step()
    frame.phase = steps_stepped
    return one_step(core)


@phase("steps", "stepped")
def steps_stepped(core: CoreState, frame: StepsFrame, outcome: StepOutcome) -> Action:
    if outcome.request_failed:                                # R8.4 / R13
        return DONE
    core.clear_request_failures()                             # R13.4
    if outcome.max_tokens:                                    # R14.3
        core.set_reason(END_MAX_TOKENS)
    following = decisions.after_step(outcome.had_calls, outcome.concluded,
                                     outcome.took_steering, core.outbox.has_steering)
    if following == "close":                                  # R8.4: no check here
        return DONE
    if following == "next-step":
        return goto(core, frame, steps_begin)
    core.stop_turn()                                          # R8.5
    stopping = core.new_effect(TURN_STOPPING, FrozenDict._adopt({
        "turn": core.turn, "signal": core.signal()}))
    frame.stopping = stopping.id
    frame.phase = steps_await_stopping
    return stopping


@phase("steps", "await_stopping")
def steps_await_stopping(core: CoreState, frame: StepsFrame, _sent: object) -> Action:
    return wait_for(frame, steps_stopped, frame.stopping)


@phase("steps", "stopped")
def steps_stopped(core: CoreState, frame: StepsFrame, mail: Mail) -> Action:
    _, kind, value = mail
    if kind == "raise":
        assert isinstance(value, ErrorInfo)
        raise Failure(value)
    core.check_signal()
    return drain(core, frame, steps_stop_drained)


@phase("steps", "stop_drained")
def steps_stop_drained(core: CoreState, frame: StepsFrame, took_steering: bool) -> Action:
    if not took_steering:                                     # R8.5: the turn ends
        return DONE
    return goto(core, frame, steps_begin)
