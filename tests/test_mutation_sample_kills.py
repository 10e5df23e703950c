"""Tests added to kill surviving mutants of the sampled mutation run (specs/ASSURANCE.md,
"Mutation score") outside machine/core.py: machine/log.py, vocabulary.py and
invariants.py.

Each test asserts behaviour the specification states (specs/log.md, vocabulary.md,
core.md R20.1) and is named after the rule it checks. They cover outcomes that the
other tests exercised without asserting: the exact problem texts of some rejections
and constructor errors (part of the error contract, V8 and log.md "Rejected"), the
error path a tool-result message reports inside a log event, a step/end that names
its step with a non-integer, an empty toolCallId, the content-block constructor for
reasoning (the existing V3 test builds its blocks at import time, where mutmut
cannot see them), and the rule and counts the R20.1 invariant monitor reports.
The mutants judged equivalent are listed with their reasons in
specs/mutation/equivalent-sample.md; the ones these tests kill in
specs/mutation/killed-sample.txt.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import pytest

from machine.errors import InvariantError, ValidationError
from machine.events import Event, LiveEvent
from machine.invariants import AgentInvariantError, InvariantMonitor, conservation_problem
from machine.io import Durable, Live
from machine.jsonvalue import FrozenDict, FrozenList, freeze
from machine.log import SessionLog
from machine.vocabulary import (
    Allow,
    Block,
    CancelCause,
    ErrorInfo,
    LlmFailure,
    SendOptions,
    SettleReason,
    TurnEndReason,
    TurnTrigger,
    block_problem,
    decision_from_json,
    freeze_content,
    reasoning,
    tool_result_block,
)

MODEL = {"kind": "model", "provider": "p", "model": "m"}


def _clock() -> float:
    return 1000


def _frozen(value: Mapping[str, Any]) -> FrozenDict:
    frozen = freeze(value)
    assert isinstance(frozen, FrozenDict)
    return frozen


def _log_in_step() -> SessionLog:
    """A log with turn 1 and its step 1 open."""
    log = SessionLog(clock=_clock)
    log.append("turn/start", {"turn": 1, "trigger": {"kind": "message",
                                                     "source": {"kind": "user"}}})
    log.append("step/start", {"turn": 1, "step": 1})
    return log


def _rejection(log: SessionLog, type_: str, data: Any, **envelope: Any) -> str:
    """Append an event that must be rejected; the error text. Nothing is committed (L2)."""
    before = len(log)
    with pytest.raises(InvariantError) as info:
        log.append(type_, data, **envelope)
    assert len(log) == before
    return str(info.value)


# --------------------------------------------------------------------------
# L5: step/end
# --------------------------------------------------------------------------


def test_L5_step_end_outside_any_step_states_the_problem_exactly() -> None:
    log = SessionLog(clock=_clock)
    log.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    assert _rejection(log, "step/end", {"turn": 1, "step": 1}) == \
        "[L5] step/end is outside any open step"


@pytest.mark.parametrize(("turn", "step"), [(True, 1), (1, True), (1.0, 1), (1, 1.0)])
def test_L5_step_end_must_name_the_open_step_with_integers(turn: Any, step: Any) -> None:
    # true == 1 and 1.0 == 1 in Python, but neither is the integer step number 1.
    log = _log_in_step()
    problem = _rejection(log, "step/end", {"turn": turn, "step": step})
    assert problem.startswith("[L5] step/end: step ")
    assert problem.endswith(" does not match open step 1.1")
    assert log.open_step == 1
    log.append("step/end", {"turn": 1, "step": 1})
    assert log.open_step is None


# --------------------------------------------------------------------------
# L6: assistant/message {turn, step, message, usage?} (E1; usage is the finish
# chunk's usage, an optional mapping, V18)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("usage", ["10 tokens", 10, [1, 2]])
def test_L6_assistant_message_usage_that_is_not_a_mapping_is_rejected(usage: Any) -> None:
    log = _log_in_step()
    message = {"id": "a1", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
               "source": MODEL}
    data = {"turn": 1, "step": 1, "message": message, "usage": usage}
    assert _rejection(log, "assistant/message", data, surface_op="append") == \
        "[L6] assistant/message: data.usage must be a mapping"
    event = log.append("assistant/message", {**data, "usage": {"inputTokens": 3}},
                       surface_op="append")
    assert event.data["usage"] == {"inputTokens": 3}


# --------------------------------------------------------------------------
# L2 / L3: every commit is checked; the envelope's problems are stated
# --------------------------------------------------------------------------


def _user(id_: str) -> dict[str, Any]:
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": id_}],
            "source": {"kind": "user"}}


def test_L2_commit_after_a_check_of_another_surface_op_checks_its_own() -> None:
    log = SessionLog(clock=_clock)
    log.append("user/message", _user("u0"), surface_op="append")
    data = _frozen(_user("u1"))
    log.check("user/message", data, surface_op="append")
    assert _rejection(log, "user/message", data) == \
        "[L3] user/message requires a surfaceOp ('append' or a replace range)"
    log.check("user/message", data, surface_op="append")
    with pytest.raises(InvariantError) as info:
        log.commit("user/message", data, surface_op={"op": "replace", "start": 0, "end": 5})
    assert info.value.rule == "L3"
    assert len(log) == 1


def test_L2_commit_after_a_check_of_other_data_checks_its_own() -> None:
    log = SessionLog(clock=_clock)
    log.append("user/message", _user("u0"), surface_op="append")
    op = _frozen({"op": "replace", "start": 0, "end": 0})
    log.check("user/message", _frozen(_user("u1")), surface_op=op)
    # The same frozen mapping as data and as surfaceOp: the data is no user message.
    with pytest.raises(InvariantError) as info:
        log.commit("user/message", op, surface_op=op)
    assert info.value.rule == "L9"
    assert len(log) == 1
    assert [m.id for m in log.history(len(log))] == ["u0"]


@pytest.mark.parametrize(("data", "envelope", "problem"), [
    ({1, 2}, {}, "not JSON-compatible: data: a set is not JSON-compatible"),
    ([1], {}, "data must be a JSON object (a mapping)"),
    ({"x": 1}, {"source_event_seqs": 3}, "sourceEventSeqs must be a list of earlier seqs"),
    ({"x": 1}, {"source_event_seqs": {0}},
     "not JSON-compatible: sourceEventSeqs: a set is not JSON-compatible"),
])
def test_L3_envelope_that_is_not_json_states_the_problem(data: Any, envelope: dict[str, Any],
                                                        problem: str) -> None:
    log = SessionLog(clock=_clock)
    assert _rejection(log, "x/extension", data, **envelope) == f"[L3] {problem}"


@pytest.mark.parametrize(("envelope", "field"), [
    ({"surface_op": {"op": "replace", "start": 0, "end": float("nan")}}, "surfaceOp.end"),
    ({"surface_op": "append", "source_event_seqs": (0, {1})}, "sourceEventSeqs[1]"),
    ({"surface_op": "append", "source_event_seqs": [0, float("inf")]}, "sourceEventSeqs[1]"),
])
def test_L3_V8_surface_op_or_source_seqs_that_are_not_json_name_the_field(
        envelope: dict[str, Any], field: str) -> None:
    log = SessionLog(clock=_clock)
    log.append("user/message", _user("u0"), surface_op="append")
    problem = _rejection(log, "user/message", _user("u1"), **envelope)
    assert problem.startswith(f"[L3] not JSON-compatible: {field}: ")


# --------------------------------------------------------------------------
# L7 / V5 / V8: a malformed tool-result message is reported at data.message
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("change", "field"), [
    ({"role": "assistant"}, "data.message.role"),
    ({"id": ""}, "data.message.id"),
    ({"content": "ok"}, "data.message.content"),
])
def test_L7_V8_malformed_tool_result_message_names_the_data_message_field(
        change: dict[str, Any], field: str) -> None:
    log = _log_in_step()
    log.append("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "ls"})
    message = {"id": "r1", "role": "user",
               "content": [tool_result_block("c1", [{"type": "text", "text": "ok"}])],
               "source": {"kind": "tool", "callId": "c1"}, **change}
    problem = _rejection(log, "tool/result", {"turn": 1, "step": 1, "message": message},
                         surface_op="append")
    assert problem.startswith(f"[L7] tool/result: {field}: ")


# --------------------------------------------------------------------------
# V3: the reasoning block constructor
# --------------------------------------------------------------------------


def test_V3_reasoning_constructor_builds_a_valid_reasoning_block() -> None:
    block = reasoning("thinking")
    assert block == {"type": "reasoning", "text": "thinking"}
    assert block_problem(freeze(block)) is None


def test_V3_tool_result_block_needs_a_non_empty_tool_call_id() -> None:
    block = {"type": "tool-result", "toolCallId": "", "content": []}
    assert block_problem(freeze(block)) == "'toolCallId' must not be empty"
    assert block_problem(freeze({**block, "toolCallId": "c1"})) is None


# --------------------------------------------------------------------------
# V8: constructor problems state the field and what is wrong
# --------------------------------------------------------------------------


def _validation_error(build: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        build()
    return info.value


@pytest.mark.parametrize(("fields", "path", "problem"), [
    ({"message": 1}, "failure.message", "must be a string"),
    ({"code": None}, "failure.code", "must be a string"),
    ({"status": 429.0}, "failure.status", "must be an integer"),
    ({"provider_retry_after_ms": float("inf")}, "failure.providerRetryAfterMs",
     "must be a finite number"),
    ({"provider_retry_after_ms": "5"}, "failure.providerRetryAfterMs", "must be a finite number"),
    ({"request_id": 7}, "failure.requestId", "must be a string"),
])
def test_V14_V8_failure_field_of_the_wrong_type_is_named(fields: dict[str, Any], path: str,
                                                          problem: str) -> None:
    arguments = {"message": "m", "code": "E", **fields}
    error = _validation_error(lambda: LlmFailure(**arguments))
    assert (error.path, error.problem) == (path, problem)
    assert str(error) == f"{path}: {problem}"


@pytest.mark.parametrize("path", ["failure", "event.data.failure"])
def test_V14_V8_failure_decoder_states_the_expected_shape(path: str) -> None:
    error = _validation_error(lambda: LlmFailure.from_json("boom", path))
    assert (error.path, error.problem) == (path, "must be a mapping {message, code, ...}")


def test_V15_V8_error_info_failure_that_is_not_an_llm_failure_is_named() -> None:
    error = _validation_error(
        lambda: ErrorInfo("m", failure={"message": "m", "code": "c"}))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("error.failure", "must be an LlmFailure")


@pytest.mark.parametrize("kind", ["max-tokens", "disposed", ""])
def test_V20_V8_settle_reason_kind_outside_the_three_is_named(kind: str) -> None:
    error = _validation_error(lambda: SettleReason(kind))  # type: ignore[arg-type]
    assert (error.path, error.problem) == (
        "reason.kind", f"{kind!r} is not 'completed', 'aborted' or 'error'")


@pytest.mark.parametrize("wakeup", [1, "yes", None])
def test_V10_V8_send_options_wakeup_that_is_not_a_bool_is_named(wakeup: Any) -> None:
    error = _validation_error(lambda: SendOptions("next-turn", wakeup))
    assert (error.path, error.problem) == ("options.wakeup", "must be a bool")
    error = _validation_error(
        lambda: SendOptions.from_json({"target": "next-step", "wakeup": wakeup}, "send.options"))
    assert (error.path, error.problem) == ("send.options.wakeup", "must be a bool")


def test_V17_V8_block_decision_reason_that_is_not_a_string_is_named() -> None:
    error = _validation_error(lambda: Block(None))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("decision.reason", "must be a string")


@pytest.mark.parametrize("path", ["cause", "cancel.cause"])
def test_V11_V8_cancel_cause_decoder_states_the_shape_and_reserves_disposed(path: str) -> None:
    for value in ("user", {"kind": "user", "keep": True}, {}):
        error = _validation_error(lambda value=value: CancelCause.from_json(value, path))
        assert (error.path, error.problem) == (path, "must be {kind: 'user'} or {kind: 'parent'}")
    error = _validation_error(lambda: CancelCause.from_json({"kind": "disposed"}, path))
    assert (error.path, error.problem) == (f"{path}.kind", "'disposed' is reserved for dispose()")
    assert CancelCause.from_json({"kind": "disposed"}, path, allow_disposed=True).kind == "disposed"


# --------------------------------------------------------------------------
# R20.1: the invariant monitor names the rule and reports the counts it found
# --------------------------------------------------------------------------


class _Agent:
    def __init__(self, status: str = "running", accepts_next_step: bool = False) -> None:
        self.status = status
        self.accepts_next_step = accepts_next_step


class _Boxes:
    def __init__(self) -> None:
        self.queued: tuple[str, ...] = ()
        self.staged_items: tuple[tuple[str, bool], ...] = ()

    def queued_ids(self) -> tuple[str, ...]:
        return self.queued

    def staged(self) -> tuple[tuple[str, bool], ...]:
        return self.staged_items


def _status(status: str) -> Live:
    return Live(LiveEvent("agent/status", freeze({"status": status})))  # type: ignore[arg-type]


def _monitor_error(action: Any) -> AgentInvariantError:
    with pytest.raises(AgentInvariantError) as info:
        action()
    return info.value


def test_R20_1a_monitor_reports_a_repeated_or_idle_first_status_under_R20_1a() -> None:
    monitor = InvariantMonitor(_Agent(), _Boxes())
    monitor.output(_status("running"))
    error = _monitor_error(lambda: monitor.output(_status("running")))
    assert error.rule == "R20.1a"
    assert str(error) == "[R20.1a] agent/status 'running' after 'running'"
    error = _monitor_error(lambda: InvariantMonitor(_Agent(), _Boxes()).output(_status("idle")))
    assert error.rule == "R20.1a"


def test_R20_1e_monitor_reports_an_open_window_while_idle_under_R20_1e() -> None:
    agent = _Agent("running", accepts_next_step=True)
    monitor = InvariantMonitor(agent, _Boxes())
    monitor.poll()  # running with the window open: fine
    agent.status, agent.accepts_next_step = "idle", False
    monitor.poll()  # idle with the window closed: fine
    agent.accepts_next_step = True
    error = _monitor_error(monitor.poll)
    assert error.rule == "R20.1e"
    assert str(error) == "[R20.1e] accepts_next_step is true while idle"


def test_R20_1c_monitor_reports_the_counts_of_a_context_logged_twice() -> None:
    boxes = _Boxes()
    monitor = InvariantMonitor(_Agent(), boxes)
    boxes.staged_items = (("c1", False),)
    monitor.poll()                      # c1 is staged once
    boxes.staged_items = ()
    data = {"id": "c1", "role": "user", "content": [{"type": "text", "text": "x"}],
            "source": {"kind": "user"}}
    logged = Durable(Event("user/message", 0, 0, freeze(data), "append"))  # type: ignore[arg-type]
    monitor.output(logged)              # ... and logged once: balanced
    error = _monitor_error(lambda: monitor.output(logged))
    assert error.rule == "R20.1c"
    assert str(error) == ("[R20.1c] context 'c1' staged 1 time(s) but logged 2, discarded 0, "
                          "still staged 0")


def test_R20_1b_conservation_problem_reports_a_lost_message_with_its_counts() -> None:
    assert conservation_problem({"m1": 2}, {"m1": 1}, {}, ["m1"]) is None
    assert conservation_problem({"m1": 1}, {}, {}, []) == (
        "message 'm1': enqueued 1 time(s), but dequeued 0, discarded 0, pending 0")
    assert conservation_problem({"m1": 3}, {"m1": 1}, {"m1": 1}, []) == (
        "message 'm1': enqueued 3 time(s), but dequeued 1, discarded 1, pending 0")


@pytest.mark.parametrize(("dequeued", "discarded", "counts"), [
    ({"m1": 1}, {}, "dequeued 1, discarded 0"),
    ({}, {"m1": 1}, "dequeued 0, discarded 1"),
])
def test_R20_1b_conservation_problem_reports_a_message_that_was_never_enqueued(
        dequeued: dict[str, int], discarded: dict[str, int], counts: str) -> None:
    assert conservation_problem({}, dequeued, discarded, []) == (
        f"message 'm1': enqueued 0 time(s), but {counts}, pending 0")


def test_V17_V8_decision_errors_name_the_field_and_the_problem() -> None:
    error = _validation_error(lambda: decision_from_json("allow", "hook.decision"))
    assert (error.path, error.problem) == (
        "hook.decision", "must be {kind:'allow', ...} or {kind:'block', reason}")
    error = _validation_error(lambda: Allow(additional_contexts="x"))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("decision.additionalContexts",
                                           "must be a list of user messages")


def test_V3_V8_content_that_is_not_a_list_is_named() -> None:
    error = _validation_error(lambda: freeze_content("hello", "message.content"))
    assert (error.path, error.problem) == ("message.content", "must be a list of content blocks")


def test_V11_V8_cancel_cause_kind_outside_the_three_is_named() -> None:
    error = _validation_error(lambda: CancelCause("bogus"))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("cause.kind",
                                           "'bogus' is not 'user', 'parent' or 'disposed'")


@pytest.mark.parametrize("path", ["trigger", "data.trigger"])
def test_V13_V8_turn_trigger_decoder_states_the_expected_shape(path: str) -> None:
    error = _validation_error(lambda: TurnTrigger.from_json("retry", path))
    assert (error.path, error.problem) == (path, "must be a mapping {kind, source}")


@pytest.mark.parametrize(("kind", "fields", "path", "problem"), [
    ("completed", {"message": "m"}, "reason.message", "is not allowed on a 'completed' reason"),
    ("aborted", {"code": "E"}, "reason.code", "is not allowed on a 'aborted' reason"),
    ("error", {"step": 1, "failure": "plain"}, "reason.failure", "must be an LlmFailure"),
    ("error", {"step": 1, "failure": "llm", "message": "m"}, "reason.message",
     "is not allowed beside a failure"),
    ("error", {"step": 1, "failure": "llm", "code": "E"}, "reason.code",
     "is not allowed beside a failure"),
    ("error", {"step": 1}, "reason.message", "an error reason needs a failure or a string message"),
])
def test_V19_V8_turn_end_reason_field_problems_are_named(kind: str, fields: dict[str, Any],
                                                         path: str, problem: str) -> None:
    if fields.get("failure") == "llm":
        fields = {**fields, "failure": LlmFailure("overloaded", "E_MODEL")}
    elif fields.get("failure") == "plain":
        fields = {**fields, "failure": {"message": "overloaded", "code": "E_MODEL"}}
    error = _validation_error(lambda: TurnEndReason(kind, **fields))  # type: ignore[arg-type]
    assert (error.path, error.problem) == (path, problem)


# --------------------------------------------------------------------------
# E1 / E3: envelope construction names the field and the problem
# --------------------------------------------------------------------------


def test_E1_V8_event_field_problems_are_named() -> None:
    error = _validation_error(lambda: Event("x/extension", -1, 0, FrozenDict()))
    assert (error.path, error.problem) == ("event.seq", "must be a non-negative integer")
    error = _validation_error(
        lambda: Event("user/message", 1, 0, FrozenDict(), "append", [0, {1}]))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("event.sourceEventSeqs[1]",
                                           "a set is not JSON-compatible")


def test_E3_V8_live_payload_that_is_not_a_mapping_is_named() -> None:
    error = _validation_error(lambda: LiveEvent("agent/status", [1]))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("live.payload", "must be a mapping")


# --------------------------------------------------------------------------
# V1 / V2: freezing lists, dicts and str keys of any kind
# --------------------------------------------------------------------------


class _Items(list):  # type: ignore[type-arg]
    """A list subclass: still a JSON array (V1)."""


class _Key(str):
    """A str subclass: accepted and stored as a plain str (V1)."""


class _ReadOnly(Mapping[str, Any]):
    """A mapping that is neither a dict nor copyable."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_V1_list_and_dict_subclasses_are_frozen_as_arrays_and_objects() -> None:
    frozen = _frozen({"items": _Items([1, {"a": 2}]), "map": OrderedDict(b=[3], a=None)})
    assert frozen == {"items": [1, {"a": 2}], "map": {"b": [3], "a": None}}
    assert type(frozen["items"]) is FrozenList
    assert type(frozen["map"]) is FrozenDict
    assert list(frozen["map"]) == ["b", "a"]


def test_V1_str_subclass_keys_are_stored_as_plain_str() -> None:
    frozen = _frozen({_Key("a"): _Key("x")})
    assert frozen == {"a": "x"}
    assert [type(key) for key in frozen] == [str]
    direct = FrozenDict({_Key("b"): 1})
    assert direct == {"b": 1}
    assert [type(key) for key in direct] == [str]


def test_V2_frozen_dict_is_built_from_any_mapping() -> None:
    frozen = FrozenDict(_ReadOnly({"a": 1, "b": "x"}))
    assert frozen == {"a": 1, "b": "x"}
    assert FrozenDict(_ReadOnly({"n": [1, {"m": 2}]})) == {"n": [1, {"m": 2}]}


def test_V1_a_cycle_is_refused_and_named() -> None:
    cyclic: list[Any] = [{"a": 1}]
    cyclic.append(cyclic)
    with pytest.raises(ValidationError) as info:
        freeze({"x": cyclic}, "data")
    assert (info.value.path, info.value.problem) == ("data.x[1]", "the value contains a cycle")


def test_V1_a_list_shared_twice_is_not_a_cycle() -> None:
    shared = [{"a": 1}]
    assert freeze([shared, shared, {"k": shared}]) == [[{"a": 1}], [{"a": 1}], {"k": [{"a": 1}]}]
