"""The session log (specs/log.md, rules L1–L14; scenarios G1, G2)."""

from __future__ import annotations

import enum
import gc
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scenario_helpers import obj

from machine.checking.strategies import json_objects
from machine.errors import InvariantError, ValidationError
from machine.events import Event
from machine.jsonvalue import FrozenDict, FrozenList, JsonLike, freeze, same_json
from machine.log import SessionLog, Violation, derive_history, shares_items, validate_events
from machine.vocabulary import Message, tool_result_block, user_message

# --------------------------------------------------------------------------
# Builders: each appends one event of the core catalog (§2).
# --------------------------------------------------------------------------

MODEL = {"kind": "model", "provider": "p", "model": "m"}


def counting_clock(start: int = 1000) -> Callable[[], float]:
    ticks = iter(range(start, 10**9))
    return lambda: next(ticks)


def new_log(*events: Event) -> SessionLog:
    return SessionLog(events, clock=counting_clock())


def assistant(id_: str, content: list[dict[str, Any]] | None = None) -> Message:
    blocks = [{"type": "text", "text": id_}] if content is None else content
    return Message.from_json({"id": id_, "role": "assistant", "content": blocks,
                              "source": MODEL})


def tool_result_message(call_id: str, id_: str | None = None) -> Message:
    return Message.from_json({
        "id": id_ or f"r-{call_id}", "role": "user",
        "content": [tool_result_block(call_id, [{"type": "text", "text": "ok"}])],
        "source": {"kind": "tool", "callId": call_id}})


def turn_start(log: SessionLog, turn: int, trigger: dict[str, Any] | None = None) -> Event:
    return log.append("turn/start", {"turn": turn, "trigger": trigger or {
        "kind": "message", "source": {"kind": "user"}}})


def turn_end(log: SessionLog, turn: int, kind: str = "completed") -> Event:
    return log.append("turn/end", {"turn": turn, "reason": {"kind": kind}})


def step_start(log: SessionLog, turn: int, step: int) -> Event:
    return log.append("step/start", {"turn": turn, "step": step})


def step_end(log: SessionLog, turn: int, step: int) -> Event:
    return log.append("step/end", {"turn": turn, "step": step})


def chunk(log: SessionLog, turn: int, step: int, text: str = "x") -> Event:
    return log.append("assistant/chunk", {"turn": turn, "step": step,
                                          "chunk": {"type": "text", "text": text}})


def assistant_message(log: SessionLog, turn: int, step: int, message: Message,
                      seqs: list[int] | None = None) -> Event:
    return log.append("assistant/message", {"turn": turn, "step": step, "message": message},
                      surface_op="append", source_event_seqs=seqs or [])


def tool_call(log: SessionLog, turn: int, step: int, call_id: str) -> Event:
    return log.append("tool/call", {"turn": turn, "step": step, "callId": call_id,
                                    "name": "ls", "arguments": "{}"})


def tool_result(log: SessionLog, turn: int, step: int, call_id: str, *,
                error_code: str | None = None, surface_op: Any = "append",
                seqs: list[int] | None = None) -> Event:
    data: dict[str, Any] = {"turn": turn, "step": step,
                            "message": tool_result_message(call_id)}
    if error_code is not None:
        data["error"] = {"name": "ToolNotStartedError", "code": error_code}
    return log.append("tool/result", data, surface_op=surface_op, source_event_seqs=seqs)


def user(log: SessionLog, id_: str = "u", source: dict[str, Any] | None = None,
         surface_op: Any = "append") -> Event:
    return log.append("user/message", user_message(id_, id_, source), surface_op=surface_op)


def steering(log: SessionLog, turn: int, id_: str = "s") -> Event:
    return log.append("steering/message", {"turn": turn, "message": user_message(id_, id_)},
                      surface_op="append")


def header(log: SessionLog, model: str = "m", reason: str = "initial") -> Event:
    return log.append("request/header", {"header": {"config": {"provider": "p",
                                                               "model": model}},
                                         "reason": reason})


def rejected(log: SessionLog, rule: str, fragment: str, append: Callable[[], object]) -> None:
    """The append raises an InvariantError of *rule* naming *fragment*, and changes nothing."""
    before = tuple(log.events)
    state = (log.open_turn, log.open_step, log.last_turn, log.last_header)
    with pytest.raises(InvariantError) as info:
        append()
    assert info.value.rule == rule, str(info.value)
    assert fragment in str(info.value)
    assert tuple(log.events) == before
    assert (log.open_turn, log.open_step, log.last_turn, log.last_header) == state


def open_step_log() -> SessionLog:
    """Turn 1, step 1 open."""
    log = new_log()
    turn_start(log, 1)
    step_start(log, 1, 1)
    return log


def user_data(id_: str) -> dict[str, Any]:
    """The data of a ``user/message`` (the message itself) as a plain mapping."""
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": id_}],
            "source": {"kind": "user"}}


def frozen_mapping(value: dict[str, Any]) -> FrozenDict:
    frozen = freeze(value)
    assert isinstance(frozen, FrozenDict)
    return frozen


def rejection_text(log: SessionLog, type_: str, data: Any, **envelope: Any) -> str:
    """The text of the InvariantError an append of *data* raises; nothing is committed (L2)."""
    before = len(log)
    with pytest.raises(InvariantError) as info:
        log.append(type_, data, **envelope)
    assert len(log) == before
    return str(info.value)


# --------------------------------------------------------------------------
# L1 append-only, contiguous seqs, injectable clock
# --------------------------------------------------------------------------


def test_L1_seq_is_the_index_contiguous_from_zero() -> None:
    log = new_log()
    events = [user(log, "a"), turn_start(log, 1), step_start(log, 1, 1)]
    assert [e.seq for e in events] == [0, 1, 2]
    assert [log[i] for i in range(3)] == events == list(log.events)
    assert len(log) == 3 and log[-1] == events[-1]


@settings(max_examples=150, deadline=None)
@given(data=json_objects(max_leaves=12))
def test_L1_an_event_read_back_is_the_same_json_value(data: dict[str, Any]) -> None:
    # The log retains events compactly (specs/log.md, L1): what comes back must be the
    # same JSON value, with ints, floats (and their sign), strings and key order intact.
    log = new_log()
    committed = log.append("x.ext/any", data)
    again = log[0]
    assert again == committed and same_json(again.data, freeze(data))
    assert list(again.data) == list(committed.data)
    assert log.events[0] == committed and list(log) == [committed]


@settings(max_examples=100, deadline=None)
@given(data=json_objects(max_leaves=12))
def test_L1_data_json_is_the_retained_text_of_the_data(data: dict[str, Any]) -> None:
    from machine.jsonvalue import compact_json
    log = new_log()
    user(log, "a")
    committed = log.append("x.ext/any", data)
    assert log.data_json(1) == compact_json(committed.data) == compact_json(log[1].data)
    assert log.data_json(0) == compact_json(log[0].data)
    for bad in (2, -1, True, "1"):  # no such event, negative, not an exact int
        with pytest.raises(IndexError, match="no event with seq"):
            log.data_json(bad)  # type: ignore[arg-type]


def test_L1_the_compact_encoder_writes_exact_compact_json() -> None:
    # What the log retains (L1) is this text; the module builds its encoder once at import,
    # so a fresh one is built here to check what it writes.
    from machine import jsonvalue
    encode = jsonvalue._compact_encoder()
    value = freeze({"b": [1, 2.5, -0.0, None, True], "é": "ü\n☃\"", "a": {"x": []}})
    text = '{"b":[1,2.5,-0.0,null,true],"é":"ü\\n☃\\"","a":{"x":[]}}'
    assert encode(value) == text == jsonvalue.compact_json(value)
    assert encode("x") == '"x"' and encode(FrozenDict()) == "{}"
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode(float("nan"))
    with pytest.raises(TypeError, match="a object is not a frozen JSON value"):
        encode({"k": object()})  # type: ignore[arg-type]  # not a frozen value: refused


def test_L1_the_compact_encoder_without_the_C_accelerator_writes_the_same(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import json.encoder

    from machine import jsonvalue
    value = freeze({"b": [1, 2.5, -0.0, None, True], "é": "ü\n☃\"", "a": {"x": []}})
    expected = jsonvalue.compact_json(value)
    monkeypatch.setattr(json.encoder, "c_make_encoder", None)
    encode = jsonvalue._compact_encoder()
    assert encode(value) == expected
    with pytest.raises(ValueError, match="not JSON compliant"):
        encode(float("nan"))
    with pytest.raises(TypeError, match="a object is not a frozen JSON value"):
        encode({"k": object()})  # type: ignore[arg-type]  # not a frozen value: refused


def test_L1_retained_events_add_no_garbage_collector_work() -> None:
    # Memory and GC cost per event independent of the session's length (specs/log.md, L1;
    # BENCHMARKS.md item 1): committed events are kept as untracked records, so a
    # thousand events add (almost) nothing for the cyclic collector to walk.
    log = new_log()
    turn_start(log, 1)
    gc.collect()
    before = len(gc.get_objects())
    for step in range(1, 501):
        step_start(log, 1, step)
        step_end(log, 1, step)
    gc.collect()
    assert len(log) == 1001
    assert len(gc.get_objects()) - before < 50
    assert log[1000] == Event("step/end", 1000, log[1000].time,
                              obj(freeze({"turn": 1, "step": 500})))


def test_L1_time_comes_from_the_injected_clock() -> None:
    log = SessionLog(clock=counting_clock(500))
    assert [user(log, "a").time, user(log, "b").time] == [500, 501]


def test_L1_default_clock_is_wall_clock_epoch_ms() -> None:
    before = int(time.time() * 1000)
    event = user(SessionLog(), "a")
    assert isinstance(event.time, int)
    assert before <= event.time <= int(time.time() * 1000)


def test_L1_events_is_an_append_only_snapshot() -> None:
    log = new_log()
    user(log, "a")
    snapshot = log.events
    user(log, "b")
    assert len(snapshot) == 1 and len(log.events) == 2
    assert not hasattr(snapshot, "append") and not hasattr(snapshot, "__setitem__")


def test_L1_seeded_seq_gap_is_rejected() -> None:
    log = new_log()
    user(log, "a")
    user(log, "b")
    with pytest.raises(InvariantError) as info:
        SessionLog([log[0], replace(log[1], seq=2)])
    assert info.value.rule == "L1" and "expected seq 1, got 2" in str(info.value)


def test_L1_events_snapshot_index_past_its_end_raises_even_after_later_appends() -> None:
    log = new_log()
    log.append("user/message", user_data("u0"), surface_op="append")
    snapshot = log.events
    log.append("user/message", user_data("u1"), surface_op="append")
    assert len(snapshot) == 1
    assert snapshot[0].seq == 0 and snapshot[-1].seq == 0
    with pytest.raises(IndexError):
        snapshot[1]  # the event appended after the snapshot is not part of it
    with pytest.raises(IndexError):
        snapshot[-2]
    assert list(snapshot) == [log[0]]


# --------------------------------------------------------------------------
# L2 checked before commit
# --------------------------------------------------------------------------


def test_L2_rejected_append_changes_nothing_consumes_no_seq_and_is_never_delivered() -> None:
    ticks: list[int] = []

    def clock() -> float:
        ticks.append(1)
        return 7

    log = SessionLog(clock=clock)
    seen: list[Event] = []
    log.subscribe(seen.append)
    turn_start(log, 1)
    rejected(log, "L4", "turn 1 is still open", lambda: turn_start(log, 2))
    assert len(ticks) == 1  # the rejected append did not read the clock
    assert step_start(log, 1, 1).seq == 1
    assert [e.seq for e in seen] == [0, 1]


def test_L2_check_is_pure() -> None:
    log = new_log()
    log.check("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    assert len(log) == 0 and log.open_turn is None
    with pytest.raises(InvariantError):
        log.check("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})
    assert len(log) == 0


def test_L2_commit_checks_but_does_not_deliver() -> None:
    log = new_log()
    seen: list[Event] = []
    log.subscribe(seen.append)
    event = log.commit("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    assert log[0] == event and seen == []
    with pytest.raises(InvariantError):
        log.commit("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})
    assert len(log) == 1


def test_L2_check_applies_the_surface_and_source_rules_of_commit() -> None:
    log = new_log()
    log.commit("user/message", user_data("first"), surface_op="append")
    with pytest.raises(InvariantError):
        log.check("turn/start", {"turn": 1, "trigger": {"kind": "retry"}}, surface_op="append")
    with pytest.raises(InvariantError):
        log.check("turn/start", {"turn": 1, "trigger": {"kind": "retry"}}, source_event_seqs=[0])
    with pytest.raises(InvariantError):
        log.check("user/message", user_data("x"), surface_op={"op": "replace", "start": 3, "end": 9})
    with pytest.raises(InvariantError):
        log.check("user/message", user_data("x"), surface_op="append", source_event_seqs=[7])
    log.check("user/message", user_data("x"), surface_op="append", source_event_seqs=[0])
    assert len(log.events) == 1   # check is pure


def test_L2_a_commit_is_judged_on_its_own_values_whatever_a_check_accepted_before() -> None:
    """L2: what is committed is what is checked. A `check` that accepted other values (the
    same data with another surfaceOp, other data with the same surfaceOp) does not vouch for
    the commit that follows: the commit is refused for its own problem and changes nothing."""
    log = new_log()
    log.append("user/message", user_data("u0"), surface_op="append")
    data = frozen_mapping(user_data("u1"))
    # accepted with surfaceOp 'append'; appended without one, or committed with a range
    # that names no earlier events
    log.check("user/message", data, surface_op="append")
    assert rejection_text(log, "user/message", data) == \
        "[L3] user/message requires a surfaceOp ('append' or a replace range)"
    log.check("user/message", data, surface_op="append")
    with pytest.raises(InvariantError) as info:
        log.commit("user/message", data, surface_op={"op": "replace", "start": 0, "end": 5})
    assert info.value.rule == "L3"
    assert len(log) == 1
    # accepted as a user message under a replace op; committed with that op as its data
    op = frozen_mapping({"op": "replace", "start": 0, "end": 0})
    log.check("user/message", data, surface_op=op)
    with pytest.raises(InvariantError) as info:
        log.commit("user/message", op, surface_op=op)
    assert info.value.rule == "L9"
    assert len(log) == 1
    assert [m.id for m in log.history(len(log))] == ["u0"]


@pytest.mark.usefixtures("restored_registries")
def test_L2_a_registration_between_check_and_commit_is_honoured() -> None:
    """L2 with V3: a block check registered after a `check` and before the commit applies to
    the commit, which is refused."""
    from machine.vocabulary import register_block_type
    log = new_log()
    data = obj(freeze({"id": "u1", "role": "user", "content": [{"type": "x-img", "url": "u"}],
                       "source": {"kind": "user"}}))
    log.check("user/message", data, surface_op="append")
    register_block_type("x-img", lambda _block: "refused")
    with pytest.raises(InvariantError, match=r"data.content\[0\]: refused") as caught:
        log.commit("user/message", data, surface_op="append")
    assert caught.value.rule == "L9"
    assert len(log) == 0


# --------------------------------------------------------------------------
# L3 envelope
# --------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [(1, 2), {1, 2}, float("nan"), float("inf"), object(), b"x"])
def test_L3_data_must_be_json_compatible(bad: object) -> None:
    log = new_log()
    rejected(log, "L3", "not JSON-compatible",
             lambda: log.append("plugin/marker", {"value": bad}))


def test_L3_data_must_be_a_mapping() -> None:
    log = new_log()
    rejected(log, "L3", "mapping", lambda: log.append("plugin/marker", [1, 2]))  # type: ignore[arg-type]


def test_L3_an_event_that_cannot_be_encoded_is_refused_and_nothing_is_appended(
        monkeypatch: pytest.MonkeyPatch) -> None:
    log = new_log()

    def exhausted(_event: object) -> None:
        raise MemoryError

    monkeypatch.setattr("machine.log.event_record", exhausted)
    rejected(log, "L3", "plugin/marker: the event could not be encoded (MemoryError); nothing "
             "was appended", lambda: log.append("plugin/marker", {"value": 1}))


class _LyingSeqs(list):  # type: ignore[type-arg]
    """A list whose own iteration says something else than its items."""

    def __iter__(self) -> Any:
        raise RuntimeError("the caller's code ran")


def test_L3_V6_source_event_seqs_of_a_list_subclass_are_read_without_running_its_code() -> None:
    log = new_log()
    log.commit("user/message", user_data("first"), surface_op="append")
    event = log.commit("user/message", user_data("second"), surface_op="append",
                       source_event_seqs=_LyingSeqs([0]))
    assert event.source_event_seqs == [0] and type(event.source_event_seqs) is FrozenList


def test_L3_data_is_snapshotted_at_commit() -> None:
    log = new_log()
    data: dict[str, Any] = {"items": [1, 2]}
    event = log.append("plugin/marker", data)
    data["items"].append(3)
    assert event.data == {"items": [1, 2]}
    assert isinstance(event.data, FrozenDict)


def test_L3_surface_op_is_required_on_surface_types() -> None:
    log = open_step_log()
    rejected(log, "L3", "requires a surfaceOp",
             lambda: log.append("user/message", user_message("u", "hi")))
    rejected(log, "L3", "requires a surfaceOp", lambda: log.append(
        "steering/message", {"turn": 1, "message": user_message("s", "hi")}))


def test_L3_surface_op_is_forbidden_on_other_types() -> None:
    log = new_log()
    rejected(log, "L3", "must not carry a surfaceOp", lambda: log.append(
        "turn/start", {"turn": 1, "trigger": {"kind": "retry"}}, surface_op="append"))
    rejected(log, "L3", "must not carry a surfaceOp",
             lambda: log.append("plugin/marker", {}, surface_op="append"))


@pytest.mark.parametrize("op", ["prepend", {"op": "replace", "start": 1, "end": 0},
                                {"op": "replace", "start": 0}, {"op": "swap", "start": 0,
                                                                "end": 0}])
def test_L3_surface_op_shape(op: object) -> None:
    log = new_log()
    user(log, "a")
    rejected(log, "L3", "surfaceOp", lambda: user(log, "b", surface_op=op))


def test_L3_replace_range_must_name_earlier_events() -> None:
    log = new_log()
    user(log, "a")
    rejected(log, "L3", "must name earlier events",
             lambda: user(log, "b", surface_op={"op": "replace", "start": 0, "end": 1}))
    assert user(log, "b", surface_op={"op": "replace", "start": 0, "end": 0}).seq == 1


def test_L3_source_event_seqs_only_on_surface_types_and_earlier() -> None:
    log = open_step_log()
    rejected(log, "L3", "must not carry sourceEventSeqs", lambda: log.append(
        "assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "x"}},
        source_event_seqs=[0]))
    rejected(log, "L3", "does not name an earlier event",
             lambda: assistant_message(log, 1, 1, assistant("a"), seqs=[2]))
    rejected(log, "L3", "does not name an earlier event",
             lambda: assistant_message(log, 1, 1, assistant("a"), seqs=[-1]))
    assert assistant_message(log, 1, 1, assistant("a"), seqs=[0, 1]).source_event_seqs == (0, 1)


class _Seq(enum.IntEnum):
    FIRST = 0


def test_L3_every_source_event_seq_is_checked_whatever_its_position() -> None:
    """The first bad entry is named, wherever it sits among good ones (the usual case of
    exact ints in range is confirmed at once, anything else is walked entry by entry)."""
    log = open_step_log()
    for seqs, named in (([0, 1, 9], "entry 9"), ([0, -1, 1], "entry -1"), ([1, True], "entry True"),
                        ([0, 1, 2], "entry 2")):
        def append(seqs: list[int] = seqs) -> Event:
            return assistant_message(log, 1, 1, assistant("a"), seqs=seqs)
        rejected(log, "L3", f"sourceEventSeqs {named} does not name", append)
    with pytest.raises(InvariantError, match="Seq is not a JSON number"):  # refused by V1
        assistant_message(log, 1, 1, assistant("a"), seqs=[_Seq.FIRST, 1])
    event = assistant_message(log, 1, 1, assistant("a"), seqs=[0, 1])
    assert event.source_event_seqs == (0, 1) and log[event.seq] == event
    assert assistant_message(log, 1, 1, assistant("b"), seqs=[]).source_event_seqs == ()


def test_L3_seeded_time_must_be_a_number() -> None:
    log = new_log()
    user(log, "a")
    damaged = replace(log[0])
    object.__setattr__(damaged, "time", "noon")  # Event() itself refuses this; bypass it
    with pytest.raises(InvariantError) as info:
        SessionLog([damaged])
    assert info.value.rule == "L3"


@pytest.mark.parametrize(("data", "envelope", "problem"), [
    ({1, 2}, {}, "not JSON-compatible: data: a set is not JSON-compatible"),
    ([1], {}, "data must be a JSON object (a mapping)"),
    ({"x": 1}, {"source_event_seqs": 3}, "sourceEventSeqs must be a list of earlier seqs"),
    ({"x": 1}, {"source_event_seqs": {0}},
     "not JSON-compatible: sourceEventSeqs: a set is not JSON-compatible"),
])
def test_L3_envelope_that_is_not_json_states_the_problem(data: Any, envelope: dict[str, Any],
                                                        problem: str) -> None:
    log = new_log()
    assert rejection_text(log, "x/extension", data, **envelope) == f"[L3] {problem}"


@pytest.mark.parametrize(("envelope", "field"), [
    ({"surface_op": {"op": "replace", "start": 0, "end": float("nan")}}, "surfaceOp.end"),
    ({"surface_op": "append", "source_event_seqs": (0, {1})}, "sourceEventSeqs[1]"),
    ({"surface_op": "append", "source_event_seqs": [0, float("inf")]}, "sourceEventSeqs[1]"),
])
def test_L3_V8_surface_op_or_source_seqs_that_are_not_json_name_the_field(
        envelope: dict[str, Any], field: str) -> None:
    log = new_log()
    log.append("user/message", user_data("u0"), surface_op="append")
    problem = rejection_text(log, "user/message", user_data("u1"), **envelope)
    assert problem.startswith(f"[L3] not JSON-compatible: {field}: ")


# --------------------------------------------------------------------------
# L4 turns
# --------------------------------------------------------------------------


def test_L4_turn_start_requires_closed_turn() -> None:
    log = new_log()
    turn_start(log, 1)
    rejected(log, "L4", "turn 1 is still open", lambda: turn_start(log, 2))


def test_L4_turn_numbers_are_consecutive_from_one() -> None:
    log = new_log()
    rejected(log, "L4", "expected turn 1, got 2", lambda: turn_start(log, 2))
    rejected(log, "L4", "expected turn 1, got 0", lambda: turn_start(log, 0))
    turn_start(log, 1)
    turn_end(log, 1)
    rejected(log, "L4", "expected turn 2, got 1", lambda: turn_start(log, 1))
    rejected(log, "L4", "expected turn 2, got True", lambda: log.append(
        "turn/start", {"turn": True, "trigger": {"kind": "retry"}}))
    turn_start(log, 2, {"kind": "retry"})
    assert log.last_turn == 2 and log.open_turn == 2


@pytest.mark.parametrize("trigger", [
    {"kind": "message", "source": {"kind": "user"}},
    {"kind": "message", "source": {"kind": "plugin", "plugin": "x"}},
    {"kind": "retry"},
    {"kind": "injection", "source": {"kind": "plugin", "plugin": ""}},
])
def test_L4_turn_start_trigger_kinds(trigger: dict[str, Any]) -> None:
    log = new_log()
    assert turn_start(log, 1, trigger).data["trigger"] == trigger


@pytest.mark.parametrize("trigger", [
    "message", {"kind": "prompt"}, {"kind": "message"}, {"kind": "message", "source": {}},
])
def test_L4_turn_start_rejects_a_malformed_trigger(trigger: Any) -> None:
    log = new_log()
    rejected(log, "L4", "trigger", lambda: log.append("turn/start",
                                                      {"turn": 1, "trigger": trigger}))


def test_L4_turn_end_must_name_the_open_turn() -> None:
    log = new_log()
    rejected(log, "L4", "outside any open turn", lambda: turn_end(log, 1))
    turn_start(log, 1)
    rejected(log, "L4", "does not match open turn 1", lambda: turn_end(log, 2))
    turn_end(log, 1)
    assert log.open_turn is None and log.last_turn == 1


def test_L4_turn_end_requires_no_open_step() -> None:
    log = open_step_log()
    rejected(log, "L4", "step 1.1 is still open", lambda: turn_end(log, 1))


@pytest.mark.parametrize("reason", [
    {"kind": "completed"}, {"kind": "aborted"}, {"kind": "disposed"}, {"kind": "max-tokens"},
    {"kind": "interrupted"}, {"kind": "error", "step": 1, "message": "boom", "code": "X"},
    {"kind": "error", "step": 0, "failure": {"message": "overloaded", "code": "HTTP_529"}},
])
def test_L4_turn_end_reason_kinds(reason: dict[str, Any]) -> None:
    log = new_log()
    turn_start(log, 1)
    assert log.append("turn/end", {"turn": 1, "reason": reason}).data["reason"] == reason


@pytest.mark.parametrize("reason", [None, "completed", {"kind": "done"}, {},
                                    {"kind": "aborted", "step": 1}, {"kind": "error"}])
def test_L4_turn_end_rejects_a_malformed_reason(reason: Any) -> None:
    log = new_log()
    turn_start(log, 1)
    rejected(log, "L4", "data.reason", lambda: log.append("turn/end",
                                                          {"turn": 1, "reason": reason}))


# --------------------------------------------------------------------------
# L5 steps
# --------------------------------------------------------------------------


def test_L5_step_start_requires_an_open_turn_and_no_open_step() -> None:
    log = new_log()
    rejected(log, "L5", "step/start requires an open turn", lambda: step_start(log, 1, 1))
    turn_start(log, 1)
    step_start(log, 1, 1)
    rejected(log, "L5", "step 1.1 is still open", lambda: step_start(log, 1, 2))


def test_L5_step_numbers_are_consecutive_per_turn() -> None:
    log = new_log()
    turn_start(log, 1)
    rejected(log, "L5", "expected step 1 of turn 1, got 2", lambda: step_start(log, 1, 2))
    rejected(log, "L5", "turn 2 does not match open turn 1", lambda: step_start(log, 2, 1))
    step_start(log, 1, 1)
    step_end(log, 1, 1)
    rejected(log, "L5", "expected step 2 of turn 1, got 1", lambda: step_start(log, 1, 1))
    step_start(log, 1, 2)
    step_end(log, 1, 2)
    turn_end(log, 1)
    turn_start(log, 2)
    assert step_start(log, 2, 1).data["step"] == 1  # numbering restarts with each turn


def test_L5_step_end_must_name_the_open_step() -> None:
    log = new_log()
    turn_start(log, 1)
    rejected(log, "L5", "outside any open step", lambda: step_end(log, 1, 1))
    step_start(log, 1, 1)
    rejected(log, "L5", "step 1.2 does not match open step 1.1", lambda: step_end(log, 1, 2))
    rejected(log, "L5", "step 2.1 does not match open step 1.1", lambda: step_end(log, 2, 1))
    step_end(log, 1, 1)
    assert log.open_step is None and log.open_turn == 1


def test_L5_step_end_outside_any_step_states_the_problem_exactly() -> None:
    log = new_log()
    turn_start(log, 1)
    assert rejection_text(log, "step/end", {"turn": 1, "step": 1}) == \
        "[L5] step/end is outside any open step"


@pytest.mark.parametrize(("turn", "step"), [(True, 1), (1, True), (1.0, 1), (1, 1.0)])
def test_L5_step_end_must_name_the_open_step_with_integers(turn: Any, step: Any) -> None:
    # true == 1 and 1.0 == 1 in Python, but neither is the integer step number 1.
    log = open_step_log()
    problem = rejection_text(log, "step/end", {"turn": turn, "step": step})
    assert problem.startswith("[L5] step/end: step ")
    assert problem.endswith(" does not match open step 1.1")
    assert log.open_step == 1
    log.append("step/end", {"turn": 1, "step": 1})
    assert log.open_step is None


# --------------------------------------------------------------------------
# L6 assistant/chunk, assistant/message, tool/call
# --------------------------------------------------------------------------


STEP_EVENTS: dict[str, Callable[[SessionLog, int, int], object]] = {
    "assistant/chunk": chunk,
    "assistant/message": lambda log, t, s: assistant_message(log, t, s, assistant("a")),
    "tool/call": lambda log, t, s: tool_call(log, t, s, "c1"),
}


@pytest.mark.parametrize("kind", sorted(STEP_EVENTS))
def test_L6_step_events_require_an_open_step_they_name(kind: str) -> None:
    append = STEP_EVENTS[kind]
    log = new_log()
    rejected(log, "L6", "outside any open turn", lambda: append(log, 1, 1))
    turn_start(log, 1)
    rejected(log, "L6", "outside any open step", lambda: append(log, 1, 1))
    step_start(log, 1, 1)
    rejected(log, "L6", "names step 1.2 but the open step is 1.1", lambda: append(log, 1, 2))
    rejected(log, "L6", "names step 2.1 but the open step is 1.1", lambda: append(log, 2, 1))
    append(log, 1, 1)
    step_end(log, 1, 1)
    rejected(log, "L6", "outside any open step", lambda: append(log, 1, 1))


def test_L6_assistant_message_must_be_an_assistant_message() -> None:
    log = open_step_log()
    rejected(log, "L6", "must be 'assistant'", lambda: log.append(
        "assistant/message", {"turn": 1, "step": 1, "message": user_message("u", "hi")},
        surface_op="append"))
    rejected(log, "L6", "data.message", lambda: log.append(
        "assistant/message", {"turn": 1, "step": 1, "message": {"id": "x"}},
        surface_op="append"))


def test_L6_chunk_and_tool_call_shapes() -> None:
    log = open_step_log()
    rejected(log, "L6", "data.chunk", lambda: log.append(
        "assistant/chunk", {"turn": 1, "step": 1, "chunk": "text"}))
    rejected(log, "L6", "data.chunk", lambda: log.append(
        "assistant/chunk", {"turn": 1, "step": 1, "chunk": {"type": "finish", "kind": "x"}}))
    rejected(log, "L6", "data.callId", lambda: log.append(
        "tool/call", {"turn": 1, "step": 1, "name": "ls"}))
    rejected(log, "L6", "data.name", lambda: log.append(
        "tool/call", {"turn": 1, "step": 1, "callId": "c1"}))


@pytest.mark.parametrize("usage", ["10 tokens", 10, [1, 2]])
def test_L6_assistant_message_usage_that_is_not_a_mapping_is_rejected(usage: Any) -> None:
    """E1, V18: usage is the finish chunk's usage, an optional mapping."""
    log = open_step_log()
    message = {"id": "a1", "role": "assistant", "content": [{"type": "text", "text": "hi"}],
               "source": MODEL}
    data = {"turn": 1, "step": 1, "message": message, "usage": usage}
    assert rejection_text(log, "assistant/message", data, surface_op="append") == \
        "[L6] assistant/message: data.usage must be a mapping"
    event = log.append("assistant/message", {**data, "usage": {"inputTokens": 3}},
                       surface_op="append")
    assert event.data["usage"] == {"inputTokens": 3}


# --------------------------------------------------------------------------
# L7 tool/result
# --------------------------------------------------------------------------


def test_L7_fresh_tool_result_needs_a_tool_call_earlier_in_the_same_step() -> None:
    log = open_step_log()
    rejected(log, "L7", "no tool/call with callId 'c1' earlier in step 1.1",
             lambda: tool_result(log, 1, 1, "c1"))
    call = tool_call(log, 1, 1, "c1")
    rejected(log, "L7", "names step 1.2", lambda: tool_result(log, 1, 2, "c1"))
    assert tool_result(log, 1, 1, "c1", seqs=[call.seq]).source_event_seqs == (call.seq,)


def test_L7_fresh_tool_result_requires_an_open_step() -> None:
    log = new_log()
    rejected(log, "L7", "outside any open turn", lambda: tool_result(log, 1, 1, "c1"))
    turn_start(log, 1)
    rejected(log, "L7", "outside any open step", lambda: tool_result(log, 1, 1, "c1"))


def test_L7_tool_not_started_error_result_needs_no_tool_call_but_an_open_step() -> None:
    log = new_log()
    turn_start(log, 1)
    rejected(log, "L7", "outside any open step",
             lambda: tool_result(log, 1, 1, "c9", error_code="TOOL_NOT_STARTED"))
    step_start(log, 1, 1)
    rejected(log, "L7", "no tool/call",
             lambda: tool_result(log, 1, 1, "c9", error_code="TOOL_OUTCOME_UNKNOWN"))
    tool_result(log, 1, 1, "c9", error_code="TOOL_NOT_STARTED")


def test_L7_step_end_forgets_unresolved_calls() -> None:
    log = open_step_log()
    tool_call(log, 1, 1, "c1")
    step_end(log, 1, 1)  # a step may end with an unresolved call
    step_start(log, 1, 2)
    rejected(log, "L7", "no tool/call with callId 'c1' earlier in step 1.2",
             lambda: tool_result(log, 1, 2, "c1"))


def test_L7_replacement_tool_result_needs_only_an_open_turn() -> None:
    log = new_log()
    user(log, "a")
    op = {"op": "replace", "start": 0, "end": 0}
    rejected(log, "L7", "outside any open turn",
             lambda: tool_result(log, 1, 1, "c1", surface_op=op))
    turn_start(log, 1)
    event = tool_result(log, 1, 1, "c1", surface_op=op)
    assert event.surface_op == op


def test_L7_tool_result_message_must_be_a_tool_result_message() -> None:
    log = open_step_log()
    tool_call(log, 1, 1, "c1")
    wrong = [
        user_message("u", "hi"),  # not a tool source
        Message.from_json({"id": "r", "role": "user", "content": [],
                           "source": {"kind": "tool", "callId": "c1"}}),
        Message.from_json({"id": "r", "role": "user",
                           "content": [tool_result_block("c2", [])],
                           "source": {"kind": "tool", "callId": "c1"}}),
    ]
    for message in wrong:
        rejected(log, "L7", "tool/result", lambda m=message: log.append(  # type: ignore[misc]
            "tool/result", {"turn": 1, "step": 1, "message": m}, surface_op="append"))


@pytest.mark.parametrize(("change", "field"), [
    ({"role": "assistant"}, "data.message.role"),
    ({"id": ""}, "data.message.id"),
    ({"content": "ok"}, "data.message.content"),
])
def test_L7_V8_malformed_tool_result_message_names_the_data_message_field(
        change: dict[str, Any], field: str) -> None:
    log = open_step_log()
    log.append("tool/call", {"turn": 1, "step": 1, "callId": "c1", "name": "ls"})
    message = {"id": "r1", "role": "user",
               "content": [tool_result_block("c1", [{"type": "text", "text": "ok"}])],
               "source": {"kind": "tool", "callId": "c1"}, **change}
    problem = rejection_text(log, "tool/result", {"turn": 1, "step": 1, "message": message},
                             surface_op="append")
    assert problem.startswith(f"[L7] tool/result: {field}: ")


# --------------------------------------------------------------------------
# L8 steering/message, todo/write, request/header
# --------------------------------------------------------------------------


TURN_EVENTS: dict[str, Callable[[SessionLog], object]] = {
    "steering/message": lambda log: steering(log, 1),
    "todo/write": lambda log: log.append("todo/write", {"todos": []}),
    "request/header": header,
}


@pytest.mark.parametrize("kind", sorted(TURN_EVENTS))
def test_L8_turn_events_require_an_open_turn(kind: str) -> None:
    append = TURN_EVENTS[kind]
    log = new_log()
    rejected(log, "L8", "outside any open turn", lambda: append(log))
    turn_start(log, 1)
    append(log)  # no step needed
    step_start(log, 1, 1)
    append(log)
    step_end(log, 1, 1)
    turn_end(log, 1)
    rejected(log, "L8", "outside any open turn", lambda: append(log))


def test_L8_steering_names_the_open_turn_and_carries_a_user_message() -> None:
    log = new_log()
    turn_start(log, 1)
    rejected(log, "L8", "turn 2 does not match open turn 1", lambda: steering(log, 2))
    rejected(log, "L8", "must be 'user'", lambda: log.append(
        "steering/message", {"turn": 1, "message": assistant("a")}, surface_op="append"))


def test_L8_request_header_shape_and_last_header() -> None:
    log = new_log()
    last, has = log.last_header, log.has_header  # locals: mypy would keep both narrowed below
    assert last is None and not has
    turn_start(log, 1)
    rejected(log, "L8", "data.reason", lambda: header(log, reason="because"))
    rejected(log, "L8", "data.header", lambda: log.append(
        "request/header", {"header": "cfg", "reason": "initial"}))
    header(log, "m1")
    header(log, "m2", reason="change")
    assert log.has_header
    assert log.last_header == {"config": {"provider": "p", "model": "m2"}}


# --------------------------------------------------------------------------
# L9 user/message
# --------------------------------------------------------------------------


def test_L9_user_message_is_allowed_anywhere() -> None:
    log = new_log()
    user(log, "before")
    turn_start(log, 1)
    user(log, "in-turn")
    step_start(log, 1, 1)
    user(log, "in-step")
    step_end(log, 1, 1)
    turn_end(log, 1)
    user(log, "between", {"kind": "plugin", "plugin": "test"})
    assert [m.id for m in log.derive_messages()] == ["before", "in-turn", "in-step", "between"]


def test_L9_user_message_data_is_a_well_formed_user_message() -> None:
    log = new_log()
    message = user_message("u", "hi").to_json()
    rejected(log, "L9", "unexpected field", lambda: log.append(
        "user/message", {**message, "turn": 1}, surface_op="append"))
    rejected(log, "L9", "must be 'user'", lambda: log.append(
        "user/message", assistant("a"), surface_op="append"))
    rejected(log, "L9", "data.id", lambda: log.append(
        "user/message", {**message, "id": ""}, surface_op="append"))
    rejected(log, "L9", "data.source", lambda: log.append(
        "user/message", {**message, "source": {}}, surface_op="append"))
    assert log.append("user/message", message, surface_op="append").data == message


# --------------------------------------------------------------------------
# L10 extension event types
# --------------------------------------------------------------------------


def test_L10_extension_types_without_rules_are_accepted_anywhere() -> None:
    log = new_log()
    log.append("plugin/marker", {})
    turn_start(log, 1)
    step_start(log, 1, 1)
    log.append("plugin/marker", {"n": 1})
    assert [e.type for e in log.events].count("plugin/marker") == 2


def test_L10_registered_rule_is_enforced() -> None:
    log = new_log()
    seen: list[tuple[int, str, FrozenDict]] = []

    def inside_a_turn(current: SessionLog, type_: str, data: FrozenDict) -> str | None:
        seen.append((len(current), type_, data))
        return None if current.open_turn is not None else "compaction must lie inside a turn"

    log.register_rule("compact/start", inside_a_turn)
    rejected(log, "L10", "compact/start: compaction must lie inside a turn",
             lambda: log.append("compact/start", {"k": 1}))
    turn_start(log, 1)
    log.append("compact/start", {"k": 2})
    length, type_, data = seen[-1]
    assert (length, type_) == (1, "compact/start") and data == {"k": 2}


def test_L10_core_rules_cannot_be_overridden() -> None:
    log = new_log()
    with pytest.raises(ValidationError, match="core event type"):
        log.register_rule("turn/start", lambda _log, _type, _data: None)
    with pytest.raises(ValidationError):
        log.register_rule("", lambda _log, _type, _data: None)


def test_L10_V8_register_rule_errors_name_the_argument() -> None:
    log = new_log()
    for bad in ("", 5):
        with pytest.raises(ValidationError) as caught:
            log.register_rule(bad, lambda *_a: None)  # type: ignore[arg-type]
        assert (caught.value.path, caught.value.problem) == ("event_type", "must be a non-empty string")
    with pytest.raises(ValidationError) as caught:
        log.register_rule("turn/start", lambda *_a: None)
    assert caught.value.path == "event_type"
    assert caught.value.problem == "'turn/start' is a core event type; its rules cannot be overridden"


def test_L10_rule_registered_after_a_check_applies_to_the_next_commit() -> None:
    log = new_log()
    data = FrozenDict({"k": 1})
    log.check("x/ext", data)  # no rule yet: anything goes
    log.register_rule("x/ext", lambda _log, _type, _data: "refused by the new rule")
    with pytest.raises(InvariantError) as caught:
        log.commit("x/ext", data)
    assert caught.value.rule == "L10"
    assert "refused by the new rule" in str(caught.value)
    assert len(log) == 0


def test_L10_extension_rule_is_consulted_again_at_commit_after_a_check() -> None:
    log = new_log()
    answers = iter([None, "changed its mind"])
    log.register_rule("x/ext", lambda _log, _type, _data: next(answers))
    data = FrozenDict({"k": 1})
    log.check("x/ext", data)
    with pytest.raises(InvariantError) as caught:
        log.append("x/ext", data)
    assert caught.value.rule == "L10" and len(log) == 0


# --------------------------------------------------------------------------
# L11 observers
# --------------------------------------------------------------------------


def test_L11_observers_run_after_commit_in_registration_order() -> None:
    log = new_log()
    calls: list[tuple[str, int, int]] = []
    log.subscribe(lambda e: calls.append(("first", e.seq, len(log))))
    log.subscribe(lambda e: calls.append(("second", e.seq, len(log))))
    user(log, "a")
    assert calls == [("first", 0, 1), ("second", 0, 1)]


def test_L11_observer_exceptions_are_contained_and_cannot_veto(
        caplog: pytest.LogCaptureFixture) -> None:
    log = new_log()
    later: list[int] = []

    def failing(_event: Event) -> None:
        raise RuntimeError("observer exploded")

    log.subscribe(failing)
    log.subscribe(lambda e: later.append(e.seq))
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        event = turn_start(log, 1)
    assert log[0] == event and log.open_turn == 1
    assert later == [0]
    assert any("observer exploded" in r.getMessage() and "turn/start" in r.getMessage()
               and r.levelno == logging.WARNING for r in caplog.records)


def test_L11_unsubscribe() -> None:
    log = new_log()
    seen: list[int] = []
    unsubscribe = log.subscribe(lambda e: seen.append(e.seq))
    user(log, "a")
    unsubscribe()
    unsubscribe()  # idempotent
    user(log, "b")
    assert seen == [0]


def test_L11_unsubscribed_during_delivery_is_not_called_again() -> None:
    log = new_log()
    seen: list[str] = []
    unsubscribers: list[Callable[[], None]] = []
    log.subscribe(lambda e: unsubscribers[0]())
    unsubscribers.append(log.subscribe(lambda e: seen.append(e.type)))
    user(log, "a")
    assert seen == []


def test_L11_every_observer_receives_each_event_in_registration_order() -> None:
    log = new_log()
    seen: list[tuple[str, int]] = []

    def observer(name: str) -> Callable[[Event], None]:
        return lambda e: seen.append((name, e.seq))
    unsubscribe = [log.subscribe(observer(f"o{n}")) for n in range(4)]
    log.append("user/message", user_data("a"), surface_op="append")
    assert seen == [("o0", 0), ("o1", 0), ("o2", 0), ("o3", 0)]
    unsubscribe[2]()
    log.append("user/message", user_data("b"), surface_op="append")
    assert seen[4:] == [("o0", 1), ("o1", 1), ("o3", 1)]


# --------------------------------------------------------------------------
# L12 nested appends (§0.6)
# --------------------------------------------------------------------------


def test_L12_nested_append_commits_at_once_and_is_delivered_after_the_current_event() -> None:
    log = new_log()
    deliveries: list[tuple[str, int]] = []
    nested: list[Event] = []

    def first(event: Event) -> None:
        deliveries.append(("first", event.seq))
        if event.type == "turn/start":
            appended = user(log, "from-observer")
            assert appended.seq == event.seq + 1 and len(log) == 2  # committed at once
            assert deliveries == [("first", 0)]  # ... but not delivered yet
            nested.append(appended)

    log.subscribe(first)
    log.subscribe(lambda e: deliveries.append(("second", e.seq)))
    outer = turn_start(log, 1)
    assert outer.seq == 0 and nested[0].seq == 1
    # The outermost append returned after the nested delivery finished.
    assert deliveries == [("first", 0), ("second", 0), ("first", 1), ("second", 1)]


def test_L12_deliveries_are_strictly_in_seq_order() -> None:
    log = new_log()
    order: list[int] = []

    def chain(event: Event) -> None:
        order.append(event.seq)
        if event.seq < 4:  # each delivery appends two more events
            log.append("plugin/tick", {"from": event.seq})
            log.append("plugin/tick", {"from": event.seq})

    log.subscribe(chain)
    log.append("plugin/tick", {})
    assert order == list(range(len(log)))
    assert len(log) == 9


def test_L12_a_rejected_nested_append_is_contained_like_any_observer_failure() -> None:
    log = new_log()
    seen: list[int] = []

    def start_a_wrong_turn(event: Event) -> None:
        if event.seq == 0:
            turn_start(log, 5)  # rejected: expected turn 1

    log.subscribe(start_a_wrong_turn)
    log.subscribe(lambda e: seen.append(e.seq))
    user(log, "a")
    assert len(log) == 1 and seen == [0]


# --------------------------------------------------------------------------
# L13 derived history (§21.2, §21.3)
# --------------------------------------------------------------------------


def sample_log() -> SessionLog:
    log = new_log()
    user(log, "ctx", {"kind": "plugin", "plugin": "memory"})      # 0
    turn_start(log, 1)                                              # 1
    user(log, "prompt")                                             # 2
    step_start(log, 1, 1)                                           # 3
    chunk(log, 1, 1)                                                # 4
    call = assistant("a1", [{"type": "tool-call", "id": "c1", "name": "ls",
                             "arguments": "{}"}])
    assistant_message(log, 1, 1, call, [4])                         # 5
    tool_call(log, 1, 1, "c1")                                      # 6
    tool_result(log, 1, 1, "c1", seqs=[6])                          # 7
    steering(log, 1, "steer")                                       # 8
    step_end(log, 1, 1)                                             # 9
    step_start(log, 1, 2)                                           # 10
    assistant_message(log, 1, 2, assistant("empty", []))            # 11
    step_end(log, 1, 2)                                             # 12
    turn_end(log, 1)                                                # 13
    user(log, "between", {"kind": "plugin", "plugin": "watch"})    # 14
    return log


def test_L13_derived_history_projects_surface_events_in_log_order() -> None:
    log = sample_log()
    messages = log.derive_messages()
    # The empty assistant message is skipped; the between-turn context is history.
    assert [m.id for m in messages] == ["ctx", "prompt", "a1", "r-c1", "steer", "between"]
    assert messages[3] == tool_result_message("c1")
    assert [m.id for m in log.derive_messages(3)] == ["ctx", "prompt"]
    assert log.derive_messages(0) == ()


def test_L13_replace_shadows_its_range_and_takes_its_place() -> None:
    log = sample_log()
    summary = user(log, "summary", {"kind": "plugin", "plugin": "compact"},
                   surface_op={"op": "replace", "start": 0, "end": 7})
    assert [m.id for m in log.derive_messages()] == ["summary", "steer", "between"]
    assert [m.id for m in log.derive_messages(summary.seq)] == [
        "ctx", "prompt", "a1", "r-c1", "steer", "between"]
    # A later replace may shadow an earlier replacement.
    user(log, "summary2", surface_op={"op": "replace", "start": 8, "end": 15})
    assert [m.id for m in log.derive_messages()] == ["summary2"]


def test_L13_replace_of_a_range_without_entries_lands_at_its_position() -> None:
    log = sample_log()
    user(log, "x", surface_op={"op": "replace", "start": 9, "end": 13})
    assert [m.id for m in log.derive_messages()] == [
        "ctx", "prompt", "a1", "r-c1", "steer", "x", "between"]


def test_L13_history_views_of_one_generation_share_their_items_and_a_replace_does_not() -> None:
    """L13 (and specs/providers.md W10): two history views of one generation hold the same
    list, so the shorter is the longer's prefix item for item; a replace starts a new list,
    and nothing else counts as sharing."""
    log = sample_log()
    early, late = log.history(5), log.history(len(log))
    assert shares_items(early, late) and shares_items(late, early)
    assert all(a is b for a, b in zip(early, late, strict=False))
    user(log, "summary", {"kind": "plugin", "plugin": "compact"},
         surface_op={"op": "replace", "start": 0, "end": 7})
    assert not shares_items(log.history(len(log)), late)
    assert not shares_items(list(late), late) and not shares_items(late, tuple(late))
    assert not shares_items(log.events, late)


def test_L13_history_views_are_cheap_snapshots_equal_to_derive_messages() -> None:
    log = sample_log()
    early = log.history(8)
    full = log.history(len(log))
    frozen_early, frozen_full = tuple(early), tuple(full)
    user(log, "later")
    user(log, "summary", surface_op={"op": "replace", "start": 0, "end": 15})
    user(log, "after")
    assert tuple(early) == frozen_early == log.derive_messages(8)
    assert tuple(full) == frozen_full == log.derive_messages(15)
    for end in range(len(log) + 2):
        view = log.history(end)
        assert view == log.derive_messages(end)
        assert list(view) == list(log.derive_messages(end))
    assert [m.id for m in log.history(len(log))] == ["summary", "after"]


def test_L13_history_view_is_a_read_only_sequence() -> None:
    log = sample_log()
    view = log.history(len(log))
    assert view[0].id == "ctx" and view[-1].id == "between"
    assert view[1:3] == tuple(log.derive_messages())[1:3]
    with pytest.raises(IndexError):
        view[len(view)]
    with pytest.raises(TypeError):
        view[0] = view[1]  # type: ignore[index]
    assert hash(view) == hash(tuple(view))


def test_L13_history_view_compares_by_content() -> None:
    log = new_log()
    for text in ("a", "b"):
        log.commit("user/message", user_data(text), surface_op="append")
    view = log.history(len(log.events))
    # Both typed as the Sequence they are compared as: mypy narrows *view* at each ==.
    messages: Sequence[Message] = log.derive_messages()
    as_list: Sequence[Message] = list(messages)
    assert view == messages and view == as_list
    assert view != messages[:1] and view != (*messages, messages[0])
    assert view != (messages[1], messages[0])       # same length, other order
    # What no sequence of messages equals (so mypy sees no overlap): the point here.
    assert view != 5 and view != "ab" and view != b"ab"  # type: ignore[comparison-overlap]
    assert log.history(1) == messages[:1]


def test_L13_history_view_index_past_its_end_raises_even_after_later_appends() -> None:
    log = new_log()
    log.append("user/message", user_data("u0"), surface_op="append")
    view = log.history(len(log))
    log.append("user/message", user_data("u1"), surface_op="append")
    assert [m.id for m in view] == ["u0"]
    with pytest.raises(IndexError):
        view[1]


def test_L13_history_view_repr_shows_its_messages_like_a_tuple() -> None:
    log = new_log()
    for id_ in ("u0", "u1", "u2"):
        log.append("user/message", user_data(id_), surface_op="append")
    view = log.history(len(log))
    assert repr(view) == repr(tuple(view))
    assert repr(log.events) == repr(tuple(log.events))
    assert repr(log.history(0)) == "()"


# --------------------------------------------------------------------------
# L14 seeded logs
# --------------------------------------------------------------------------


def test_L14_seed_events_are_replayed_and_restore_the_state() -> None:
    source = sample_log()
    turn_start(source, 2)
    header(source, "m7")
    step_start(source, 2, 1)
    seeded = SessionLog(source.events, clock=counting_clock())
    assert list(seeded.events) == list(source.events)
    assert (seeded.open_turn, seeded.open_step, seeded.last_turn) == (2, 1, 2)
    assert seeded.last_header == source.last_header
    assert seeded.derive_messages() == source.derive_messages()
    assert tuple(seeded.history(len(seeded))) == source.derive_messages()
    rejected(seeded, "L5", "step 2.1 is still open", lambda: step_start(seeded, 2, 2))
    chunk(seeded, 2, 1)


def test_L14_an_invalid_seed_raises_naming_the_seq() -> None:
    events = list(sample_log().events)
    events[9] = replace(events[9], data=FrozenDict({"turn": 1, "step": 3}))
    with pytest.raises(InvariantError) as info:
        SessionLog(events)
    assert info.value.rule == "L5" and "seed event at seq 9" in str(info.value)
    assert validate_events(events) == Violation(
        9, "L5", "step/end: step 1.3 does not match open step 1.1")
    assert validate_events(sample_log().events) is None


def test_L14_seed_data_given_as_plain_values_is_snapshotted() -> None:
    plain = Event("plugin/marker", 0, 1, {"items": [1]})  # type: ignore[arg-type]  # plain data on purpose
    log = SessionLog([plain])
    assert isinstance(log[0].data, FrozenDict) and log[0].data == {"items": [1]}


def test_L14_L3_a_seeded_event_whose_source_seqs_name_a_later_event_is_rejected() -> None:
    # L14: seeds are replayed through the same checks as appends, sourceEventSeqs included.
    seed = Event("user/message", 0, 1, obj(freeze(user_data("u1"))), "append", FrozenList([3]))
    with pytest.raises(InvariantError, match=r"seed event at seq 0: .*sourceEventSeqs entry 3") \
            as caught:
        SessionLog([seed])
    assert caught.value.rule == "L3"


# --------------------------------------------------------------------------
# Scenarios G1 and G2
# --------------------------------------------------------------------------


def test_G1_enclosure_context_between_turns_execution_not() -> None:
    log = new_log()
    turn_start(log, 1)
    rejected(log, "L4", "turn 1 is still open", lambda: turn_start(log, 2))
    rejected(log, "L4", "does not match open turn 1", lambda: turn_end(log, 2))

    log = new_log()
    turn_start(log, 1)
    turn_end(log, 1)
    rejected(log, "L4", "expected turn 2, got 3", lambda: turn_start(log, 3))

    log = new_log()
    user(log, "idle context", {"kind": "plugin", "plugin": "test"})
    rejected(log, "L8", "outside any open turn", lambda: steering(log, 1, "go"))
    log.append("plugin/marker", {})
    turn_start(log, 1)
    assert [e.type for e in log.events] == ["user/message", "plugin/marker", "turn/start"]


def test_G2_checks_run_before_commit_and_leave_no_trace(
        caplog: pytest.LogCaptureFixture) -> None:
    log = new_log()
    rejected(log, "L4", "expected turn 1", lambda: turn_start(log, 2))
    assert turn_start(log, 1).seq == 0  # the seq the rejected append would have had
    rejected(log, "L7", "outside any open step", lambda: tool_result(log, 1, 1, "c1"))

    between = new_log()
    user(between, "a")
    rejected(between, "L7", "outside any open turn", lambda: tool_result(
        between, 1, 1, "c1", surface_op={"op": "replace", "start": 0, "end": 0}))

    step_start(log, 1, 1)
    tool_result(log, 1, 1, "c0", error_code="TOOL_NOT_STARTED")
    tool_call(log, 1, 1, "c1")
    step_end(log, 1, 1)  # ends with c1 unresolved
    step_start(log, 1, 2)
    rejected(log, "L7", "no tool/call with callId 'c1'", lambda: tool_result(log, 1, 2, "c1"))

    def failing(_event: Event) -> None:
        raise RuntimeError("boom")

    log.subscribe(failing)
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        event = step_end(log, 1, 2)
    assert log[-1] == event and "boom" in caplog.text


# --------------------------------------------------------------------------
# Property tests: generated valid logs, and single corruptions of them
# --------------------------------------------------------------------------


class LogBuilder:
    """Builds a valid log by interpreting a list of choices (each picks an allowed action)."""

    def __init__(self) -> None:
        self.log = new_log()
        self.pending_calls: list[str] = []
        self.chunks: list[int] = []
        self.counter = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def actions(self) -> list[Callable[[int], object]]:
        log = self.log
        if log.open_turn is None:
            return [self.start_turn, self.start_turn, self.context, self.marker, self.replace]
        if log.open_step is None:
            return [self.start_step, self.start_step, self.end_turn, self.end_turn,
                    self.context, self.steer, self.todo, self.header, self.replace,
                    self.replace_result]
        actions: list[Callable[[int], object]] = [
            self.chunk, self.reply, self.call, self.not_started, self.header, self.context,
            self.end_step, self.end_step]
        if self.pending_calls:
            actions += [self.result, self.result]
        return actions

    def run(self, choices: list[int]) -> SessionLog:
        for choice in choices:
            options = self.actions()
            options[choice % len(options)](choice)
        return self.log

    def start_turn(self, choice: int) -> None:
        triggers: list[dict[str, Any]] = [{"kind": "message", "source": {"kind": "user"}},
                                          {"kind": "retry"}]
        trigger = triggers[choice % 2]
        turn_start(self.log, self.log.last_turn + 1, trigger)

    def end_turn(self, choice: int) -> None:
        turn_end(self.log, self.turn, ["completed", "aborted", "max-tokens"][choice % 3])

    @property
    def turn(self) -> int:
        assert self.log.open_turn is not None
        return self.log.open_turn

    @property
    def step(self) -> int:
        assert self.log.open_step is not None
        return self.log.open_step

    def start_step(self, _choice: int) -> None:
        last = self.log.open_step  # always None here; steps continue per turn
        assert last is None
        number = 1 + sum(1 for e in self.log.events if e.type == "step/start"
                         and e.data["turn"] == self.turn)
        step_start(self.log, self.turn, number)
        self.pending_calls, self.chunks = [], []

    def end_step(self, _choice: int) -> None:
        step_end(self.log, self.turn, self.step)

    def context(self, choice: int) -> None:
        source = {"kind": "user"} if choice % 2 else {"kind": "plugin", "plugin": "p"}
        user(self.log, self.fresh("u"), source)

    def marker(self, _choice: int) -> None:
        self.log.append("plugin/marker", {})

    def replace(self, choice: int) -> None:
        if len(self.log) == 0:
            return self.context(choice)
        start = choice % len(self.log)
        end = start + (choice // 7) % (len(self.log) - start)
        user(self.log, self.fresh("sum"), surface_op={"op": "replace", "start": start,
                                                      "end": end})

    def replace_result(self, choice: int) -> None:
        if len(self.log) == 0:
            return
        start = choice % len(self.log)
        tool_result(self.log, self.turn, 1, self.fresh("rc"),
                    surface_op={"op": "replace", "start": start, "end": start})

    def steer(self, _choice: int) -> None:
        steering(self.log, self.turn, self.fresh("s"))

    def todo(self, _choice: int) -> None:
        self.log.append("todo/write", {"todos": [{"text": "x", "done": False}]})

    def header(self, choice: int) -> None:
        header(self.log, f"m{choice % 3}", ["initial", "change", "resume"][choice % 3])

    def chunk(self, _choice: int) -> None:
        self.chunks.append(chunk(self.log, self.turn, self.step).seq)

    def reply(self, choice: int) -> None:
        content: list[dict[str, Any]] = []
        if choice % 3:
            content.append({"type": "text", "text": "t"})
        for _ in range(choice % 3):
            call_id = self.fresh("c")
            self.pending_calls.append(call_id)
            content.append({"type": "tool-call", "id": call_id, "name": "ls",
                            "arguments": "{}"})
        assistant_message(self.log, self.turn, self.step, assistant(self.fresh("a"), content),
                          self.chunks)
        self.chunks = []

    def call(self, _choice: int) -> None:
        call_id = self.fresh("c")
        self.pending_calls.append(call_id)
        tool_call(self.log, self.turn, self.step, call_id)

    def result(self, choice: int) -> None:
        call_id = self.pending_calls[choice % len(self.pending_calls)]
        # Results answer tool/call events; a call announced only in an
        # assistant message gets its tool/call first.
        calls = [e for e in self.log.events if e.type == "tool/call"
                 and e.data["callId"] == call_id]
        call_seq = calls[0].seq if calls else tool_call(self.log, self.turn, self.step,
                                                        call_id).seq
        tool_result(self.log, self.turn, self.step, call_id, seqs=[call_seq])

    def not_started(self, _choice: int) -> None:
        tool_result(self.log, self.turn, self.step, self.fresh("ns"),
                    error_code="TOOL_NOT_STARTED")


CHOICES = st.lists(st.integers(min_value=0, max_value=10_000), min_size=15, max_size=90)
PROPERTY_SETTINGS = settings(max_examples=150, deadline=None,
                             suppress_health_check=[HealthCheck.too_slow])


def build(choices: list[int]) -> SessionLog:
    return LogBuilder().run(choices)


def renumber(events: list[Event]) -> list[Event]:
    return [replace(event, seq=position) for position, event in enumerate(events)]


@PROPERTY_SETTINGS
@given(CHOICES)
def test_L14_property_generated_valid_logs_are_accepted_and_replay(choices: list[int]) -> None:
    log = build(choices)
    events = list(log.events)
    assert validate_events(events) is None
    seeded = SessionLog(events)
    assert (seeded.open_turn, seeded.open_step, seeded.last_turn, seeded.last_header) == (
        log.open_turn, log.open_step, log.last_turn, log.last_header)


@PROPERTY_SETTINGS
@given(CHOICES)
def test_L13_property_history_views_equal_the_plain_derivation(choices: list[int]) -> None:
    log = build(choices)
    for end in range(len(log) + 1):
        assert tuple(log.history(end)) == derive_history(log.events[:end]) \
            == log.derive_messages(end)


def between_turn_positions(events: list[Event]) -> list[int]:
    """Prefix lengths after which no turn is open."""
    positions = [0]
    open_turn = False
    for position, event in enumerate(events, start=1):
        if event.type == "turn/start":
            open_turn = True
        elif event.type == "turn/end":
            open_turn = False
        if not open_turn:
            positions.append(position)
    return positions


EXECUTION_EVENTS: dict[str, tuple[str, Callable[[int], dict[str, Any]]]] = {
    "assistant/chunk": ("L6", lambda t: {"turn": t, "step": 1,
                                         "chunk": {"type": "text", "text": "x"}}),
    "tool/call": ("L6", lambda t: {"turn": t, "step": 1, "callId": "c", "name": "ls"}),
    "step/start": ("L5", lambda t: {"turn": t, "step": 1}),
    "step/end": ("L5", lambda t: {"turn": t, "step": 1}),
    "todo/write": ("L8", lambda t: {"todos": []}),
    "request/header": ("L8", lambda t: {"header": {}, "reason": "initial"}),
}


@PROPERTY_SETTINGS
@given(CHOICES, st.data())
def test_L6_L8_property_execution_event_between_turns_is_rejected(
        choices: list[int], data: st.DataObject) -> None:
    events = list(build(choices).events)
    cut = data.draw(st.sampled_from(between_turn_positions(events)), label="cut")
    kind = data.draw(st.sampled_from(sorted(EXECUTION_EVENTS)), label="kind")
    rule, make = EXECUTION_EVENTS[kind]
    turn = sum(1 for e in events[:cut] if e.type == "turn/start")
    bad = Event(kind, cut, 0, FrozenDict(make(max(turn, 1))))
    violation = validate_events([*events[:cut], bad, *events[cut:]])
    assert violation is not None
    assert (violation.seq, violation.rule) == (cut, rule)
    assert "outside any open" in violation.message or "requires an open turn" in violation.message


@PROPERTY_SETTINGS
@given(CHOICES, st.data())
def test_L4_property_wrong_turn_number_is_rejected(choices: list[int],
                                                   data: st.DataObject) -> None:
    events = list(build(choices).events)
    starts = [e.seq for e in events if e.type == "turn/start"]
    if not starts:
        events = [Event("turn/start", 0, 0, FrozenDict({"turn": 1, "trigger": FrozenDict(
            {"kind": "retry"})}))]
        starts = [0]
    k = data.draw(st.sampled_from(starts), label="turn/start seq")
    turn = events[k].data["turn"]
    assert isinstance(turn, int)
    wrong = data.draw(st.sampled_from([turn - 1, turn + 1, turn + 2, 0]), label="wrong")
    events[k] = replace(events[k], data=events[k].data.set("turn", wrong))
    violation = validate_events(events)
    assert violation is not None
    assert (violation.seq, violation.rule) == (k, "L4")
    assert f"expected turn {turn}, got {wrong}" in violation.message


@PROPERTY_SETTINGS
@given(CHOICES, st.data())
def test_L6_L7_property_step_event_outside_its_step_is_rejected(
        choices: list[int], data: st.DataObject) -> None:
    """An event of a step that has already ended, appended after its step/end."""
    events = list(build(choices).events)
    ends = [e.seq for e in events if e.type == "step/end"]
    if not ends:
        return
    k = data.draw(st.sampled_from(ends), label="step/end seq")
    turn, step = events[k].data["turn"], events[k].data["step"]
    bad_kinds: list[tuple[str, str, dict[str, Any], Any]] = [
        ("assistant/chunk", "L6", {"chunk": {"type": "x"}}, None),
        ("tool/call", "L6", {"callId": "c", "name": "ls"}, None),
        ("assistant/message", "L6", {"message": assistant("late").to_json()}, "append"),
        ("tool/result", "L7", {"message": tool_result_message("c").to_json()}, "append"),
    ]
    kind, rule, extra, op = data.draw(st.sampled_from(bad_kinds), label="kind")
    bad = Event(kind, k + 1, 0, FrozenDict({"turn": turn, "step": step, **extra}), op)
    violation = validate_events(renumber([*events[: k + 1], bad, *events[k + 1:]]))
    assert violation is not None
    assert (violation.seq, violation.rule) == (k + 1, rule)


@PROPERTY_SETTINGS
@given(CHOICES, st.data())
def test_L4_L5_L6_property_reordered_boundary_is_rejected(
        choices: list[int], data: st.DataObject) -> None:
    """Swap a boundary with its neighbour: the first out-of-place event is reported."""
    events = list(build(choices).events)
    swaps: list[tuple[int, str]] = []
    for k in range(len(events) - 1):
        first, second = events[k].type, events[k + 1].type
        if first == "step/end" and second == "turn/end":
            swaps.append((k, "L4"))  # turn/end while its last step is open
        elif first == "step/start" and second in ("assistant/chunk", "assistant/message",
                                                  "tool/call"):
            swaps.append((k, "L6"))  # a step event before its step/start
        elif first == "turn/start" and second == "step/start":
            swaps.append((k, "L5"))  # step/start before its turn/start
    if not swaps:
        return
    k, rule = data.draw(st.sampled_from(swaps), label="swap")
    events[k], events[k + 1] = events[k + 1], events[k]
    violation = validate_events(renumber(events))
    assert violation is not None
    assert (violation.seq, violation.rule) == (k, rule)


def iterate(log: SessionLog) -> Iterator[Event]:
    yield from log


def test_iteration_and_indexing_agree() -> None:
    log = sample_log()
    assert list(iterate(log)) == [log[i] for i in range(len(log))]


def _l15_message(message_id: str) -> dict[str, JsonLike]:
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": "hi"}],
            "source": {"kind": "user"}}


# ---------------------------------------------------------------------------
# L15: marks and forks of a session log
# ---------------------------------------------------------------------------


def test_L15_a_fork_at_a_mark_holds_the_events_and_checker_state_there() -> None:
    log = SessionLog()
    log.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    log.append("step/start", {"turn": 1, "step": 1})
    mark = log.mark()
    log.append("step/end", {"turn": 1, "step": 1})
    log.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    fork = log.fork(mark)
    assert len(fork) == 2 and fork.open_turn == 1 and fork.open_step == 1
    assert [e.type for e in fork] == ["turn/start", "step/start"]
    fork.append("step/end", {"turn": 1, "step": 1})       # the fork goes on by itself
    assert len(log) == 4 and len(fork) == 3
    with pytest.raises(Exception, match="L4"):
        log.fork().append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})


def test_L15_a_fork_has_no_observers_and_refuses_a_foreign_mark() -> None:
    log = SessionLog()
    seen: list[str] = []
    log.subscribe(lambda event: seen.append(event.type))
    fork = log.fork()
    fork.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    assert seen == []
    longer = SessionLog()
    longer.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    with pytest.raises(ValueError, match="not a position"):
        log.fork(longer.mark())
    with pytest.raises(ValueError, match="not a position"):
        log.fork("0")  # type: ignore[arg-type]


def test_L15_a_fork_keeps_the_derived_history_at_its_mark() -> None:
    log = SessionLog()
    log.append("user/message", _l15_message("u1"), surface_op="append")
    mark = log.mark()
    log.append("user/message", _l15_message("u2"), surface_op="append")
    fork = log.fork(mark)
    assert [m.id for m in fork.history(len(fork))] == ["u1"]
    fork.append("user/message", _l15_message("u3"), surface_op="append")
    assert [m.id for m in fork.history(len(fork))] == ["u1", "u3"]
    assert [m.id for m in log.history(len(log))] == ["u1", "u2"]


def _refuse_notes(log: SessionLog, event_type: str, data: object) -> str | None:
    return "notes are refused"


def test_L15_a_fork_has_the_extension_rules_of_its_mark_not_those_registered_later() -> None:
    """L10: rules registered on the log after the mark, or on the fork, stay where they were
    registered; a rule replaced after the mark is the old one in the fork."""
    log = SessionLog()
    bare = log.mark()
    log.register_rule("x/note", _refuse_notes)
    refusing = log.mark()
    log.register_rule("x/note", lambda *_: None)          # replaced: notes allowed now
    log.register_rule("x/other", _refuse_notes)
    assert bare.rules == () and refusing.rules == (("x/note", _refuse_notes),)
    fork = log.fork(bare)
    fork.append("x/note", {})                             # no rule when the mark was taken
    fork.append("x/other", {})
    with pytest.raises(InvariantError, match="notes are refused"):
        log.fork(refusing).append("x/note", {})           # the rule of its mark
    log.fork(refusing).append("x/other", {})
    log.append("x/note", {})                              # the original keeps its own
    with pytest.raises(InvariantError, match="notes are refused"):
        log.fork().append("x/other", {})                  # no mark: the rules as they are now
    fork.register_rule("x/third", _refuse_notes)          # the fork's rules are its own
    log.append("x/third", {})
    with pytest.raises(InvariantError, match="notes are refused"):
        fork.append("x/third", {})


def test_L15_marks_with_different_rules_are_different_positions() -> None:
    log = SessionLog()
    before = log.mark()
    assert log.mark() == before and hash(log.mark()) == hash(before)
    log.register_rule("x/note", _refuse_notes)
    after = log.mark()
    assert after != before and after.length == before.length
    assert hash(after) == hash(log.mark())
