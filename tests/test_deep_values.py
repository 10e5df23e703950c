"""Deeply nested values: V1's depth bound, R10.1 and P13 (regression).

A tool-call argument string of JSON nested about 500 levels deep once made
``freeze`` exhaust Python's recursion limit: the
``RecursionError`` escaped ``next_output()`` and left the core running with no
way forward. V1 now bounds nesting at 128 levels (a bound every port can
implement), and parsing that runs out of stack counts as unparsable.
"""

from __future__ import annotations

from types import FrameType
from typing import TYPE_CHECKING, Any, cast

import pytest
from scenario_helpers import Scenario, at

from machine.checking.scripted import Driver, ScriptedEnvironment, calls_reply, ok_result, text_reply
from machine.core import AgentCore, CoreConfig
from machine.errors import NotJsonCompatibleError
from machine.jsonvalue import MAX_DEPTH, FrozenList, depth_of, freeze, frozen_from_json, thaw

if TYPE_CHECKING:
    # The same files: setup.py installs model/ as machine._model, which mypy cannot follow.
    from model import ModelAgent
else:
    from machine._model import ModelAgent


def nested(depth: int) -> Any:
    value: Any = 1
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_V1_nesting_up_to_the_bound_is_accepted() -> None:
    assert MAX_DEPTH == 128
    frozen = freeze(nested(MAX_DEPTH))
    assert thaw(frozen) == nested(MAX_DEPTH)


@pytest.mark.parametrize("depth", [MAX_DEPTH + 1, 600, 5000])
def test_V1_deeper_nesting_is_refused_naming_where(depth: int) -> None:
    with pytest.raises(NotJsonCompatibleError, match="nest more than 128 levels deep") as caught:
        freeze(nested(depth), "arguments")
    assert caught.value.path.startswith("arguments")


class _Text(str):
    """A str subclass: its container is frozen item by item, not copied at once."""


def test_V1_a_dict_of_frozen_values_inside_a_container_counts_toward_the_bound() -> None:
    inner = freeze(nested(MAX_DEPTH - 2))                 # a frozen value, depth 126
    assert depth_of(freeze([_Text("x"), {"k": inner}])) == MAX_DEPTH
    deeper = freeze(nested(MAX_DEPTH - 1))                # depth 127: the list would be 129
    with pytest.raises(NotJsonCompatibleError, match="nest more than 128 levels deep") as caught:
        freeze([_Text("x"), {"k": deeper}], "arguments")
    assert caught.value.path.startswith("arguments[1]")


def test_V1_a_bound_given_to_freeze_holds_for_a_list_too() -> None:
    assert freeze([1], "v", max_depth=1) == [1]
    with pytest.raises(NotJsonCompatibleError) as caught:
        freeze([[1]], "v", max_depth=1)
    assert str(caught.value) == "v[0]: arrays and objects nest more than 1 levels deep"


def test_V1_frozen_arrays_nested_in_frozen_arrays_count_every_level() -> None:
    def arrays(depth: int) -> Any:
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return value
    assert depth_of(freeze(arrays(2))) == 2
    inner = freeze(arrays(MAX_DEPTH))
    assert depth_of(inner) == MAX_DEPTH
    with pytest.raises(NotJsonCompatibleError, match="nest more than 128 levels deep"):
        freeze([inner])


def test_V1_a_frozen_container_refuses_deep_contents_too() -> None:
    with pytest.raises(NotJsonCompatibleError):
        FrozenList([nested(600)])


@pytest.mark.parametrize("depth", [200, 495, 2000])
def test_R10_1_arguments_nested_too_deeply_are_passed_on_as_the_raw_string(depth: int) -> None:
    raw = "[" * depth + "]" * depth
    s = Scenario(calls_reply(("c1", "t", raw)), "done")
    s.followup("go")
    s.run()
    (call,) = s.of("tool/call")
    assert call.data["arguments"] == raw
    (execute,) = s.effects("tool-execute")
    assert execute.payload["arguments"] == raw
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"]) == {"kind": "completed"}
    assert s.core.status == "idle"
    s.check()


def test_P13_a_header_nested_too_deeply_is_a_request_config_failure_not_a_crash() -> None:
    s = Scenario("never streamed")
    s.handle("request", lambda _e: ("resolve", {"config": {"provider": "p", "model": "m"},
                                                "tools": nested(600)}))
    s.followup("go")
    s.run()
    (turn_end,) = s.of("turn/end")
    reason = thaw(turn_end.data["reason"])
    assert reason["kind"] == "error" and reason["code"] == "INVALID_REQUEST_CONFIG"
    assert "nest more than 128 levels deep" in reason["message"]
    assert s.effects("model") == []
    assert s.core.status == "idle"
    s.check()


def _deep_result_session(agent: AgentCore) -> Driver:
    """A turn whose tool returns meta nested exactly MAX_DEPTH levels deep."""
    deep = nested(MAX_DEPTH - 1)  # meta = {"a": deep} is MAX_DEPTH levels deep
    env = ScriptedEnvironment(replies=[calls_reply(("c1", "t")), text_reply("done")])
    env.handlers["tool-execute"] = lambda _e: ("resolve", ok_result(
        "r", meta={"a": deep}, additionalContexts=[]))
    driver = Driver(agent, env)
    agent.followup({"id": "m1", "role": "user", "source": {"kind": "user"},
                    "content": [{"type": "text", "text": "go"}]})
    driver.run()
    return driver


def test_V1_values_at_the_bound_survive_the_envelopes_the_core_wraps_them_in() -> None:
    # Regression: a tool result accepted at the bound was re-frozen inside a wrapper one
    # level deeper, and the refusal escaped next_output().
    driver = _deep_result_session(AgentCore(CoreConfig(), clock=lambda: 0))
    core = driver.core
    (result,) = [e for e in core.log if e.type == "tool/result"]
    assert thaw(at(result.data, "meta", "a")) == nested(MAX_DEPTH - 1)
    assert [e.type for e in core.log][-1] == "turn/end"
    assert thaw(core.log[-1].data["reason"]) == {"kind": "completed"}
    assert core.status == "idle"


def test_V1_the_model_agrees_on_values_at_the_bound() -> None:
    machine = _deep_result_session(AgentCore(CoreConfig(), clock=lambda: 0))
    model = _deep_result_session(cast(AgentCore, ModelAgent(CoreConfig(), clock=lambda: 0)))
    assert [o for o in machine.outputs] == [o for o in model.outputs]
    assert list(machine.core.log) == list(model.core.log)


def test_V1_running_out_of_stack_below_the_bound_is_a_refusal_naming_the_value() -> None:
    # Called deep in a caller's stack, even a value within the bound may exhaust Python's
    # recursion limit: that is a refusal of the value, never a RecursionError.
    import sys

    frame: FrameType | None = sys._getframe()
    depth = 0
    while frame is not None:
        depth, frame = depth + 1, frame.f_back
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(depth + 100)  # room for the test, not for 120 levels of freezing
    try:
        with pytest.raises(NotJsonCompatibleError, match=r"^deep: the value is nested too deeply$") \
                as caught:
            freeze(nested(120), "deep")
    finally:
        sys.setrecursionlimit(limit)
    assert caught.value.path == "deep"


def test_V2_frozen_from_json_rebuilds_arrays_as_frozen_lists_at_every_level() -> None:
    value = frozen_from_json('[1, [2, {"a": [3]}], "x"]')
    assert type(value) is FrozenList and type(value[1]) is FrozenList
    assert type(at(value, 1, 1, "a")) is FrozenList
    assert thaw(value) == [1, [2, {"a": [3]}], "x"]
