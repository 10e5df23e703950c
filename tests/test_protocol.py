"""The embedding protocol (specs/protocol.md, rules P1–P16): pulling outputs, completions of
released streams, the configuration, chunk folding and minted ids, request headers.

Internal failures (P16) are tested in tests/test_internal_failures.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from scenario_helpers import Scenario, assert_failed_step, msg

from machine.core import NO_ROUTE_MESSAGE, AgentCore, CoreConfig
from machine.errors import ProtocolError, ValidationError
from machine.io import Control
from machine.jsonvalue import thaw
from machine.scripted import Driver, calls_reply

CONFIG = {"provider": "p", "model": "m"}


def _reason(s: Scenario) -> dict[str, object]:
    (turn_end,) = s.of("turn/end")
    return thaw(turn_end.data["reason"])  # type: ignore[return-value]


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


def test_P10_a_completion_of_a_released_model_stream_is_refused() -> None:
    s = Scenario()
    s.hold("model")
    s.followup("go")
    s.run()
    model = s.take("model")
    s.core.chunk(model.id, {"type": "text"})           # invalid chunk: the stream is released
    s.run()
    assert "release" in [o.kind for o in s.outputs if isinstance(o, Control)]
    with pytest.raises(ProtocolError, match=r"already completed"):
        s.core.chunk(model.id, {"type": "text", "text": "late"})
    with pytest.raises(ProtocolError, match=r"already completed"):
        s.core.end(model.id)


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
    message = s.of("assistant/message")[0].data["message"]
    assert thaw(message["content"]) == [  # type: ignore[index]
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
    assert [e.data["message"]["id"] for e in assistant] == [
        f"mine-assistant-{e.seq}" for e in assistant]
    assert result.data["message"]["id"] == f"mine-tool-result-{result.seq}"
    assert minted == sorted(minted, key=lambda pair: pair[1]) and len(minted) == 3


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
