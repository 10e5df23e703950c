"""Tests added to kill surviving sampled mutants of machine/core.py (specs/ASSURANCE.md,
"Mutation score").

The sampled mutmut run (a random sample of mutants) left 16 survivors in
``machine.core``. Each test here asserts behaviour the specification states
(specs/core.md, protocol.md, vocabulary.md) and is named after the rule it checks.
They cover branches no earlier test reached or whose outcome no test asserted:

* a system prompt that is not JSON-compatible (R9.3, P13) and the error the core
  builds for it (R15.4: ``InvalidSystemPromptError`` / ``INVALID_SYSTEM_PROMPT``,
  its message naming the offending field, V1/V8);
* a model stream that ends before any finish chunk (R9.7, R15.3-R15.4);
* a ``keepInbox`` that is not a bool (R16.1, V8, V11);
* ``CoreConfig`` validation at construction (P11, V8): a ``tool_modes`` that is not
  a mapping, both accepted modes, a ``publish`` that is not a bool.

The survivors judged equivalent (and the one left unresolved) are listed, with
reasons, in specs/mutation/equivalent-core-sample.md; the mutants these tests kill
are listed in specs/mutation/killed-core-sample.txt.
"""

from __future__ import annotations

from typing import Any

import pytest
from scenario_helpers import Scenario, assert_failed_step, msg

from machine.core import AgentCore, CoreConfig
from machine.errors import ValidationError
from machine.scripted import Driver, calls_reply

# --------------------------------------------------------------------------
# R9.3 / P13 / R15.4 a system prompt that is not JSON-compatible
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
# R9.7 / R15.4 a stream that ends before any finish chunk
# --------------------------------------------------------------------------


def test_R9_7_R15_4_end_before_any_finish_chunk_fails_with_InvalidChunkError_saying_so() -> None:
    s = Scenario([{"type": "text", "text": "no finish"}])
    s.followup("go")
    s.run()
    message = "model stream ended without a finish chunk"
    assert_failed_step(s, "InvalidChunkError", "INVALID_CHUNK", message)
    assert len(s.of("assistant/chunk")) == 1          # the text chunk before the end was appended
    assert s.of("assistant/message") == []
    s.check()


# --------------------------------------------------------------------------
# R16.1 / V8 / V11 a keepInbox that is not a bool
# --------------------------------------------------------------------------


@pytest.mark.parametrize("keep_inbox", ["yes", 1, None])
def test_R16_1_a_keepInbox_that_is_not_a_bool_raises_ValidationError_naming_it_and_does_nothing(
        keep_inbox: Any) -> None:
    core = AgentCore(CoreConfig(publish=False))
    core.send(msg("later"), {"target": "next-turn", "wakeup": False})   # a cancel would clear it
    core.drain_outputs()
    with pytest.raises(ValidationError) as raised:
        core.cancel({"kind": "user"}, keep_inbox)
    assert raised.value.path == "keepInbox"
    assert str(raised.value) == "keepInbox: must be a bool"
    assert core.pending_queued == 1                   # V11: nothing was done
    assert core.drain_outputs() == []


# --------------------------------------------------------------------------
# P11 / V8 CoreConfig validates at construction
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
