"""Structured output (specs/runtime.md RT23): ``output_type=`` through the provider's native
structured output where the adapter has it, else a final-answer tool; a failed answer re-asked
a bounded number of times, then the turn ends ``OUTPUT_INVALID`` and the result's output
raises `OutputValidationError`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import pytest
from pydantic import BaseModel, Field
from scenario_helpers import at, obj
from typing_extensions import TypedDict

from machine.errors import ValidationError
from machine.events import Event
from machine.payloads import TurnEndData
from machine.runtime import (
    Agent,
    Block,
    NoOutputError,
    OutputValidationError,
    ScriptedModel,
    Tool,
    ToolCall,
    TurnStopping,
    calls_reply,
    text_reply,
)
from machine.runtime.adapters.anthropic import AnthropicMessages
from machine.runtime.adapters.fake_server import (
    FakeServer,
    anthropic_text,
    anthropic_tool_calls,
    openai_text,
    openai_tool_calls,
)
from machine.runtime.adapters.openai import OpenAIChat
from machine.runtime.adapters.schemas import anthropic_format, openai_format


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


class Weather(BaseModel):
    """The weather in one city."""

    city: str
    temperature: float = Field(ge=-90, le=60, description="degrees Celsius")


@dataclass
class Point:
    x: int
    y: int


class Opaque:
    """No JSON Schema describes it."""


class Person(TypedDict):
    name: str
    age: int


def steering_texts(events: tuple[Event, ...] | list[Event]) -> list[str]:
    return [str(at(e.data, "message", "content", 0, "text")) for e in events
            if e.type == "steering/message"]


def tool_texts(events: tuple[Event, ...] | list[Event]) -> list[str]:
    return [str(at(e.data, "message", "content", 0, "content", 0, "text")) for e in events
            if e.type == "tool/result"]


def test_RT23_the_final_answer_tool_gives_a_typed_output_and_ends_the_turn() -> None:
    async def main() -> None:
        model = ScriptedModel([
            calls_reply(("c1", "final_result", '{"city": "Lyon", "temperature": 21.5}')),
            text_reply("never asked")])
        async with Agent(model) as agent:
            result = await agent.run("weather in Lyon?", output_type=Weather)
            assert result.outcome == "completed" and result.ok
            assert result.output == Weather(city="Lyon", temperature=21.5)
            assert isinstance(result.output, Weather)
            assert len(model.calls) == 1                # concludesTurn: no second step
            (spec,) = model.calls[0].tools
            assert obj(spec)["name"] == "final_result"
            assert obj(spec)["description"] == "The weather in one city."
            assert obj(obj(spec)["parameters"])["required"] == ["city", "temperature"]
            assert tool_texts(result.events) == ["Final answer accepted."]
            plain = await agent.run("and now?")          # a run without output_type
            assert plain.output == "never asked" and model.calls[-1].tools == ()
    run(main)


def test_RT23_a_text_answer_and_invalid_arguments_are_re_asked_then_accepted() -> None:
    async def main() -> None:
        model = ScriptedModel([
            text_reply("it is sunny"),
            calls_reply(("c1", "final_result", '{"city": "Lyon", "temperature": 99}')),
            calls_reply(("c2", "final_result", '{"city": "Lyon", "temperature": 19}'))])
        async with Agent(model) as agent:
            result = await agent.run("weather?", output_type=Weather, output_retries=2)
            assert result.output.temperature == 19 and result.turns == (1,)
            assert steering_texts(result.events) == [
                "Give your final answer by calling the `final_result` tool with it as its "
                "arguments; a plain text answer is not accepted."]
            assert tool_texts(result.events) == [
                "Error: output: temperature: Input should be less than or equal to 60 (got 99)",
                "Final answer accepted."]
            steering = next(e for e in result.events if e.type == "steering/message")
            assert obj(at(steering.data, "message", "source")) == {"kind": "plugin",
                                                                   "plugin": "output"}
    run(main)


def test_RT23_when_the_re_asks_are_used_up_the_turn_ends_OUTPUT_INVALID() -> None:
    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "final_result", '{"city": 1}')),
                               calls_reply(("c2", "final_result", "{}")),
                               text_reply("never requested")])
        async with Agent(model) as agent:
            result = await agent.run("weather?", output_type=Weather, output_retries=1)
            assert result.outcome == "invalid-output" and not result.ok
            assert len(model.calls) == 2
            end = next(e.data_as(TurnEndData) for e in result.events if e.type == "turn/end")
            assert end.reason.kind == "error" and end.reason.code == "OUTPUT_INVALID"
            assert end.reason.step == 3             # the next step's hook ended the turn
            with pytest.raises(OutputValidationError) as raised:
                _ = result.output
            assert raised.value.code == "OUTPUT_INVALID" and len(raised.value.problems) == 2
            assert raised.value.problems[1] == "output: city: Field required; temperature: " \
                "Field required"
            assert str(raised.value).startswith("the structured output failed validation "
                                                "(2 attempts, 1 re-ask allowed)")
    run(main)


def test_RT23_native_output_validates_the_answer_and_re_asks_by_steering() -> None:
    async def main() -> None:
        model = ScriptedModel([text_reply('{"city": "Oslo"}'), text_reply("not json"),
                               text_reply('{"city": "Oslo", "temperature": -3}')],
                              native_output=True)
        async with Agent(model) as agent:
            result = await agent.run("weather?", output_type=Weather)
            assert result.output == Weather(city="Oslo", temperature=-3)
            assert result.text == '{"city": "Oslo", "temperature": -3}'
            assert [c.tools for c in model.calls] == [(), (), ()]    # no final-answer tool
            schema = model.calls[0].config["output_schema"]
            assert obj(schema)["required"] == ["city", "temperature"]
            asks = steering_texts(result.events)
            assert asks[0] == ("Your answer does not match the required JSON Schema: output: "
                               "temperature: Field required. Answer again with only the "
                               "corrected JSON value.")
            assert asks[1].startswith("Your answer does not match the required JSON Schema: "
                                      "output: is not JSON: Expecting value at character 0")
            # a later run without output_type: the option is taken back out of the request
            await agent.run("thanks")
            assert "output_schema" not in model.calls[-1].config
            reasons = [e.data["reason"] for e in agent.session.events
                       if e.type == "request/header"]
            assert reasons == ["initial", "change"]
    run(main)


def test_RT23_native_output_that_never_validates_ends_the_turn_at_turn_stopping() -> None:
    async def main() -> None:
        model = ScriptedModel([text_reply("a"), text_reply("b")], native_output=True)
        async with Agent(model) as agent:
            result = await agent.run("weather?", output_type=Weather, output_retries=1)
            assert result.outcome == "invalid-output"
            end = next(e.data_as(TurnEndData) for e in result.events if e.type == "turn/end")
            assert (end.reason.code, end.reason.step) == ("OUTPUT_INVALID", 2)
            with pytest.raises(OutputValidationError):
                _ = result.output
    run(main)


@pytest.mark.parametrize(("output_type", "answer", "expected"), [
    (Point, '{"x": 1, "y": 2}', Point(1, 2)),
    (Person, '{"name": "Ada", "age": "36"}', {"name": "Ada", "age": 36}),
    (list[int], '{"result": [1, 2, 3]}', [1, 2, 3]),
    (int, '{"result": 42}', 42),
])
def test_RT23_dataclasses_typeddicts_and_wrapped_types(output_type: Any, answer: str,
                                                      expected: object) -> None:
    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "final_result", answer))])
        async with Agent(model) as agent:
            result = await agent.run("go", output_type=output_type)
            assert result.output == expected
            parameters = obj(obj(model.calls[0].tools[0])["parameters"])
            assert parameters["type"] == "object"
            if output_type in (int, list[int]):
                assert parameters["required"] == ["result"]
    run(main)


def test_RT23_a_blocked_prompt_has_no_output_and_says_so() -> None:
    async def main() -> None:
        async def block(submit: object, next: object) -> Block:
            return Block("no weather today")
        async with Agent(ScriptedModel()) as agent:
            agent.hooks.prompt_submit.use(block)
            result = await agent.run("weather?", output_type=Weather)
            with pytest.raises(NoOutputError) as raised:
                _ = result.output
            assert not isinstance(raised.value, OutputValidationError)
            assert raised.value.code == "PROMPT_BLOCKED"
    run(main)


def test_RT23_bad_options_are_refused_before_anything_is_sent() -> None:
    async def main() -> None:
        async def noop(call: ToolCall) -> str:
            return ""
        async with Agent(ScriptedModel(), tools=[Tool("final_result", noop)]) as agent:
            with pytest.raises(ValidationError, match="output_retries"):
                await agent.run("x", output_type=Weather, output_retries=-1)
            with pytest.raises(ValidationError, match="output_mode"):
                await agent.run("x", output_type=Weather, output_mode="json")  # type: ignore[call-overload]
            with pytest.raises(ValidationError, match="takes no native structured output"):
                await agent.run("x", output_type=Weather, output_mode="native")
            with pytest.raises(ValidationError, match="name of one of the agent's tools"):
                await agent.run("x", output_type=Weather)
            with pytest.raises(ValueError, match="1 to 64 letters"):
                await agent.run("x", output_type=Weather, output_name="final answer")
            with pytest.raises(TypeError, match="cannot be described as JSON Schema"):
                await agent.run("x", output_type=Opaque)
            assert agent.session.events == () and agent.fates() == ()
    run(main)


def test_RT23_turn_stopping_handlers_run_before_the_output_check() -> None:
    async def main() -> None:
        order: list[str] = []
        model = ScriptedModel([text_reply('{"city": "Rome", "temperature": 30}')],
                              native_output=True)
        async with Agent(model) as agent:
            async def stopping(context: TurnStopping) -> None:
                order.append("handler")
            agent.hooks.turn_stopping.use(stopping)
            result = await agent.run("weather?", output_type=Weather)
            order.append("done")
            assert result.output.city == "Rome" and order == ["handler", "done"]
    run(main)


def test_RT23_openai_native_output_is_a_strict_json_schema_response_format() -> None:
    async def main() -> None:
        replies = [openai_text('{"city": "Lyon", "temperature": 21.5}', pieces=3),
                   openai_text('{"x": 1, "y": 2}'), openai_text("plain")]
        async with FakeServer(replies) as server:
            model = OpenAIChat("gpt-test", base_url=server.openai_base_url,
                               options={"temperature": 0})
            async with Agent(model) as agent:
                weather = await agent.run("weather?", output_type=Weather)
                point = await agent.run("point?", output_type=Point)
                plain = await agent.run("hi")
            bodies = [request.json for request in server.requests]
        assert weather.output == Weather(city="Lyon", temperature=21.5)
        assert point.output == Point(1, 2) and plain.output == "plain"
        assert bodies[0]["response_format"] == {"type": "json_schema", "json_schema": {
            "name": "final_result", "description": "The weather in one city.", "strict": True,
            "schema": {"description": "The weather in one city.", "type": "object",
                       "additionalProperties": False, "required": ["city", "temperature"],
                       "properties": {"city": {"type": "string"}, "temperature": {
                           "description": "degrees Celsius", "maximum": 60, "minimum": -90,
                           "type": "number"}}}}}
        assert bodies[1]["response_format"]["json_schema"]["strict"] is True
        assert "response_format" not in bodies[2] and bodies[2]["temperature"] == 0
        assert all("tools" not in body for body in bodies)
    run(main)


class Report(BaseModel):
    title: str
    tags: list[str] = []
    counts: dict[str, int] = {}


def test_RT23_openai_a_schema_strict_mode_cannot_take_is_sent_non_strict() -> None:
    body = openai_format(Report.model_json_schema(), "report", None)
    assert body["json_schema"]["strict"] is False
    assert body["json_schema"]["schema"]["additionalProperties"] is False


def test_RT23_a_provider_without_native_output_gets_the_final_answer_tool() -> None:
    async def main() -> None:
        replies = [openai_tool_calls(("call_1", "final_result", '{"city": "Pau", '
                                                                '"temperature": 12}'))]
        async with FakeServer(replies) as server:
            model = OpenAIChat("deepseek-chat", base_url=server.openai_base_url,
                               provider="deepseek")
            async with Agent(model) as agent:
                result = await agent.run("weather?", output_type=Weather)
            (body,) = [request.json for request in server.requests]
        assert result.output.city == "Pau"
        assert "response_format" not in body
        assert [t["function"]["name"] for t in body["tools"]] == ["final_result"]
    run(main)


def test_RT23_anthropic_native_output_is_output_config_format() -> None:
    async def main() -> None:
        replies = [anthropic_text('{"city": "Nice", "temperature": 25}'),
                   anthropic_tool_calls(("toolu_1", "final_result",
                                         '{"title": "t", "counts": {"a": 1}}'))]
        async with FakeServer(replies) as server:
            model = AnthropicMessages("claude-test", base_url=server.base_url,
                                      options={"output_config": {"effort": "low"}})
            async with Agent(model) as agent:
                weather = await agent.run("weather?", output_type=Weather)
                report = await agent.run("report?", output_type=Report)  # an open object
            bodies = [request.json for request in server.requests]
        assert weather.output.city == "Nice" and report.output.counts == {"a": 1}
        assert bodies[0]["output_config"] == {"effort": "low", "format": {
            "type": "json_schema", "schema": {
                "description": "The weather in one city.", "type": "object",
                "additionalProperties": False, "required": ["city", "temperature"],
                "properties": {"city": {"type": "string"}, "temperature": {
                    "description": "degrees Celsius (minimum: -90, maximum: 60)",
                    "type": "number"}}}}}
        # Anthropic refuses open objects: the run falls back to the final-answer tool
        assert bodies[1]["output_config"] == {"effort": "low"}
        assert [t["name"] for t in bodies[1]["tools"]] == ["final_result"]
    run(main)


def test_RT23_the_provider_formats_handle_names_refs_and_recursion() -> None:
    class Node(BaseModel):
        name: str
        children: list[Node]

    class Holder(BaseModel):
        default: str = Field(description="a property named like a keyword")
        minimum: Weather = Field(description="nested, with a description beside its $ref")

    assert anthropic_format(Node.model_json_schema()) is None        # recursion
    assert openai_format(Node.model_json_schema(), "n", None)["json_schema"]["strict"] is False
    holder = openai_format(Holder.model_json_schema(), "h", None)["json_schema"]
    assert holder["strict"] is True
    properties = holder["schema"]["properties"]
    assert set(properties) == {"default", "minimum"}                  # names are not keywords
    nested = properties["minimum"]
    assert "$ref" not in nested and nested["description"] == (
        "nested, with a description beside its $ref")
    assert nested["properties"]["city"]["type"] == "string"
    anthropic = anthropic_format(Holder.model_json_schema())
    assert anthropic is not None
    assert json.dumps(anthropic).count('"additionalProperties": false') == 2
