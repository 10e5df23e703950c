"""R9, one step (specs/core.md §9): the system prompt, the request header and its comparison
with the logged one, the model stream.

The request header's own validation is P13 (tests/test_protocol.py); the scenarios
(tests/test_scenarios.py) run whole steps end to end.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scenario_helpers import Scenario, assert_failed_step

from machine.checking.scripted import calls_reply
from machine.checking.strategies import json_values
from machine.jsonvalue import canonical_json, freeze, same_json

# --------------------------------------------------------------------------
# R9.3 system prompt: a value that is not JSON-compatible (P13, R15.4)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("system", "message"), [
    (float("nan"), "system: nan is not a finite number"),
    ({"rules": ["be brief", float("inf")]}, "system.rules[1]: inf is not a finite number"),
])
def test_R9_3_P13_a_system_prompt_that_is_not_json_fails_with_InvalidSystemPromptError_naming_the_field(
        system: Any, message: str) -> None:
    s = Scenario("never streamed")
    s.handle("system-prompt", lambda _e: ("resolve", system))
    s.followup("go")
    s.run()
    # R15.3 / R15.4: a generic failure of step 1 ({system-prompt} is within the step), coded
    # INVALID_SYSTEM_PROMPT, with the error the core builds; V1/V8: the message names the path.
    assert_failed_step(s, "InvalidSystemPromptError", "INVALID_SYSTEM_PROMPT", message)
    # R9.3 comes before R9.5-R9.7: no step/start, no request, no model call.
    assert s.of("step/start") == []
    assert s.effects("request") == [] and s.effects("model") == []
    s.check()


# --------------------------------------------------------------------------
# R9.6 header comparison: same_json agrees with canonical JSON text equality
# --------------------------------------------------------------------------

SAME_JSON_PAIRS = [
    ({"x": 1}, {"x": 1}, True),
    ({"x": 1}, {"x": 1.0}, False),
    ({"x": 1}, {"x": True}, False),
    ({"x": 1}, {"x": "1"}, False),
    (0.0, -0.0, False),
    (-0.0, -0.0, True),
    (1.5, 1.5, True),
    (1.5, 2.5, False),
    ([1, [2, {"a": None}]], [1, [2, {"a": None}]], True),
    ([1, [2]], [1, [3]], False),
    ([1, 2], [1, 2, 3], False),
    ([1, 2, 3], [1, 2], False),
    ({"a": 1}, {"b": 1}, False),
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}, True),
    ({"a": 1, "b": 2}, {"a": 1, "b": 3}, False),
    ({"a": 1}, {"a": 1, "b": 2}, False),
    ({}, [], False),
    ("s", "s", True),
    (None, None, True),
]


@pytest.mark.parametrize(("a", "b", "same"), SAME_JSON_PAIRS)
def test_R9_6_same_json_is_canonical_text_equality(a: Any, b: Any, same: bool) -> None:
    assert (canonical_json(a) == canonical_json(b)) is same
    assert same_json(freeze(a), freeze(b)) is same
    assert same_json(freeze(b), freeze(a)) is same


@settings(max_examples=300, deadline=None)
@given(json_values(), json_values(), st.booleans())
def test_R9_6_same_json_property(a: Any, b: Any, copy: bool) -> None:
    if copy:
        b = json.loads(json.dumps(a))
    assert same_json(freeze(a), freeze(b)) == (canonical_json(a) == canonical_json(b))


def test_R9_6_a_header_that_differs_only_in_number_type_is_logged_as_a_change() -> None:
    headers = iter([{"config": {"provider": "p", "model": "m", "t": 1}},
                    {"config": {"provider": "p", "model": "m", "t": 1.0}},
                    {"config": {"provider": "p", "model": "m", "t": 1.0}}])
    s = Scenario(calls_reply(("c1", "t")), calls_reply(("c2", "t")), "done")
    s.handle("request", lambda _e: ("resolve", next(headers)))
    s.followup("go")
    s.run()
    assert [e.data["reason"] for e in s.of("request/header")] == ["initial", "change"]
    s.check()


# --------------------------------------------------------------------------
# R9.7 stream: a stream that ends before any finish chunk (R15.4)
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("chunk", "message"), [
    ({"type": "finish", "kind": "stop", "usage": {"inputTokens": 1}},
     "invalid chunk: a finish chunk carries no usage; usage is its own chunk"),
    ({"type": "sparkle"},
     "invalid chunk: 'sparkle' is not a chunk type (one of "
     "block, finish, reasoning, text, tool-call, usage)"),
    ({"type": "text", "text": 5}, "invalid chunk: a text chunk needs a string 'text'"),
    ({"type": "finish", "kind": "bogus"},
     "invalid chunk: chunk.kind: 'bogus' is not stop, max-tokens, error or aborted"),
])
def test_R9_7_D5_an_invalid_chunk_fails_the_step_with_InvalidChunkError_saying_what_is_wrong(
        chunk: dict[str, Any], message: str) -> None:
    """R9.7 / D5 (P12): a finish chunk carrying usage, a chunk of a type that is not one
    of the chunk types (named, in order), or a chunk whose fields are not its type's (V18),
    fails the step with that exact text (R15.4)."""
    s = Scenario([chunk])
    s.followup("go")
    s.run()
    assert_failed_step(s, "InvalidChunkError", "INVALID_CHUNK", message)
    assert s.of("assistant/message") == []


def test_R9_7_R15_4_end_before_any_finish_chunk_fails_with_InvalidChunkError_saying_so() -> None:
    s = Scenario([{"type": "text", "text": "no finish"}])
    s.followup("go")
    s.run()
    message = "model stream ended without a finish chunk"
    assert_failed_step(s, "InvalidChunkError", "INVALID_CHUNK", message)
    assert len(s.of("assistant/chunk")) == 1          # the text chunk before the end was appended
    assert s.of("assistant/message") == []
    s.check()
