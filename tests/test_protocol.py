"""The embedding protocol (specs/protocol.md, rules P1–P16): pulling outputs, completions of
released streams, the configuration, chunk folding and minted ids, request headers; and, driven
on the machine and the reference model alike, observer positions (P2), commands (P3), effects
(P4), control outputs (P5), buffered completions (P6), cancel and its notice (P7), the order of
outputs (P8), the JSON forms of inputs (P9), observers that fail (P14) and internal yields (P15).

Internal failures (P16) are tested in tests/test_internal_failures.py.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

import pytest
from scenario_helpers import Scenario, assert_failed_step, at, both, core_on, msg, obj, scenario

from machine.checking.scripted import Driver, ScriptedEnvironment, calls_reply, model_failure, ok_result
from machine.core import AgentCore, CoreConfig, state_of
from machine.core.records import NO_ROUTE_MESSAGE
from machine.errors import ProtocolError, ValidationError
from machine.io import Append, Control, Durable, Effect, Live, Observer, Output, input_from_json
from machine.jsonvalue import FrozenDict, JsonLike, thaw
from machine.vocabulary import ErrorInfo, minted_id

CONFIG = {"provider": "p", "model": "m"}


def _reason(s: Scenario) -> dict[str, object]:
    (turn_end,) = s.of("turn/end")
    reason: dict[str, object] = thaw(obj(turn_end.data["reason"]))
    return reason


# --------------------------------------------------------------------------
# P1 outputs are pulled one at a time
# --------------------------------------------------------------------------


def test_P1_drain_outputs_pulls_everything_available_in_order() -> None:
    core = AgentCore()
    outputs = core.drain_outputs()
    assert [o.event.type for o in outputs] == [  # type: ignore[union-attr]
        "session/created", "agent/created", "agent/session-start"]
    assert core.drain_outputs() == []
    core.followup(msg("hi"))
    kinds = [type(o).__name__ for o in core.drain_outputs()]
    assert kinds == ["Effect", "Live"]


# --------------------------------------------------------------------------
# P10 protocol errors: completing a released stream (P5)
# --------------------------------------------------------------------------


def _held_model_stream() -> tuple[Scenario, Effect]:
    """A turn whose model request is outstanding, and that request."""
    s = Scenario()
    s.hold("model")
    s.followup("go")
    s.run()
    return s, s.take("model")


def test_P10_a_completion_of_a_released_model_stream_is_refused() -> None:
    s, model = _held_model_stream()
    s.core.chunk(model.id, {"type": "text"})           # invalid chunk: the stream is released
    s.run()
    assert "release" in [o.kind for o in s.outputs if isinstance(o, Control)]
    with pytest.raises(ProtocolError, match=r"already completed"):
        s.core.chunk(model.id, {"type": "text", "text": "late"})
    with pytest.raises(ProtocolError, match=r"already completed"):
        s.core.end(model.id)


def test_P10_completed_never_requested_and_outstanding_ids_are_told_apart_at_the_bounds() -> None:
    s, model = _held_model_stream()
    issued = model.id + 1                               # ids are issued in order from 0
    for never in (-1, issued, issued + 10):
        with pytest.raises(ProtocolError, match=r"was never requested"):
            s.core.resolve(never, None)
    for done in range(model.id):                        # every earlier effect was answered
        with pytest.raises(ProtocolError, match=r"already completed"):
            s.core.resolve(done, None)
    s.core.chunk(model.id, {"type": "text-delta", "text": "x"})   # still outstanding
    s.core.end(model.id)
    with pytest.raises(ProtocolError, match=r"already completed"):
        s.core.end(model.id)


def test_P10_the_core_keeps_no_record_per_completed_effect() -> None:
    """Refusing a late completion needs no memory of each one (ids are issued in order):
    after many turns, no part of the core's state but the log has grown with them."""
    s = Scenario()
    for index in range(300):
        s.followup(f"turn {index}")
        s.run()
    assert s.core.status == "idle"
    sizes = {name: len(value) for name, value in vars(state_of(s.core)).items()
             if name != "log" and hasattr(value, "__len__") and not isinstance(value, str)}
    assert max(sizes.values()) < 10, sizes


# --------------------------------------------------------------------------
# P11 configuration: CoreConfig validates at construction (V8)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("tool_modes", [["t"], "exclusive", None])
def test_P11_V8_tool_modes_that_is_not_a_mapping_raises_ValidationError_naming_it(tool_modes: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        CoreConfig(tool_modes=tool_modes)
    assert raised.value.path == "config.tool_modes"
    assert str(raised.value) == "config.tool_modes: must be a mapping of tool name to mode"


def test_P11_tool_modes_accepts_exclusive_and_parallel() -> None:
    config = CoreConfig(tool_modes={"e": "exclusive", "p": "parallel"})
    assert dict(config.tool_modes) == {"e": "exclusive", "p": "parallel"}
    s = Scenario(calls_reply(("c1", "e"), ("c2", "p")), "done", config=config)
    s.followup("go")
    s.run()
    assert s.reasons() == ["completed"]
    assert [e.data["callId"] for e in s.of("tool/call")] == ["c1", "c2"]
    s.check()


@pytest.mark.parametrize("publish", [1, "true", None])
def test_P11_V8_publish_that_is_not_a_bool_raises_ValidationError_naming_it(publish: Any) -> None:
    with pytest.raises(ValidationError) as raised:
        CoreConfig(publish=publish)
    assert raised.value.path == "config.publish"
    assert str(raised.value) == "config.publish: must be a bool"


# --------------------------------------------------------------------------
# P12 folding chunks and minting ids
# --------------------------------------------------------------------------

BAD_CHUNKS = [
    ({"type": "reasoning"}, "invalid chunk: a reasoning chunk needs a string 'text'"),
    ({"type": "text", "text": 5}, "invalid chunk: a text chunk needs a string 'text'"),
    ({"type": "tool-call", "name": "t", "arguments": "{}"},
     "invalid chunk: a tool-call chunk needs a non-empty string 'id'"),
    ({"type": "tool-call", "id": "", "name": "t", "arguments": "{}"},
     "invalid chunk: a tool-call chunk needs a non-empty string 'id'"),
    ({"type": "tool-call", "id": "c1", "arguments": "{}"},
     "invalid chunk: a tool-call chunk needs a string 'name'"),
    ({"type": "tool-call", "id": "c1", "name": "t", "arguments": {}},
     "invalid chunk: a tool-call chunk needs 'arguments', JSON text (a string)"),
    ({"type": "tool-call", "id": "c1", "name": "t"},
     "invalid chunk: a tool-call chunk needs 'arguments', JSON text (a string)"),
    ({"type": "block", "block": {"type": ""}},
     "invalid chunk: a content block needs a non-empty string 'type'"),
    ({"type": "block"}, "invalid chunk: a block chunk needs a 'block'"),
]


@pytest.mark.parametrize(("chunk", "message"), BAD_CHUNKS)
def test_P12_R9_7_invalid_content_chunk_fails_the_turn_with_INVALID_CHUNK(chunk: Any, message: str) -> None:
    s = Scenario([chunk, {"type": "finish", "kind": "stop"}])
    s.followup("go")
    s.run()
    assert _reason(s) == {"kind": "error", "step": 1, "message": message, "code": "INVALID_CHUNK"}
    assert s.of("assistant/chunk") == [] and s.of("assistant/message") == []
    s.check()


def test_P12_only_block_chunks_add_their_block() -> None:
    s = Scenario([{"type": "text", "text": "hi", "block": {"type": "text", "text": "x"}},
                  {"type": "usage", "usage": {}, "block": {"type": "text", "text": "y"}},
                  {"type": "block", "block": {"type": "image", "url": "u"}},
                  {"type": "finish", "kind": "stop"}])
    s.followup("go")
    s.run()
    message = obj(s.of("assistant/message")[0].data["message"])
    assert thaw(message["content"]) == [
        {"type": "text", "text": "hi"}, {"type": "image", "url": "u"}]
    s.check()


def test_P12_an_embedder_supplied_mint_id_names_the_minted_messages() -> None:
    minted: list[tuple[str, int]] = []

    def mint(kind: str, seq: int) -> str:
        minted.append((kind, seq))
        return f"mine-{kind}-{seq}"

    s = Scenario(calls_reply(("c1", "t")), "done")
    s.core = AgentCore(CoreConfig(), mint_id=mint)
    s.driver = Driver(s.core, s.env)
    s.followup("go")
    s.run()
    assistant = [e for e in s.core.log if e.type == "assistant/message"]
    (result,) = [e for e in s.core.log if e.type == "tool/result"]
    assert [at(e.data, "message", "id") for e in assistant] == [
        f"mine-assistant-{e.seq}" for e in assistant]
    assert at(result.data, "message", "id") == f"mine-tool-result-{result.seq}"
    assert minted == sorted(minted, key=lambda pair: pair[1]) and len(minted) == 3


class _Minted(str):
    """A str subclass a mint may return."""


def test_P12_V23_a_minted_id_is_a_plain_non_empty_string() -> None:
    minted = minted_id(lambda kind, seq: _Minted(f"{kind}-{seq}"), "assistant", 3)
    assert minted == "assistant-3" and type(minted) is str
    with pytest.raises(ValidationError) as refused:
        minted_id(lambda kind, seq: "", "assistant", 3)
    assert str(refused.value) == "mint_id: returned an empty string"


# --------------------------------------------------------------------------
# P13 request headers (R9.6): validation, and the RequestConfigError of R15.4
# --------------------------------------------------------------------------


def _header_scenario(header: Any) -> Scenario:
    s = Scenario("never streamed")
    s.handle("request", lambda _e: ("resolve", header))
    s.followup("go")
    s.run()
    return s


def _assert_request_config_error(s: Scenario, message: str) -> None:
    """R9.6 / P13 / R15.3-R15.4: a generic failure of request preparation, coded
    INVALID_REQUEST_CONFIG, with the RequestConfigError the core builds; no header logged,
    no model call."""
    assert_failed_step(s, "RequestConfigError", "INVALID_REQUEST_CONFIG", message)
    assert s.of("request/header") == []
    assert s.effects("model") == []
    s.check()


@pytest.mark.parametrize(("header", "message"), [
    ({"config": {**CONFIG, "temperature": float("nan")}},
     "header.config.temperature: nan is not a finite number"),
    ({"config": CONFIG, "tools": [{"name": "t", "schema": {1: "x"}}]},
     "header.tools[0].schema: key 1 is not a string"),
])
def test_P13_R15_4_a_header_that_is_not_json_fails_with_RequestConfigError_naming_the_field(
        header: Any, message: str) -> None:
    _assert_request_config_error(_header_scenario(header), message)


@pytest.mark.parametrize("header", [
    "p/m",
    ["config"],
    None,
    {},
    {"system": "s"},
    {"config": "p/m"},
    {"config": ["p", "m"]},
])
def test_P13_R9_6_a_header_that_is_not_a_mapping_with_a_config_mapping_fails(header: Any) -> None:
    _assert_request_config_error(_header_scenario(header),
                                 "the request header must be a mapping {config, system?, tools?}")


def test_P13_R9_6_a_header_field_other_than_config_system_tools_fails_naming_it() -> None:
    header = {"config": CONFIG, "system": "be brief", "tools": [], "temperature": 0.5}
    _assert_request_config_error(_header_scenario(header),
                                 "unexpected header field(s) ['temperature']")


def test_P13_R9_6_the_header_fields_config_system_and_tools_are_accepted() -> None:
    header = {"config": CONFIG, "system": "be brief", "tools": [{"name": "t"}]}
    s = _header_scenario(header)
    (logged,) = s.of("request/header")
    assert thaw(logged.data["header"]) == header
    assert s.reasons() == ["completed"]
    s.check()


@pytest.mark.parametrize("policy", [{"mode": "always", "initialDelayMs": 500}, None, "fast", 3])
def test_P13_R9_6_the_resolution_s_retry_policy_is_not_part_of_the_header(policy: Any) -> None:
    """R9.6: a retryPolicy beside the header is the prepared request's, any JSON value; it is
    never logged, never in the model effect, and a value that is not JSON fails like any
    other part of the resolution."""
    header = {"config": CONFIG, "system": "be brief"}
    s = _header_scenario({**header, "retryPolicy": policy})
    (logged,) = s.of("request/header")
    assert thaw(logged.data["header"]) == header
    assert [thaw(e.payload["header"]) for e in s.effects("model")] == [header]
    assert s.reasons() == ["completed"]
    s.check()


def test_P13_R9_6_a_retry_policy_that_is_not_json_fails_naming_it() -> None:
    _assert_request_config_error(_header_scenario({"config": CONFIG, "retryPolicy": {1.5}}),
                                 "header.retryPolicy: a set is not JSON-compatible")


@pytest.mark.parametrize("config", [
    {"provider": "", "model": "m"},
    {"model": "m"},
    {"provider": None, "model": "m"},
    {"provider": False, "model": "m"},
    {"provider": 0, "model": "m"},
    {"provider": "p", "model": ""},
    {"provider": "p"},
    {"provider": "p", "model": 0.0},
])
def test_P13_R9_6_a_config_missing_provider_or_model_fails_with_the_uncoded_error_of_the_original(
        config: Any) -> None:
    """R9.6 step 3, P13, R15.3: what the original's ``!config.provider || !config.model``
    counts as missing fails request preparation with an uncoded error named Error."""
    s = _header_scenario({"config": config})
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"]) == {"kind": "error", "step": 1,
                                             "message": NO_ROUTE_MESSAGE}
    (error,) = s.live("agent/error")
    assert thaw(error["error"]) == {"name": "Error", "message": NO_ROUTE_MESSAGE}
    assert not s.of("request/header")


@pytest.mark.parametrize(("config", "key"), [
    ({"provider": 5, "model": "m"}, "provider"),
    ({"provider": True, "model": "m"}, "provider"),
    ({"provider": "p", "model": ["m"]}, "model"),
    ({"provider": "p", "model": {"id": "m"}}, "model"),
])
def test_P13_R9_6_a_provider_or_model_that_is_not_a_string_is_INVALID_REQUEST_CONFIG(
        config: Any, key: str) -> None:
    """D5: values the original would let through (truthy non-strings) are refused, coded."""
    _assert_request_config_error(_header_scenario({"config": config}),
                                 f"the request config's {key} must be a string")


# ==========================================================================
# Rules P2-P9, P14 and P15, each driven on the machine (`AgentCore`) and on the reference
# model (`ModelAgent`) with the same inputs: both must show the behaviour the rule states.
# ==========================================================================

def _json(outputs: Sequence[Output]) -> list[dict[str, JsonLike]]:
    return [o.to_json(with_time=False) if isinstance(o, Durable) else o.to_json() for o in outputs]


def _answer(core: AgentCore, env: ScriptedEnvironment, effect: Effect) -> None:
    """Answer *effect* the way the scripted driver does."""
    answer = env.answer(effect)
    if effect.kind == "model":
        if isinstance(answer, ErrorInfo):
            core.fail(effect.id, answer)
        else:
            for chunk in cast(Sequence[JsonLike], answer):
                core.chunk(effect.id, chunk)
            core.end(effect.id)
        return
    verb, value = cast(tuple[str, Any], answer)
    if verb == "raise":
        core.fail(effect.id, value)
    else:
        core.resolve(effect.id, value)


def _pull_by_hand(core: AgentCore, at: Callable[[Output], bool], feed: Callable[[], None]
                  ) -> list[Output]:
    """Pull outputs one at a time, answering effects in request order, and call *feed* between
    the pull of the first output *at* accepts and the pull of the next one."""
    env = ScriptedEnvironment()
    outputs: list[Output] = []
    pending: list[Effect] = []
    fed = False
    while True:
        output = core.next_output()
        if output is None:
            if not pending:
                return outputs
            _answer(core, env, pending.pop(0))
            continue
        outputs.append(output)
        if isinstance(output, Effect):
            pending.append(output)
        if not fed and at(output):
            fed = True
            feed()


# --------------------------------------------------------------------------
# P2 observer positions
# --------------------------------------------------------------------------


def _is_turn_start(output: Output) -> bool:
    return isinstance(output, Durable) and output.event.type == "turn/start"


@both
def test_P2_an_input_fed_after_output_k_is_what_an_observer_of_k_issuing_it_does(impl: str) -> None:
    def commands(core: AgentCore) -> None:
        core.steer(msg("steer", id="s"))
        core.inject(msg("context", "plugin:p", id="c"))
        core.steer(msg("steer again", id="s2"))

    by_hand = core_on(impl)
    by_hand.followup(msg("go", id="g"))
    fed = _pull_by_hand(by_hand, _is_turn_start, lambda: commands(by_hand))
    observed = core_on(impl)
    driver = Driver(observed)
    driver.on_event("turn/start", lambda _d: commands(observed), once=True)
    observed.followup(msg("go", id="g"))
    driver.run()
    assert _json(fed) == _json(driver.outputs)
    # commands issued at one position take effect in the order issued
    texts = [str(thaw(e.data)["content"][0]["text"]) if e.type == "user/message"
             else str(thaw(e.data["message"])["content"][0]["text"])
             for e in by_hand.log.events if e.type in ("user/message", "steering/message")]
    assert texts == ["go", "steer", "context", "steer again"]


@both
def test_P2_an_input_fed_one_output_later_acts_at_that_later_position(impl: str) -> None:
    core = core_on(impl)
    core.followup(msg("go", id="g"))
    fed = _pull_by_hand(core, lambda o: isinstance(o, Durable) and o.event.type == "turn/end",
                        lambda: core.steer(msg("late", id="late")))
    enqueued = [thaw(o.event.payload) for o in fed
                if isinstance(o, Live) and o.event.type == "agent/inbox/enqueue"]
    assert [p["placement"] for p in enqueued] == ["queued", "queued"]   # the window was closed


# --------------------------------------------------------------------------
# P3 commands change state at once and never advance the loop
# --------------------------------------------------------------------------


@both
def test_P3_a_command_updates_the_routing_state_at_once_and_queues_only_its_own_outputs(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("step")
    s.followup("go")
    s.run()
    s.steer("more")
    s.inject("context")
    assert (s.core.pending_steering, s.core.pending_context) == (1, 1)
    outputs = s.core.drain_outputs()
    assert [o.event.type for o in outputs if isinstance(o, Live)] == ["agent/inbox/enqueue"]
    assert len(outputs) == 1                          # the loop did not move: no {system-prompt}
    with pytest.raises(ValidationError):
        s.core.steer({"id": "", "role": "user"})
    assert (s.core.pending_steering, s.core.pending_context) == (1, 1)
    assert s.core.drain_outputs() == []


# --------------------------------------------------------------------------
# P4 effects: ids and payloads
# --------------------------------------------------------------------------

PAYLOAD_KEYS = {
    "tick": {"purpose"},
    "prompt-submit": {"message", "signal"},
    "step": {"turn", "step", "signal"},
    "system-prompt": {"turn", "step", "signal"},
    "request": {"turn", "step", "signal", "config", "system"},
    "model": {"turn", "step", "signal", "header", "historyEnd"},
    "tool-prepare": {"turn", "step", "signal", "callId", "name", "arguments"},
    "tool-execute": {"turn", "step", "signal", "callId", "name", "arguments"},
    "tool-finalize": {"turn", "step", "signal", "callId", "name", "arguments", "result"},
    "turn-stopping": {"turn", "signal"},
    "request-error": {"turn", "step", "signal", "error", "failure", "priorFailures"},
    "flush": {"turn"},
}


@both
def test_P4_effects_carry_fresh_ids_in_request_order_and_the_payload_of_their_kind(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done", model_failure("overloaded", "E_BUSY"))
    s.followup("go")
    s.followup("again")
    s.run()
    effects = s.effects()
    assert [e.id for e in effects] == list(range(len(effects)))
    assert {e.kind for e in effects} == set(PAYLOAD_KEYS)
    for effect in effects:
        assert set(effect.payload) == PAYLOAD_KEYS[effect.kind], effect.kind


# --------------------------------------------------------------------------
# P5 control outputs
# --------------------------------------------------------------------------


def _streaming(impl: str) -> tuple[Scenario, Effect]:
    s = scenario(impl)
    s.hold("model")
    s.followup("go")
    s.run()
    return s, s.take("model")


def _controls(s: Scenario) -> list[str]:
    return [o.kind for o in s.outputs if isinstance(o, Control)]


@both
def test_P5_a_stream_the_core_stops_consuming_is_released_and_its_later_completions_refused(
        impl: str) -> None:
    s, model = _streaming(impl)
    s.cancel()
    s.cancel("parent")                                # a second cause: no second abort
    s.core.chunk(model.id, {"type": "text", "text": "consumed after the abort"})
    s.run()
    assert _controls(s) == ["abort", "release"]
    release = [o for o in s.outputs if isinstance(o, Control) and o.kind == "release"]
    assert thaw(release[0].payload) == {"effect": model.id}
    assert model.id not in s.core.outstanding_effects
    with pytest.raises(ProtocolError):
        s.core.end(model.id)
    assert s.of("assistant/chunk") == []


@both
def test_P5_a_stream_that_had_already_ended_is_not_released(impl: str) -> None:
    s, model = _streaming(impl)
    s.core.chunk(model.id, {"type": "text", "text": "buffered"})
    s.core.end(model.id)
    s.cancel()                                        # before the loop consumes the chunk
    s.run()
    assert _controls(s) == ["abort"]
    assert s.of("assistant/chunk") == [] and s.reasons() == ["aborted"]


# --------------------------------------------------------------------------
# P6 completions are buffered and consumed lazily
# --------------------------------------------------------------------------


@both
def test_P6_a_command_fed_after_a_completion_takes_effect_before_the_loop_consumes_it(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("flush")
    s.followup("one")
    s.run()
    flush = s.take("flush")
    s.core.resolve(flush.id)
    s.followup("two")                                 # still busy: the flush is not consumed
    assert not s.core.wake_pending
    s.run()
    assert [e.payload["purpose"] for e in s.effects("tick")] == ["wake"]
    assert s.turn_numbers() == [1, 2] and s.statuses() == ["running", "idle"]


@both
def test_P6_a_completion_value_is_taken_as_it_is_at_the_call(impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")))
    s.hold("tool-execute")
    s.followup("go")
    s.run()
    result = ok_result("as resolved")
    s.core.resolve(s.take("tool-execute").id, result)
    result["content"] = [{"type": "text", "text": "mutated"}]
    s.run()
    (logged,) = s.of("tool/result")
    assert thaw(logged.data["message"])["content"][0]["content"] == [
        {"type": "text", "text": "as resolved"}]


# --------------------------------------------------------------------------
# P7 cancel and the observers of agent/cancel-requested
# --------------------------------------------------------------------------


@both
def test_P7_input_accepted_at_the_notice_is_cleared_into_the_reports_after_its_own_outputs(
        impl: str) -> None:
    s = scenario(impl)
    s.hold("step")
    s.followup("go")
    s.run()
    s.followup("queued before")
    s.observe("agent/cancel-requested", lambda _d: s.followup("at the notice"), once=True)
    s.cancel()
    s.followup("after the cancel returned")           # before the notice is pulled: kept
    s.resolve("step")
    trace = s.trace("*", "*", controls=True)
    assert trace[trace.index("cancel-req(user)"):][:5] == [
        "cancel-req(user)", "enq(at the notice,q)", "disc[queued before,at the notice]",
        "abort(user)", "enq(after the cancel returned,q)"]
    assert s.user_texts()[-1] == "after the cancel returned"


@both
def test_P7_a_cancel_joined_at_the_notice_with_nothing_new_to_clear_does_nothing(impl: str) -> None:
    s = scenario(impl)
    s.hold("step")
    s.followup("go")
    s.run()
    s.observe("agent/cancel-requested", lambda _d: s.cancel("parent"))   # on every notice
    s.cancel()
    s.resolve("step")
    assert s.live_tokens("agent/cancel-requested") == ["cancel-req(user)"]
    assert s.reasons() == ["aborted"]


# --------------------------------------------------------------------------
# P8 order of outputs
# --------------------------------------------------------------------------


@both
def test_P8_a_commands_outputs_come_before_the_loops_next_and_durable_ones_in_seq_order(
        impl: str) -> None:
    s = scenario(impl, calls_reply(("c1", "t")), "done", "after the steer")
    marks: list[int] = []
    reacted: set[str] = set()

    def react(output: Output) -> None:
        if (isinstance(output, Durable) and output.event.type in ("assistant/message", "tool/call")
                and output.event.type not in reacted):
            reacted.add(output.event.type)
            marks.append(len(s.outputs))
            s.inject("staged")
            s.core.append("x-test/mark", {"n": len(marks)})
            s.steer("steer")
    s.on_output(react)
    s.followup("go")
    s.run()
    for mark in marks:                                # the next outputs are the commands' own
        following = s.outputs[mark:mark + 2]
        assert isinstance(following[0], Durable) and following[0].event.type == "x-test/mark"
        assert isinstance(following[1], Live) and following[1].event.type == "agent/inbox/enqueue"
    seqs = [o.event.seq for o in s.outputs if isinstance(o, Durable)]
    assert seqs == list(range(len(s.events)))


# --------------------------------------------------------------------------
# P9 JSON forms of inputs
# --------------------------------------------------------------------------


def _completion(effect: Effect) -> list[dict[str, JsonLike]]:
    """The JSON inputs completing *effect* in the P9 script: a model call streams two chunks
    and ends; turn-stopping raises; prompt-submit allows; request resolves a header."""
    if effect.kind == "model":
        return [{"in": "chunk", "effect": effect.id, "chunk": {"type": "text", "text": "hi"}},
                {"in": "chunk", "effect": effect.id, "chunk": {"type": "finish", "kind": "stop"}},
                {"in": "end", "effect": effect.id}]
    if effect.kind == "turn-stopping" and effect.payload["turn"] == 1:
        error = ErrorInfo("stop", "HookError", "E_STOP")
        return [{"in": "raise", "effect": effect.id, "error": error.to_json()}]
    value: JsonLike = {"prompt-submit": {"kind": "allow"},
                       "request": {"config": {"provider": "p", "model": "m"}}}.get(effect.kind)
    return [{"in": "resolve", "effect": effect.id, "value": value}]


def _call(core: AgentCore, value: dict[str, JsonLike]) -> None:
    """What *value*, an input in its JSON form, asks for, done by calling the method."""
    kind = value["in"]
    effect = value.get("effect")
    if kind == "send":
        core.send(value["message"], value["options"])
    elif kind in ("followup", "steer", "inject"):
        getattr(core, str(kind))(value["message"])
    elif kind == "cancel":
        core.cancel(value["cause"], keep_inbox=bool(value.get("keepInbox", False)))
    elif kind == "dispose":
        core.dispose()
    elif kind == "append":
        core.append(str(value["type"]), value["data"])
    elif kind == "resolve":
        core.resolve(cast(int, effect), value["value"])
    elif kind == "raise":
        core.fail(cast(int, effect), ErrorInfo.from_json(value["error"]))
    elif kind == "chunk":
        core.chunk(cast(int, effect), value["chunk"])
    elif kind == "end":
        core.end(cast(int, effect))
    else:
        assert kind == "observer"                     # P14: nothing for the core to do


@both
def test_P9_an_append_input_carries_its_surface_op_and_its_sources(impl: str) -> None:
    """P9: ``feed(Append(...))`` is ``append(...)`` with every field: the surface operation
    and the source event seqs reach the event."""
    core = core_on(impl)
    core.feed(Append("user/message", msg("first", id="u1"), surface_op="append"))
    core.feed(Append("user/message", msg("second", id="u2"), surface_op="append",
                     source_event_seqs=(0,)))
    event = core.log[-1]
    assert (event.surface_op, list(event.source_event_seqs or ())) == ("append", [0])


@both
def test_P9_every_input_in_its_json_form_does_what_the_call_does(impl: str) -> None:
    commands: list[dict[str, JsonLike]] = [
        {"in": "send", "message": msg("go", id="g"),
         "options": {"target": "next-turn", "wakeup": False}},
        {"in": "inject", "message": msg("ctx", "plugin:p", id="i")},
        {"in": "append", "type": "x-test/mark", "data": {"n": 1}},
        {"in": "followup", "message": msg("follow", id="f")},
        {"in": "observer", "action": "throw"},
    ]
    at_the_second_flush: list[dict[str, JsonLike]] = [
        {"in": "steer", "message": msg("steer", id="s")},
        {"in": "cancel", "cause": {"kind": "user"}, "keepInbox": True},
        {"in": "dispose"},
    ]

    def run(as_json: bool) -> list[dict[str, JsonLike]]:
        core = core_on(impl)

        def give(value: dict[str, JsonLike]) -> None:
            if as_json:
                core.feed(input_from_json(value))
            else:
                _call(core, value)
        outputs = core.drain_outputs()
        for command in commands:
            give(command)
        answered: set[int] = set()
        while True:
            outputs += core.drain_outputs()
            todo = [o for o in outputs if isinstance(o, Effect) and o.id not in answered]
            if not todo:
                return _json(outputs)
            effect = todo[0]
            answered.add(effect.id)
            for value in _completion(effect):
                give(value)
            if effect.kind == "flush" and effect.payload["turn"] == 2:
                for command in at_the_second_flush:
                    give(command)

    via_json = run(True)
    assert via_json == run(False)
    types = [o.get("type") for o in via_json]
    assert "x-test/mark" in types and types[-1] == "session/disposed"
    reasons = [cast(dict[str, JsonLike], o["data"])["reason"] for o in via_json
               if o.get("type") == "turn/end"]
    assert reasons == [{"kind": "error", "step": 1, "message": "stop", "code": "E_STOP"},
                       {"kind": "completed"}]
    assert "agent/inbox/discard" in types           # dispose discards the steer the cancel spared


# --------------------------------------------------------------------------
# P14 observers that fail
# --------------------------------------------------------------------------


@both
def test_P14_observer_inputs_are_accepted_anywhere_even_after_teardown_and_change_nothing(
        impl: str) -> None:
    def run(with_observer_inputs: bool) -> list[dict[str, JsonLike]]:
        s = scenario(impl, calls_reply(("c1", "t")), "done")
        if with_observer_inputs:
            def fail(_output: Output) -> None:
                s.core.feed(Observer("throw"))
                s.core.feed(Observer("veto"))
            s.on_output(fail)
        s.followup(msg("go", id="g"))
        s.run()
        s.dispose()
        s.run()
        if with_observer_inputs:                        # after teardown too
            s.core.feed(input_from_json({"in": "observer", "action": "veto"}))
            s.core.feed(input_from_json({"in": "observer", "action": "throw"}))
        s.run()
        return _json(s.outputs)
    assert run(True) == run(False)


# --------------------------------------------------------------------------
# P15 internal yields
# --------------------------------------------------------------------------


@both
def test_P15_a_tick_comes_after_the_notifications_of_the_same_run_of_the_loop(impl: str) -> None:
    s = scenario(impl)

    def cancel_at_running(data: FrozenDict) -> None:
        if data["status"] == "running":
            s.cancel()
    s.observe("agent/status", cancel_at_running)
    s.followup("go")
    s.run()
    trace = s.trace("*", "*", controls=True)
    # the wake tick precedes the send's enqueue only because it is requested first; the
    # rejected-admission tick of an admission aborted at running follows its dequeue
    assert trace == ["tick(wake)", "enq(go,q)", "running", "cancel-req(user)", "abort(user)",
                     "deq(go,q)", "tick(rejected-admission)", "idle"]
