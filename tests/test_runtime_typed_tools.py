"""Typed tools (specs/runtime.md RT22): the parameters' JSON Schema from the signature, type
hints and docstring; arguments validated before the function runs; invalid arguments an error
result the model reads, naming each problem; hand-written schemas unchanged."""

from __future__ import annotations

import asyncio
import enum
import json
import subprocess
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

import pytest
from pydantic import BaseModel, Field
from scenario_helpers import at, obj

from machine.runtime import (
    Agent,
    ScriptedModel,
    Tool,
    ToolArgumentError,
    ToolCall,
    ToolResult,
    calls_reply,
    text_reply,
    tool,
)
from machine.runtime.adapters.fake_server import FakeServer, openai_text, openai_tool_calls
from machine.runtime.adapters.openai import OpenAIChat
from machine.runtime.typed import parse_docstring


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


def mapping(value: object) -> dict[str, Any]:
    """*value*, asserted to be a plain JSON object (a tool spec is plain data)."""
    assert isinstance(value, dict), f"not a JSON object: {value!r}"
    return value


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Place(BaseModel):
    city: str
    country: str = "FR"


class Opaque:
    """No JSON Schema describes it."""


@dataclass
class Window:
    start: int
    end: int


@tool
async def forecast(place: Place, days: Annotated[int, Field(ge=1, le=7)] = 3,
                   unit: Unit = Unit.CELSIUS, window: Window | None = None,
                   style: Literal["short", "long"] = "short") -> dict[str, Any]:
    """Forecast the weather.

    Args:
        place: where.
        days: how many days,
            counting today.
        unit: the temperature unit.
    """
    return {"city": place.city, "days": days, "unit": unit.value,
            "window": None if window is None else [window.start, window.end], "style": style}


def test_RT22_the_schema_comes_from_the_signature_hints_and_docstring() -> None:
    spec = forecast.spec()
    assert spec["name"] == "forecast" and spec["description"] == "Forecast the weather."
    parameters = mapping(spec["parameters"])
    assert parameters["type"] == "object" and parameters["additionalProperties"] is False
    assert parameters["required"] == ["place"]
    properties = mapping(parameters["properties"])
    assert list(properties) == ["place", "days", "unit", "window", "style"]
    assert mapping(properties["days"]) == {"default": 3, "description": "how many days, counting today.",
                                       "maximum": 7, "minimum": 1, "type": "integer"}
    assert mapping(properties["place"])["description"] == "where."
    assert mapping(properties["style"])["enum"] == ["short", "long"]
    assert set(mapping(parameters["$defs"])) == {"Place", "Unit", "Window"}
    assert "title" not in json.dumps(parameters)           # pydantic's generated titles


def test_RT22_a_ToolCall_parameter_gets_the_call_and_is_not_in_the_schema() -> None:
    seen: list[tuple[str, int]] = []

    @tool(mode="parallel")
    async def note(call: ToolCall, text: str) -> str:
        """Write a note."""
        seen.append((call.call_id, call.turn))
        return text.upper()

    assert note.mode == "parallel"
    assert mapping(note.spec()["parameters"])["required"] == ["text"]

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "note", '{"text": "hi"}')), text_reply("ok")])
        async with Agent(model, tools=[note]) as agent:
            await agent.run("go")
            assert results(agent) == [("c1", "HI", False)]
    run(main)
    assert seen == [("c1", 1)]


def results(agent: Agent) -> list[tuple[str, str, bool]]:
    out = []
    for event in agent.session.events:
        if event.type == "tool/result":
            block = obj(at(event.data, "message", "content", 0))
            out.append((str(block["toolCallId"]), str(at(block, "content", 0, "text")),
                        bool(block.get("isError", False))))
    return out


def test_RT22_arguments_are_validated_and_converted_before_the_function_runs() -> None:
    async def main() -> None:
        model = ScriptedModel([
            calls_reply(("c1", "forecast", '{"place": {"city": "Lyon"}, "days": "5", '
                                           '"unit": "fahrenheit", "window": {"start": 1, "end": 2}}')),
            text_reply("ok")])
        async with Agent(model, tools=[forecast]) as agent:
            await agent.run("weather?")
            ((_, text, error),) = results(agent)
            assert not error
            assert json.loads(text) == {"city": "Lyon", "days": 5, "unit": "fahrenheit",
                                        "window": [1, 2], "style": "short"}
    run(main)


def test_RT22_invalid_arguments_are_an_error_result_the_model_reads_and_the_body_never_runs() -> None:
    ran: list[object] = []

    @tool
    async def move(x: int, y: int = 0) -> str:
        ran.append((x, y))
        return "moved"

    async def main() -> None:
        model = ScriptedModel([
            calls_reply(("c1", "move", '{"x": "left", "z": 1}'), ("c2", "move", "not json"),
                        ("c3", "move", "[1, 2]"), ("c4", "move", '{"x": 3}')),
            text_reply("sorry")])
        async with Agent(model, tools=[move]) as agent:
            await agent.run("go")
            (c1, c2, c3, c4) = results(agent)
            assert c1[2] and c1[1] == ("Error: arguments: x: Input should be a valid integer, unable "
                                       "to parse string as an integer (got \"left\"); z: Extra "
                                       "inputs are not permitted (got 1)")
            assert c2[2] and c2[1] == 'Error: arguments: must be a JSON object, not str "not json"'
            assert c3[2] and "must be a JSON object, not list [1, 2]" in c3[1]
            assert c4 == ("c4", "moved", False)
            codes = [obj(e.data.get("error")).get("code") for e in agent.session.events
                     if e.type == "tool/result" and e.data.get("error")]
            assert codes == ["INVALID_TOOL_ARGUMENTS"] * 3
            # the next request carries the error results: the model reads what was wrong
            last = model.calls[-1].messages
            texts = [str(at(m.content[0], "content", 0, "text")) for m in last
                     if m.source.get("kind") == "tool"]
            assert texts[0].startswith("Error: arguments: x:")
    run(main)
    assert ran == [(3, 0)]


def test_RT22_return_values_become_results() -> None:
    @tool
    async def many(kind: str) -> object:
        if kind == "model":
            return Place(city="Oslo")
        if kind == "result":
            return ToolResult([{"type": "text", "text": "as is"}],  # type: ignore[arg-type]
                              concludes_turn=True)
        if kind == "none":
            return None
        return [1, "two"]

    async def main() -> None:
        model = ScriptedModel([calls_reply(("a", "many", '{"kind": "model"}'),
                                           ("b", "many", '{"kind": "list"}'),
                                           ("c", "many", '{"kind": "none"}'),
                                           ("d", "many", '{"kind": "result"}'))])
        async with Agent(model, tools=[many]) as agent:
            await agent.run("go")
            assert [r[1] for r in results(agent)] == [
                '{"city":"Oslo","country":"FR"}', '[1,"two"]', "null", "as is"]
    run(main)


def test_RT22_a_synchronous_function_runs_in_a_worker_thread() -> None:
    threads: list[str] = []

    @tool
    def blocking(n: int) -> str:
        """A blocking call."""
        threads.append(threading.current_thread().name)
        return str(n * 2)

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "blocking", '{"n": 21}')), text_reply("ok")])
        async with Agent(model, tools=[blocking]) as agent:
            await agent.run("go")
            assert results(agent) == [("c1", "42", False)]
    run(main)
    assert threads and threads[0] != threading.main_thread().name


def test_RT22_hand_written_schemas_and_call_bodies_are_used_as_they_are() -> None:
    @tool(parameters={"type": "object", "properties": {"q": {"type": "string"}}})
    async def search(call: ToolCall) -> str:
        """Search."""
        return f"found {call.arg('q', str)}"

    @tool
    async def ping(call):  # type: ignore[no-untyped-def]
        return "pong"

    assert search.spec()["parameters"] == {"type": "object", "properties": {"q": {"type": "string"}}}
    assert search.validate_arguments is None and "parameters" not in ping.spec()
    plain = Tool("plain", ping.run)
    assert plain.validate_arguments is None

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "search", '{"q": 1}'), ("c2", "ping")),
                               text_reply("ok")])
        async with Agent(model, tools=[search, ping]) as agent:
            await agent.run("go")
            ((_, first, error), second) = results(agent)
            assert error and first == "Error: arguments.q: must be a string, not int 1"
            assert second == ("c2", "pong", False)
    run(main)


def test_RT22_functions_that_cannot_be_described_are_refused_at_decoration() -> None:
    with pytest.raises(TypeError, match=r"\*args and \*\*args cannot be described"):
        @tool
        async def spread(*args: int) -> str:
            return ""

    class Local:
        pass

    with pytest.raises(TypeError, match=r"its type hints cannot be resolved .*'Local'"):
        @tool
        async def local(thing: Local) -> str:
            return ""

    with pytest.raises(TypeError, match="cannot be described as JSON Schema"):
        @tool
        async def odd(thing: Opaque) -> str:
            return ""

    with pytest.raises(TypeError, match="only one parameter can take the ToolCall"):
        @tool
        async def twice(a: ToolCall, b: ToolCall) -> str:
            return ""


def test_RT22_docstrings_in_google_numpy_and_sphinx_style() -> None:
    google = """Summary line.

    More of it.

    Args:
        a (int): first
            and more.
        b: second.

    Returns:
        nothing.
    """
    numpy = """Summary.

    Parameters
    ----------
    a : int
        First
        thing.
    b : str

    Returns
    -------
    int
    """
    sphinx = """Summary.

    :param a: first
        thing
    :param str b: second
    :returns: nothing
    """
    assert parse_docstring(google) == ("Summary line.\n\nMore of it.",
                                       {"a": "first and more.", "b": "second."})
    assert parse_docstring(numpy) == ("Summary.", {"a": "First thing."})
    assert parse_docstring(sphinx) == ("Summary.", {"a": "first thing", "b": "second"})
    assert parse_docstring(None) == (None, {})


def test_RT22_validate_arguments_checks_without_running() -> None:
    assert forecast.validate_arguments is not None
    forecast.validate_arguments({"place": {"city": "Paris"}})
    with pytest.raises(ToolArgumentError, match="place: Field required"):
        forecast.validate_arguments({})


def test_RT22_the_inferred_schema_and_the_error_reach_a_provider_through_its_sdk() -> None:
    @tool
    async def add(a: int, b: int) -> int:
        """Add two numbers."""
        return a + b

    async def main() -> None:
        replies = [openai_tool_calls(("call_1", "add", '{"a": 1, "b": "x"}')),
                   openai_tool_calls(("call_2", "add", '{"a": 1, "b": 2}')),
                   openai_text("3")]
        async with FakeServer(replies) as server:
            model = OpenAIChat("fake-model", base_url=server.openai_base_url, provider="fakeai")
            async with Agent(model, tools=[add]) as agent:
                result = await agent.run("1 + 2?")
            first, second, third = (request.json for request in server.requests)
        assert result.output == "3"
        assert first["tools"] == [{"type": "function", "function": {
            "name": "add", "description": "Add two numbers.",
            "parameters": {"additionalProperties": False, "type": "object",
                           "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                           "required": ["a", "b"]}}}]
        error = second["messages"][-1]
        assert error["role"] == "tool" and error["tool_call_id"] == "call_1"
        assert error["content"].startswith("Error: arguments: b: Input should be a valid integer")
        assert third["messages"][-1] == {"role": "tool", "tool_call_id": "call_2", "content": "3"}
    run(main)


def test_RT22_without_pydantic_a_typed_tool_names_the_extra() -> None:
    code = ("import sys; sys.modules['pydantic'] = None\n"   # as if it were not installed
            "from machine.runtime import tool, ToolCall\n"
            "@tool\nasync def body(call: ToolCall) -> str:\n    return ''\n"   # no pydantic needed
            "print('a ToolCall body needs no pydantic')\n"
            "@tool\nasync def typed(x: int) -> str:\n    return ''\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 1
    assert ("ImportError: typed tools and structured output need pydantic: pip install "
            "'turnstile-agent[typed]'") in result.stderr
    assert result.stdout == "a ToolCall body needs no pydantic\n"
