"""The JSON codec (rule E4) and the envelopes (rules E1–E3), property-based.

For every type with a JSON form: decoding the JSON text of a value gives the
value back, and encoding it again gives the same text. Malformed documents
are refused with a `CodecError`/`ValidationError` that names the path.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine.checking.strategies import (
    assistant_messages,
    cancel_causes,
    chunks,
    error_infos,
    events,
    json_values,
    live_events,
    llm_failures,
    messages,
    prompt_decisions,
    send_options,
    settle_reasons,
    tool_results,
    turn_end_reasons,
    turn_triggers,
    user_messages,
)
from machine.errors import CodecError, NotJsonCompatibleError, ValidationError
from machine.events import (
    CORE_EVENT_TYPES,
    LIVE_TYPES,
    SURFACE_TYPES,
    Event,
    LiveEvent,
    surface_op_problem,
)
from machine.jsonvalue import FrozenDict, FrozenList, freeze, thaw
from machine.vocabulary import (
    CancelCause,
    ErrorInfo,
    LlmFailure,
    Message,
    PromptDecision,
    SendOptions,
    SettleReason,
    ToolResult,
    TurnEndReason,
    TurnTrigger,
    decision_from_json,
    validate_chunk,
    validate_user_message,
)

T = TypeVar("T")


def _round_trip(value: T, encode: Callable[[T], Any], decode: Callable[[Any], T]) -> None:
    """E4: decode(json(encode(x))) == x, and the JSON text is stable."""
    text = json.dumps(encode(value), allow_nan=False)
    back = decode(json.loads(text))
    assert back == value
    assert json.dumps(encode(back), allow_nan=False) == text


# --------------------------------------------------------------------------------------------
# E4 lossless round trips, type by type
# --------------------------------------------------------------------------------------------


@given(json_values())
def test_E4_json_values_round_trip(value: Any) -> None:
    _round_trip(freeze(value), thaw, freeze)
    assert thaw(freeze(value)) == value


@given(messages())
def test_E4_messages_round_trip(message: Message) -> None:
    _round_trip(message, Message.to_json, Message.from_json)


@given(user_messages())
def test_E4_user_messages_round_trip_through_validation(message: Message) -> None:
    _round_trip(message, Message.to_json, validate_user_message)


@given(assistant_messages())
def test_E4_assistant_messages_round_trip(message: Message) -> None:
    _round_trip(message, Message.to_json, Message.from_json)


@given(send_options())
def test_E4_send_options_round_trip(options: SendOptions) -> None:
    _round_trip(options, SendOptions.to_json, SendOptions.from_json)


@given(cancel_causes())
def test_E4_cancel_causes_round_trip(cause: CancelCause) -> None:
    _round_trip(cause, CancelCause.to_json,
                lambda v: CancelCause.from_json(v, allow_disposed=True))


@given(llm_failures())
def test_E4_llm_failures_round_trip(failure: LlmFailure) -> None:
    _round_trip(failure, LlmFailure.to_json, LlmFailure.from_json)


@given(error_infos())
def test_E4_error_infos_round_trip(error: ErrorInfo) -> None:
    _round_trip(error, ErrorInfo.to_json, ErrorInfo.from_json)


@given(tool_results())
def test_E4_tool_results_round_trip(result: ToolResult) -> None:
    _round_trip(result, ToolResult.to_json, ToolResult.from_json)


@given(prompt_decisions())
def test_E4_prompt_decisions_round_trip(decision: PromptDecision) -> None:
    _round_trip(decision, lambda d: d.to_json(), decision_from_json)


@given(turn_triggers())
def test_E4_turn_triggers_round_trip(trigger: TurnTrigger) -> None:
    _round_trip(trigger, TurnTrigger.to_json, TurnTrigger.from_json)


@given(turn_end_reasons())
def test_E4_turn_end_reasons_round_trip(reason: TurnEndReason) -> None:
    _round_trip(reason, TurnEndReason.to_json, TurnEndReason.from_json)


@given(settle_reasons())
def test_E4_settle_reasons_round_trip(reason: SettleReason) -> None:
    _round_trip(reason, SettleReason.to_json, SettleReason.from_json)


@given(chunks())
def test_E4_chunks_round_trip(chunk: dict[str, Any]) -> None:
    frozen = validate_chunk(chunk)
    assert thaw(frozen) == chunk
    _round_trip(frozen, thaw, validate_chunk)


@given(events())
def test_E4_events_round_trip(event: Event) -> None:
    _round_trip(event, Event.to_json, Event.from_json)


@given(live_events())
def test_E4_live_events_round_trip(live: LiveEvent) -> None:
    _round_trip(live, LiveEvent.to_json, LiveEvent.from_json)


def test_E4_field_names_follow_the_reference() -> None:
    event = Event("tool/result", 4, 1000, FrozenDict({"turn": 1}), "append", FrozenList([3]))
    assert list(event.to_json()) == ["type", "seq", "time", "data", "surfaceOp",
                                     "sourceEventSeqs"]
    assert "time" not in event.to_json(with_time=False)
    failure = LlmFailure("m", "C", 500, 10, "r")
    assert list(failure.to_json()) == ["message", "code", "status", "providerRetryAfterMs",
                                       "requestId"]
    result = ToolResult.from_json({"content": [], "isError": True, "concludesTurn": True,
                                   "additionalContexts": [{"id": "c", "role": "user",
                                                           "content": [],
                                                           "source": {"kind": "user"}}]})
    assert set(result.to_json()) == {"content", "isError", "concludesTurn",
                                     "additionalContexts"}


# --------------------------------------------------------------------------------------------
# E4 malformed documents are refused with a path
# --------------------------------------------------------------------------------------------

_GOOD_EVENT: dict[str, Any] = {"type": "turn/start", "seq": 0, "time": 5,
                               "data": {"turn": 1, "trigger": {"kind": "retry"}}}


@pytest.mark.parametrize(("patch", "path"), [
    ({"type": ""}, "event.type"),
    ({"type": 3}, "event.type"),
    ({"seq": -1}, "event.seq"),
    ({"seq": True}, "event.seq"),
    ({"seq": 1.0}, "event.seq"),
    ({"time": "now"}, "event.time"),
    ({"time": True}, "event.time"),
    ({"time": math.nan}, "event.time"),
    ({"time": math.inf}, "event.time"),
    ({"data": []}, "event.data"),
    ({"data": {"x": math.nan}}, "event.data.x"),
    ({"surfaceOp": None}, "event.surfaceOp"),
    ({"sourceEventSeqs": None}, "event.sourceEventSeqs"),
    ({"sourceEventSeqs": [1, "2"]}, "event.sourceEventSeqs"),
    ({"sourceEventSeqs": 1}, "event.sourceEventSeqs"),
    ({"extra": 1}, "event"),
])
def test_E4_malformed_events_name_the_path(patch: dict[str, Any], path: str) -> None:
    with pytest.raises(CodecError) as info:
        Event.from_json({**_GOOD_EVENT, **patch})
    assert info.value.path == path
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("missing", ["type", "seq", "time", "data"])
def test_E4_events_need_every_envelope_field(missing: str) -> None:
    doc = dict(_GOOD_EVENT)
    del doc[missing]
    with pytest.raises(CodecError) as info:
        Event.from_json(doc, "record[7]")
    assert info.value.path == f"record[7].{missing}"


def test_E4_non_object_documents_are_refused() -> None:
    bad: Any
    for bad in ([], "x", None, 3):
        with pytest.raises(CodecError):
            Event.from_json(bad)
        with pytest.raises(CodecError):
            LiveEvent.from_json(bad)


def test_E4_nan_in_json_text_is_refused() -> None:
    """Python's json module reads NaN; the codec does not let it in."""
    doc = json.loads('{"type": "x/y", "seq": 0, "time": NaN, "data": {}}')
    with pytest.raises(CodecError, match="time"):
        Event.from_json(doc)
    doc = json.loads('{"type": "agent/status", "status": NaN}')
    with pytest.raises(CodecError) as info:
        LiveEvent.from_json(doc, "live[2]")
    assert info.value.path == "live[2].status"
    with pytest.raises(ValidationError) as vinfo:
        LlmFailure.from_json(json.loads(
            '{"message": "m", "code": "C", "providerRetryAfterMs": Infinity}'))
    assert vinfo.value.path == "failure.providerRetryAfterMs"


def test_E4_codec_paths_rebase_onto_the_callers_path() -> None:
    with pytest.raises(CodecError) as info:
        Event.from_json({**_GOOD_EVENT, "data": {"a": [1, {"b": math.inf}]}}, "line 3")
    assert info.value.path == "line 3.data.a[1].b"


@pytest.mark.parametrize(("decode", "doc"), [
    (Message.from_json, {"id": "m", "role": "user", "content": {}, "source": {"kind": "u"}}),
    (SendOptions.from_json, {"target": "next-turn", "wakeup": "yes"}),
    (CancelCause.from_json, {"kind": 1}),
    (LlmFailure.from_json, {"message": "m"}),
    (ErrorInfo.from_json, {"message": "m", "unknown": 1}),
    (ToolResult.from_json, {"content": None}),
    (decision_from_json, {"kind": "maybe"}),
    (TurnTrigger.from_json, {"kind": "message"}),
    (TurnEndReason.from_json, {"kind": "error", "step": 0}),
    (SettleReason.from_json, {"kind": "error"}),
    (validate_chunk, {"type": "finish", "kind": "nope"}),
])
def test_E4_malformed_values_name_a_path(decode: Callable[[Any], Any], doc: Any) -> None:
    with pytest.raises(ValidationError) as info:
        decode(doc)
    assert info.value.path
    assert str(info.value).startswith(info.value.path + ": ")


# The problem texts are pinned: they reach users through `turnstile log validate` verdicts.
EVENT_PROBLEMS = [
    (5, "", "must be an object {type, seq, time, data, ...}"),
    ({"type": "x", "seq": 0, "time": 0, "data": {}, "bogus": 1, "zz": 2}, "",
     "unexpected field(s) 'bogus', 'zz'"),
    ({"type": "x", "seq": 0, "time": 0}, ".data", "is missing"),
    ({"type": "user/message", "seq": 0, "time": 0, "data": {}, "surfaceOp": None}, ".surfaceOp",
     "must be omitted rather than null"),
    ({"type": "user/message", "seq": 0, "time": 0, "data": {}, "sourceEventSeqs": None},
     ".sourceEventSeqs", "must be omitted rather than null"),
    ({"type": "", "seq": 0, "time": 0, "data": {}}, ".type", "must be a non-empty string"),
]


@pytest.mark.parametrize(("value", "suffix", "problem"), EVENT_PROBLEMS)
def test_E4_V8_event_decoder_names_path_and_problem(value: Any, suffix: str, problem: str) -> None:
    with pytest.raises(CodecError) as caught:
        Event.from_json(value, "line2")
    assert (caught.value.path, caught.value.problem) == ("line2" + suffix, problem)
    assert str(caught.value) == f"line2{suffix}: {problem}"


LIVE_PROBLEMS = [
    (5, "", "must be an object with a string 'type'"),
    ({"type": 5}, "", "must be an object with a string 'type'"),
    ({"type": ""}, ".type", "must be a non-empty string"),
    ({"type": "x", "a": float("nan")}, ".a", "nan is not a finite number"),
    ({"type": "x", "a": [1, {2: 3}]}, ".a[1]", "key 2 is not a string"),
]


@pytest.mark.parametrize(("value", "suffix", "problem"), LIVE_PROBLEMS)
@pytest.mark.parametrize("path", [None, "out3"])
def test_E3_E4_live_decoder_names_path_and_problem(value: Any, suffix: str, problem: str,
                                                   path: str | None) -> None:
    with pytest.raises(CodecError) as caught:
        if path is None:
            LiveEvent.from_json(value)
        else:
            LiveEvent.from_json(value, path)
    assert (caught.value.path, caught.value.problem) == ((path or "live") + suffix, problem)


# --------------------------------------------------------------------------------------------
# E1 durable envelope; E2 surface types; E3 live notifications
# --------------------------------------------------------------------------------------------


def test_E1_core_catalog() -> None:
    assert {
        "turn/start", "turn/end", "step/start", "step/end", "user/message", "steering/message",
        "assistant/chunk", "assistant/message", "tool/call", "tool/result", "todo/write",
        "request/header",
    } == CORE_EVENT_TYPES


def test_E1_events_snapshot_their_data() -> None:
    data: dict[str, Any] = {"turn": 1, "list": [1]}
    seqs = [0]
    event = Event("user/message", 1, 2.5, data, "append", seqs)  # type: ignore[arg-type]
    data["turn"] = 2
    data["list"].append(2)
    seqs.append(1)
    assert event.data == {"turn": 1, "list": [1]}
    assert isinstance(event.data, FrozenDict)
    assert event.source_event_seqs == [0]
    with pytest.raises(AttributeError):
        event.seq = 3  # type: ignore[misc]


class _Type(str):
    """A str subclass given as an event type."""


@pytest.mark.parametrize("type_", [_Type("x-ext/marker"), "x-ext/märker"])
def test_E1_V23_an_event_type_is_kept_as_plain_text(type_: str) -> None:
    event = Event(type_, 0, 0, {})  # type: ignore[arg-type]
    assert event.type == type_ and type(event.type) is str


@pytest.mark.parametrize(("args", "path"), [
    (("", 0, 0, {}), "event.type"),
    (("x/y", -1, 0, {}), "event.seq"),
    (("x/y", 0, math.nan, {}), "event.time"),
    (("x/y", 0, 0, []), "event.data"),
    (("x/y", 0, 0, {"s": {1}}), "event.data.s"),
])
def test_E1_event_construction_checks_the_shape(args: tuple[Any, ...], path: str) -> None:
    with pytest.raises(ValidationError) as info:
        Event(*args)
    assert info.value.path == path


def test_E1_V8_event_field_problems_are_named() -> None:
    with pytest.raises(ValidationError) as caught:
        Event("x/extension", -1, 0, FrozenDict())
    assert (caught.value.path, caught.value.problem) == ("event.seq", "must be a non-negative integer")
    with pytest.raises(ValidationError) as caught:
        Event("user/message", 1, 0, FrozenDict(), "append", [0, {1}])  # type: ignore[arg-type]
    assert (caught.value.path, caught.value.problem) == ("event.sourceEventSeqs[1]",
                                                         "a set is not JSON-compatible")


@given(events())
def test_E2_generated_envelopes_put_surface_ops_exactly_on_surface_types(event: Event) -> None:
    if event.type in SURFACE_TYPES:
        assert event.is_surface
        assert surface_op_problem(event.surface_op) is None
    else:
        assert event.surface_op is None and event.source_event_seqs is None


@pytest.mark.parametrize(("op", "ok"), [
    ("append", True),
    ({"op": "replace", "start": 0, "end": 0}, True),
    ({"op": "replace", "start": 2, "end": 5}, True),
    ({"op": "replace", "start": 5, "end": 2}, False),
    ({"op": "replace", "start": -1, "end": 2}, False),
    ({"op": "replace", "start": 1.0, "end": 2}, False),
    ({"op": "replace", "start": 1}, False),
    ({"op": "insert", "start": 1, "end": 2}, False),
    ("replace", False),
    (None, False),
])
def test_E2_surface_op_shape(op: Any, ok: bool) -> None:
    assert (surface_op_problem(freeze(op)) is None) is ok


def test_E3_live_catalog() -> None:
    assert {
        "agent/status", "agent/inbox/enqueue", "agent/inbox/dequeue", "agent/inbox/discard",
        "agent/context/discard", "agent/cancel-requested", "agent/settled", "agent/error",
        "agent/warning", "agent/session-start", "agent/created", "agent/disposed",
        "session/created", "session/disposed",
    } == LIVE_TYPES


def test_E3_live_payload_is_a_snapshot_without_a_type_field() -> None:
    payload: dict[str, Any] = {"messages": [{"id": "m"}]}
    live = LiveEvent("agent/inbox/discard", payload)  # type: ignore[arg-type]
    payload["messages"].append({"id": "n"})
    assert live.payload == {"messages": [{"id": "m"}]}
    assert live.to_json() == {"type": "agent/inbox/discard", "messages": [{"id": "m"}]}
    with pytest.raises(ValidationError) as info:
        LiveEvent("agent/status", {"type": "x"})  # type: ignore[arg-type]
    assert info.value.path == "live.payload.type"
    with pytest.raises(NotJsonCompatibleError):
        LiveEvent("agent/status", {"status": {"idle"}})  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        LiveEvent("", {})  # type: ignore[arg-type]


def test_E3_V8_live_payload_that_is_not_a_mapping_is_named() -> None:
    with pytest.raises(ValidationError) as caught:
        LiveEvent("agent/status", [1])  # type: ignore[arg-type]
    assert (caught.value.path, caught.value.problem) == ("live.payload", "must be a mapping")


@given(live_events())
def test_E3_generated_live_events_are_catalogued(live: LiveEvent) -> None:
    assert live.type in LIVE_TYPES
    assert "type" not in live.payload


@given(st.data())
def test_E4_round_trip_of_values_inside_envelopes(data: st.DataObject) -> None:
    """Vocabulary values embedded in event data decode back to themselves."""
    reason = data.draw(turn_end_reasons())
    trigger = data.draw(turn_triggers())
    end = Event("turn/end", 9, 0, FrozenDict({"turn": 2, "reason": reason.to_json()}))
    start = Event("turn/start", 8, 0, FrozenDict({"turn": 2, "trigger": trigger.to_json()}))
    end_back = Event.from_json(json.loads(json.dumps(end.to_json())))
    start_back = Event.from_json(json.loads(json.dumps(start.to_json())))
    assert TurnEndReason.from_json(end_back.data["reason"]) == reason
    assert TurnTrigger.from_json(start_back.data["trigger"]) == trigger


def test_E4_the_library_does_not_import_hypothesis() -> None:
    code = ("import sys, machine.errors, machine.jsonvalue, machine.vocabulary, "
            "machine.events; assert 'hypothesis' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)
