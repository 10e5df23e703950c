"""Values however they were built: V1, V2, V6, V23, and the snapshot of completions (P6).

Regressions of issue 14 (an adversarial pass): an already-frozen value bypassed V1's depth
bound and crashed the loop; hand-built frozen containers carried NaN; completion values
were read when consumed rather than when given; lone surrogates were accepted and later
broke every encoder. Each test drives the machine and, where the behaviour is observable,
the reference model too.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from scenario_helpers import Scenario, arr, at, obj

from machine.checking.scripted import Driver, ScriptedEnvironment
from machine.core import AgentCore
from machine.errors import InvariantError, NotJsonCompatibleError, ValidationError
from machine.events import Event
from machine.io import Durable, Effect
from machine.jsonvalue import (
    ENVELOPE_DEPTH,
    MAX_DEPTH,
    FrozenDict,
    FrozenList,
    Unreadable,
    canonical_json,
    compact_json,
    depth_of,
    freeze,
    snapshot,
    thaw,
)
from machine.log import SessionLog
from machine.vocabulary import ErrorInfo, LlmFailure, Message, register_block_type
from model import ModelAgent


def assert_frozen(value: object) -> None:
    """Every container of *value* is an exact FrozenDict/FrozenList holding JSON scalars."""
    pending = [value]
    while pending:
        item = pending.pop()
        kind = type(item)
        if kind is FrozenDict:
            assert isinstance(item, FrozenDict) and depth_of(item) > 0
            pending.extend(item.values())
        elif kind is FrozenList:
            assert isinstance(item, FrozenList)
            pending.extend(item)
        elif kind is float:
            assert isinstance(item, float) and math.isfinite(item)
        elif kind is str:
            assert isinstance(item, str)
            item.encode("utf-8")
        else:
            assert item is None or kind in (int, bool), kind


def message(content: Any, id: str = "m1") -> dict[str, Any]:
    return {"id": id, "role": "user", "content": content, "source": {"kind": "user"}}


def wrapped_list(times: int) -> FrozenList:
    value = FrozenList([])
    for _ in range(times):
        value = FrozenList([value])
    return value


def wrapped_dict(times: int) -> FrozenDict:
    value = FrozenDict({})
    for _ in range(times):
        value = FrozenDict({"k": value})
    return value


# --------------------------------------------------------------------------
# V1: the depth of frozen children counts
# --------------------------------------------------------------------------


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_V1_an_already_frozen_child_counts_with_its_whole_depth(agent_type: type) -> None:
    """Issue 14.1: FrozenList([]) wrapped 100,000 times inside a message's content was
    accepted, and the loop later crashed encoding it. It is refused by the command, which
    changes nothing."""
    agent = agent_type()
    before = agent.drain_outputs()
    deep = wrapped_list(100_000)
    with pytest.raises(NotJsonCompatibleError, match="nest more than 128 levels deep") as caught:
        agent.followup(message([{"type": "x-deep", "value": deep}]))
    assert caught.value.path == "message.content[0].value"
    assert agent.drain_outputs() == [] and before
    assert agent.pending_queued == 0 and not agent.wake_pending


def test_V1_frozen_children_are_counted_exactly_at_the_bound() -> None:
    # content list (1) > block (2) > the frozen list: 126 more levels reach exactly 128.
    at_bound = wrapped_list(125)
    assert depth_of(at_bound) == 126
    frozen = freeze([{"type": "x", "v": at_bound}], "content")
    assert depth_of(frozen) == MAX_DEPTH
    with pytest.raises(NotJsonCompatibleError, match="128 levels"):
        freeze([{"type": "x", "v": FrozenList([at_bound])}], "content")
    deep_dict = wrapped_dict(127)          # 128 levels with the innermost {}
    assert freeze(deep_dict) is deep_dict
    with pytest.raises(NotJsonCompatibleError, match="128 levels"):
        freeze(FrozenDict({"k": deep_dict}))


def test_V1_re_injecting_logged_content_cannot_grow_past_the_bound() -> None:
    """Issue 14.1: taking a message's content back from the log and wrapping it in a new
    message, a few hundred times, bypassed the bound. Each round adds levels; the round
    that would pass 128 is refused, and the log never holds anything deeper."""
    s = Scenario()
    content: Any = [{"type": "text", "text": "seed"}]
    accepted = 0
    for round_ in range(300):
        try:
            s.inject(message(content, id=f"r{round_}"))   # idle: appended at once
        except NotJsonCompatibleError as error:
            assert "nest more than 128 levels deep" in str(error)
            break
        accepted += 1
        logged = s.core.log[len(s.core.log) - 1].data["content"]
        assert isinstance(logged, FrozenList)
        content = [{"type": "x-wrap", "inner": logged}]
    else:
        pytest.fail("the content grew for 300 rounds without being refused")
    assert 60 <= accepted <= MAX_DEPTH
    assert all(depth_of(event.data) <= ENVELOPE_DEPTH for event in s.core.log.events)
    s.run()
    s.check()


def test_V1_the_log_refuses_event_data_deeper_than_the_envelope_bound() -> None:
    log = SessionLog()
    with pytest.raises(InvariantError, match=r"\[L3\].*136 levels"):
        log.commit("x-ext/deep", {"v": wrapped_list(ENVELOPE_DEPTH)})
    assert len(log) == 0
    event = log.commit("x-ext/deep", {"v": wrapped_list(ENVELOPE_DEPTH - 2)})
    assert depth_of(event.data) == ENVELOPE_DEPTH
    compact_json(event.data)          # encodable


# --------------------------------------------------------------------------
# V2: hand-built frozen containers
# --------------------------------------------------------------------------


def test_V2_frozen_containers_cannot_be_subclassed() -> None:
    with pytest.raises(TypeError, match="cannot be subclassed"):
        type("MyList", (FrozenList,), {})
    with pytest.raises(TypeError, match="cannot be subclassed"):
        type("MyDict", (FrozenDict,), {})


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_V2_a_frozen_list_built_by_tuple_new_is_checked_where_it_enters(agent_type: type) -> None:
    """Issue 14.1: ``tuple.__new__`` builds a FrozenList around anything. Where it enters it
    is checked: NaN is refused, a mutable list inside is copied."""
    agent = agent_type()
    agent.drain_outputs()
    holding_nan = tuple.__new__(FrozenList, [1, float("nan")])
    with pytest.raises(NotJsonCompatibleError, match=r"content\[0\]\.v\[1\]: nan is not a finite"):
        agent.followup(message([{"type": "x", "v": holding_nan}]))
    inner = ["mutable"]
    holding_list = tuple.__new__(FrozenList, [inner])
    agent.inject(message([{"type": "x", "v": holding_list}]))      # idle: appended now
    inner.append("changed")
    (event,) = [o.event for o in agent.drain_outputs() if isinstance(o, Durable)]
    assert thaw(event.data["content"]) == [{"type": "x", "v": [["mutable"]]}]


def test_V2_containers_never_hold_what_a_hand_built_list_smuggles_in() -> None:
    bad = tuple.__new__(FrozenList, [math.inf])
    with pytest.raises(NotJsonCompatibleError):
        FrozenDict({"a": bad})
    with pytest.raises(NotJsonCompatibleError):
        FrozenList([bad])
    rebuilt = FrozenDict({"a": tuple.__new__(FrozenList, [[1, 2]])})
    assert type(arr(rebuilt["a"])[0]) is FrozenList and rebuilt == {"a": [[1, 2]]}
    assert depth_of(tuple.__new__(FrozenList, [object()])) == -1


def test_V2_a_frozen_dict_is_complete_when_it_exists() -> None:
    value = FrozenDict({"a": 1})
    value.__init__({"a": 2})  # type: ignore[misc]
    assert value == {"a": 1}
    never_built = object.__new__(FrozenDict)
    with pytest.raises(NotJsonCompatibleError, match="never built"):
        freeze({"x": never_built})
    assert depth_of(never_built) == -1


def test_V2_reading_a_value_never_runs_the_callers_code() -> None:
    class Sneaky(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("items called")

        def __iter__(self) -> Any:
            raise RuntimeError("iter called")

    class SneakyList(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise RuntimeError("iter called")

    value = Sneaky(a=SneakyList([1, 2]))
    assert thaw(freeze(value)) == {"a": [1, 2]}

    class Liar:
        @property  # type: ignore[misc]
        def __class__(self) -> type:
            return str

    with pytest.raises(NotJsonCompatibleError, match="a Liar is not JSON-compatible"):
        freeze({"a": Liar()})


# --------------------------------------------------------------------------
# V6 / P6: completion values are taken at the call
# --------------------------------------------------------------------------


class ReusingAdapter(ScriptedEnvironment):
    """A model adapter that reuses one dict for every chunk (issue 14.2), one dict for the
    request header and one for every tool result."""

    def __init__(self) -> None:
        super().__init__()
        self.chunk: dict[str, Any] = {}
        self.header: dict[str, Any] = {"config": {"provider": "p", "model": "m"}}


def _drive_reusing(agent: Any) -> list[Any]:
    """Feed the chunks alpha/beta/gamma, the usage and the finish through one reused dict,
    mutating it after each call and after the stream; the header dict is mutated after the resolve."""
    agent.followup(message([{"type": "text", "text": "go"}]))
    reused: dict[str, Any] = {}
    header: dict[str, Any] = {"config": {"provider": "p", "model": "m"}}
    outputs: list[Any] = []
    while True:
        output = agent.next_output()
        if output is None:
            break
        outputs.append(output)
        if not isinstance(output, Effect):
            continue
        if output.kind == "request":
            agent.resolve(output.id, header)
            header["config"]["model"] = "mutated"
            header["tools"] = ["smuggled"]
        elif output.kind == "model":
            for piece in ("alpha", "beta", "gamma"):
                reused.clear()
                reused.update(type="text", text=piece)
                agent.chunk(output.id, reused)
            reused.clear()
            reused.update(type="usage", usage={"tokens": 3})
            agent.chunk(output.id, reused)
            reused["usage"]["tokens"] = 999
            reused.clear()
            reused.update(type="finish", kind="stop")
            agent.chunk(output.id, reused)
            reused["kind"] = "error"
            agent.end(output.id)
        elif output.kind == "prompt-submit":
            decision: dict[str, Any] = {"kind": "allow"}
            agent.resolve(output.id, decision)
            decision["kind"] = "block"
            decision["reason"] = "too late"
        else:
            agent.resolve(output.id, None)
    return outputs


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
def test_V6_P6_a_reused_chunk_dict_logs_each_chunk_as_it_was_given(agent_type: type) -> None:
    agent = agent_type(clock=lambda: 0)
    outputs = _drive_reusing(agent)
    events = [o.event for o in outputs if isinstance(o, Durable)]
    chunks = [thaw(e.data["chunk"]) for e in events if e.type == "assistant/chunk"]
    assert chunks == [{"type": "text", "text": "alpha"}, {"type": "text", "text": "beta"},
                      {"type": "text", "text": "gamma"}, {"type": "usage", "usage": {"tokens": 3}},
                      {"type": "finish", "kind": "stop"}]
    (assistant,) = [e for e in events if e.type == "assistant/message"]
    assert thaw(at(assistant.data, "message", "content")) == [{"type": "text",
                                                              "text": "alphabetagamma"}]
    assert thaw(assistant.data["usage"]) == {"tokens": 3}
    (header,) = [e for e in events if e.type == "request/header"]
    assert thaw(header.data["header"]) == {"config": {"provider": "p", "model": "m"}}
    assert [e.type for e in events][-1] == "turn/end"
    assert thaw(events[-1].data["reason"]) == {"kind": "completed"}


def test_V6_P6_machine_and_model_agree_on_mutated_completions() -> None:
    def rendered(agent: Any) -> list[str]:
        return [json.dumps(o.to_json(), sort_keys=True) for o in _drive_reusing(agent)]
    assert rendered(AgentCore(clock=lambda: 0)) == rendered(ModelAgent(clock=lambda: 0))


def test_V6_P6_a_tool_result_reused_and_mutated_after_resolve() -> None:
    result: dict[str, Any] = {"content": [{"type": "text", "text": "first"}]}

    def execute(_e: Effect) -> Any:
        return ("resolve", result)

    def finalize(e: Effect) -> Any:
        # Why: by now the body's result was resolved; mutating the dict must not show.
        result["content"][0]["text"] = "mutated"
        result["isError"] = True
        return ("resolve", thaw(e.payload["result"]))

    from machine.checking.scripted import calls_reply
    s = Scenario(calls_reply(("c1", "t")), "done")
    s.handle("tool-execute", execute)
    s.handle("tool-finalize", finalize)
    s.followup("go")
    s.run()
    (tool_result,) = s.of("tool/result")
    block = obj(at(tool_result.data, "message", "content", 0))
    assert thaw(block["content"]) == [{"type": "text", "text": "first"}]
    assert "isError" not in block
    s.check()


def test_V6_snapshot_keeps_the_verdict_of_a_value_that_is_not_json() -> None:
    value: dict[str, Any] = {"kind": "allow", "content": [{"type": "text", "text": math.nan}]}
    taken = snapshot(value)
    value["content"][0]["text"] = "fine now"
    with pytest.raises(NotJsonCompatibleError, match=r"content\[0\]\.text: nan"):
        freeze(taken, "decision")
    cyclic: list[Any] = []
    cyclic.append(cyclic)
    copy = snapshot(cyclic)
    assert copy is not cyclic and copy[0] is copy
    with pytest.raises(NotJsonCompatibleError, match="cycle"):
        freeze(copy)
    contexts = ({"id": "c", "role": "user", "content": [], "source": {"kind": "user"}},)
    copied = snapshot({"kind": "allow", "additionalContexts": contexts})
    contexts[0]["id"] = "mutated"
    assert copied["additionalContexts"][0]["id"] == "c"

    class Overriding(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("boom")

    original = Overriding(a=[object()])
    copied_dict = snapshot(original)
    assert type(copied_dict) is dict and copied_dict["a"] is not original["a"]
    with pytest.raises(NotJsonCompatibleError, match="the value could not be read"):
        freeze({"v": Unreadable("MemoryError")})


def test_V1_an_object_whose_repr_raises_is_refused_by_its_type() -> None:
    class NoRepr:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    with pytest.raises(NotJsonCompatibleError, match="a NoRepr is not JSON-compatible"):
        freeze([NoRepr()])
    with pytest.raises(NotJsonCompatibleError, match="key a NoRepr is not a string"):
        freeze({NoRepr(): 1})
    s = Scenario()
    s.handle("prompt-submit", lambda _e: ("resolve", {"kind": "allow", "content": [NoRepr()]}))
    s.followup("go")
    s.run()
    (warning,) = s.live("agent/warning")
    assert str(warning["text"]) == ("prompt admission returned an invalid decision: "
                                    "decision.content[0]: a NoRepr is not JSON-compatible")
    assert s.of("turn/start") == []
    s.check()


# --------------------------------------------------------------------------
# V23: lone surrogates
# --------------------------------------------------------------------------

SURROGATE_PATHS = [
    ("id", lambda: message([], id="m\ud800"), "message.id"),
    ("text", lambda: message([{"type": "text", "text": "a\udfff"}]), "message.content[0].text"),
    ("key", lambda: message([{"type": "x", "k\udc80": 1}]), "message.content[0]"),
    ("source", lambda: {**message([]), "source": {"kind": "user", "who": "\ud83d"}},
     "message.source.who"),
]


@pytest.mark.parametrize("agent_type", [AgentCore, ModelAgent])
@pytest.mark.parametrize(("where", "build", "path"), SURROGATE_PATHS,
                         ids=[case[0] for case in SURROGATE_PATHS])
def test_V23_a_lone_surrogate_is_refused_at_acceptance_naming_the_path(
        agent_type: type, where: str, build: Any, path: str) -> None:
    agent = agent_type()
    agent.drain_outputs()
    for command in (agent.followup, agent.steer, agent.inject):
        with pytest.raises(NotJsonCompatibleError, match="lone surrogate") as caught:
            command(build())
        assert caught.value.path == path
    assert agent.drain_outputs() == []


def test_V23_a_surrogate_pair_spelled_as_escapes_is_one_character_and_fine() -> None:
    text = json.loads('"\\ud83d\\ude00"')
    assert text == "\U0001F600"
    assert freeze({"t": text}) == {"t": text}


def test_V23_every_string_field_refuses_lone_surrogates() -> None:
    with pytest.raises(NotJsonCompatibleError, match=r"error\.message"):
        ErrorInfo("bad \ud800")
    with pytest.raises(NotJsonCompatibleError, match=r"error\.causes\[0\]"):
        ErrorInfo("ok", causes=("\udc00",))
    with pytest.raises(NotJsonCompatibleError, match=r"failure\.message"):
        LlmFailure("\ud800", "CODE")
    with pytest.raises(NotJsonCompatibleError, match=r"event\.type"):
        Event("x/\ud800", 0, 0, FrozenDict())
    with pytest.raises(InvariantError, match="L3"):
        SessionLog().commit("x-ext/marker", {"s": "\ud800"})
    with pytest.raises(ValidationError):
        Message("m\ud800", "user", [], {"kind": "user"})  # type: ignore[arg-type]


def test_V23_text_taken_from_an_exception_is_scrubbed_not_refused() -> None:
    name = b"caf\xe9".decode("utf-8", "surrogateescape")   # as os.listdir gives it
    error = RuntimeError(f"cannot open {name}")
    error.__cause__ = ValueError(name)
    info = ErrorInfo.from_exception(error)
    assert info.message == "cannot open caf\ufffd" and info.causes == ("caf\ufffd",)
    canonical_json(info.to_json())
    info.to_json()["message"].encode("utf-8")


def test_V23_a_raised_completion_with_an_undecodable_file_name_fails_the_turn_cleanly() -> None:
    name = b"caf\xe9".decode("utf-8", "surrogateescape")
    s = Scenario()
    s.handle("step", lambda _e: ("raise", ErrorInfo.from_exception(RuntimeError(name))))
    s.followup("go")
    s.run()
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"])["kind"] == "error"
    compact_json(turn_end.data).encode("utf-8")
    s.check()


# --------------------------------------------------------------------------
# V3 / V4: extension checks that misbehave
# --------------------------------------------------------------------------


def test_V3_a_raising_block_check_refuses_the_block_naming_it(restored_registries: None) -> None:
    def check(_block: FrozenDict) -> str | None:
        raise KeyError("oops")

    register_block_type("x-raises", check)
    core = AgentCore()
    with pytest.raises(ValidationError, match="the check of block type 'x-raises' raised"):
        core.followup(message([{"type": "x-raises"}]))
    s = Scenario([{"type": "block", "block": {"type": "x-raises"}}, {"type": "finish",
                                                                    "kind": "stop"}])
    s.followup("go")
    s.run()
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"])["code"] == "INVALID_CHUNK"
    s.check()


def test_V2_outputs_hold_only_frozen_values_when_hand_built_lists_come_in() -> None:
    """A FrozenList built by tuple.__new__ around a plain list is rebuilt on entry: every
    output of the run holds exact frozen containers only."""
    core = AgentCore()
    driver = Driver(core)
    core.followup(message([{"type": "x", "v": tuple.__new__(FrozenList, [[1, {"a": [2]}]])}]))
    driver.run()
    assert any(isinstance(o, Durable) and o.event.type == "turn/end" for o in driver.outputs)
    for output in driver.outputs:
        if isinstance(output, Durable):
            assert_frozen(output.event.data)
        else:
            assert_frozen(output.payload if not hasattr(output, "event")
                          else output.event.payload)


def test_V6_P6_RT5_a_model_adapter_reusing_one_dict_through_the_runtime() -> None:
    """Issue 14.2 through the asyncio runtime: the stream's chunks enter the core on a later
    pass (RT5), after the adapter has already refilled its one dict; each is taken when it
    is yielded, so the log reads alphabetagamma."""
    import asyncio

    from machine.runtime import Agent

    class Reusing:
        def stream(self, call: Any) -> Any:
            async def chunks() -> Any:
                one: dict[str, Any] = {}
                for piece in ("alpha", "beta", "gamma"):
                    one.clear()
                    one.update(type="text", text=piece)
                    yield one
                one.clear()
                one.update(type="finish", kind="stop")
                yield one
            return chunks()

    async def main() -> list[Any]:
        async with Agent(Reusing(), request_options={"provider": "p", "model": "m"}) as agent:
            agent.followup("go")
            await agent.when_idle()
            return list(agent.session.events)

    events = asyncio.run(asyncio.wait_for(main(), 60))
    chunks = [thaw(e.data["chunk"]) for e in events if e.type == "assistant/chunk"]
    assert [c.get("text") for c in chunks] == ["alpha", "beta", "gamma", None]
    (assistant,) = [e for e in events if e.type == "assistant/message"]
    assert thaw(at(assistant.data, "message", "content")) == [{"type": "text",
                                                              "text": "alphabetagamma"}]
