"""OpenTelemetry traces of an agent (specs/runtime.md RT29), recorded by the SDK's in-memory
exporter: spans per turn, step, model request and tool call named and attributed after the
GenAI semantic conventions, span events, the retry link, and no change to what the agent
does."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF
from opentelemetry.trace import NoOpTracer, NoOpTracerProvider, Span, SpanKind, StatusCode, Tracer

from machine.jsonvalue import FrozenList, freeze
from machine.runtime import (
    Agent,
    Allow,
    Block,
    Hang,
    ModelFailure,
    PromptSubmit,
    RetryPolicy,
    ScriptedModel,
    ToolCall,
    calls_reply,
    retry_request,
    tool,
    user_message,
)
from machine.runtime.hooks import Next
from machine.runtime.tracing import trace_agent
from machine.vocabulary import PromptDecision, plugin_source

WAIT = 60.0


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), WAIT))


@tool(description="Look a word up.")
async def lookup(call: ToolCall) -> str:
    word = call.arg("word", str)
    if word == "missing":
        raise KeyError(word)
    return f"{word}: a word"


def usage_reply(text: str, inputs: int, outputs: int) -> list[Any]:
    return [{"type": "text", "text": text},
            {"type": "usage", "usage": {"inputTokens": inputs, "outputTokens": outputs}},
            {"type": "finish", "kind": "stop"}]


def traced(model: ScriptedModel, **options: Any) -> tuple[Agent, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(model, tools=[lookup], request_options={"maxTokens": 256, "temperature": 0.2},
                  **options)
    trace_agent(agent, tracer_provider=provider, agent_name="helper",
                conversation_id="conv-1")
    return agent, exporter


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def attrs(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def parent_of(span: ReadableSpan, spans: Sequence[ReadableSpan]) -> ReadableSpan | None:
    if span.parent is None:
        return None
    return next(s for s in spans if s.context is not None
                and s.context.span_id == span.parent.span_id)


def test_RT29_spans_per_turn_step_model_request_and_tool_call() -> None:
    model = ScriptedModel([calls_reply(("c1", "lookup", '{"word": "tide"}'),
                                       ("c2", "lookup", '{"word": "missing"}')),
                           usage_reply("done", 40, 9)], provider="acme", model="acme-1")

    async def main() -> None:
        agent, exporter = traced(model)
        async with agent:
            agent.followup("define tide")
            await agent.when_idle()
        spans = exporter.get_finished_spans()
        (turn,) = named(spans, "invoke_agent helper")
        assert turn.kind == SpanKind.INTERNAL and turn.parent is None
        assert attrs(turn) == {"gen_ai.operation.name": "invoke_agent",
                               "gen_ai.agent.name": "helper", "gen_ai.conversation.id": "conv-1",
                               "turnstile.turn": 1, "turnstile.trigger": "message",
                               "turnstile.turn.end": "completed"}
        assert turn.status.status_code == StatusCode.UNSET
        steps = named(spans, "turnstile.step")
        assert [attrs(s)["turnstile.step"] for s in steps] == [1, 2]
        assert all(parent_of(s, spans) is turn for s in steps)
        chats = named(spans, "chat acme-1")
        assert len(chats) == 2 and all(c.kind == SpanKind.CLIENT for c in chats)
        assert [parent_of(c, spans) for c in chats] == steps
        assert attrs(chats[1]) == {"gen_ai.operation.name": "chat",
                                   "gen_ai.provider.name": "acme",
                                   "gen_ai.request.model": "acme-1",
                                   "gen_ai.request.max_tokens": 256,
                                   "gen_ai.request.temperature": 0.2,
                                   "gen_ai.response.finish_reasons": ("stop",),
                                   "gen_ai.usage.input_tokens": 40,
                                   "gen_ai.usage.output_tokens": 9}
        found, failed = named(spans, "execute_tool lookup")
        assert parent_of(found, spans) is steps[0]
        assert attrs(found) == {"gen_ai.operation.name": "execute_tool",
                                "gen_ai.tool.name": "lookup", "gen_ai.tool.call.id": "c1",
                                "gen_ai.tool.type": "function",
                                "gen_ai.tool.description": "Look a word up."}
        assert found.status.status_code == StatusCode.UNSET
        assert failed.status.status_code == StatusCode.ERROR
        assert attrs(failed)["error.type"] == "_OTHER"       # an uncoded exception (R10.12)
        # the tool spans lie inside the model's step, after its request
        assert chats[0].end_time is not None and found.start_time is not None
        assert chats[0].end_time <= found.start_time
    run(main)


def test_RT29_a_retried_turn_is_linked_to_the_failed_one() -> None:
    model = ScriptedModel([ModelFailure("overloaded", "UNAVAILABLE", status=503),
                           usage_reply("ok", 1, 1)])

    async def main() -> None:
        agent, exporter = traced(model, retry_policy=RetryPolicy(base_delay=0.001))
        agent.hooks.request_error.use(retry_request)
        async with agent:
            agent.followup("hi")
            await agent.when_idle()
        spans = exporter.get_finished_spans()
        failed, retry = named(spans, "invoke_agent helper")
        assert failed.status.status_code == StatusCode.ERROR
        assert attrs(failed)["error.type"] == "UNAVAILABLE"
        assert attrs(failed)["turnstile.turn.end"] == "error"
        (chat, _) = named(spans, "chat scripted-1")
        assert chat.status.status_code == StatusCode.ERROR
        assert attrs(chat)["error.type"] == "UNAVAILABLE"
        assert parent_of(chat, spans) is not None
        assert attrs(retry)["turnstile.trigger"] == "retry"
        assert failed.context is not None
        assert [link.context.span_id for link in retry.links] == [failed.context.span_id]
        assert retry.status.status_code == StatusCode.UNSET
    run(main)


def test_RT29_steering_context_cancel_and_admission_verdicts_are_span_events() -> None:
    model = ScriptedModel([Hang(), usage_reply("a", 1, 1)])

    async def gate(submit: PromptSubmit, rest: Next[PromptDecision]) -> PromptDecision:
        if submit.message.text.startswith("bad"):
            return Block("not allowed")
        return await rest()

    async def main() -> None:
        agent, exporter = traced(model)
        agent.hooks.prompt_submit.use(gate)
        async with agent:
            agent.followup("bad first")
            agent.followup("wait")
            while not agent.accepts_next_step:
                await asyncio.sleep(0.01)
            agent.steer("faster")
            agent.inject(user_message("ctx-1", "the file changed", plugin_source("watcher")))
            agent.cancel()
            await agent.when_idle()
            agent.followup("bad again")             # blocked, and no turn follows
            await agent.when_idle()
        spans = exporter.get_finished_spans()
        (turn,) = named(spans, "invoke_agent helper")
        events = [(e.name, dict(e.attributes or {})) for e in turn.events]
        assert ("turnstile.admission", {"turnstile.verdict": "block",
                                        "turnstile.message.id": "user-1"}) in events
        assert ("turnstile.admission", {"turnstile.verdict": "allow",
                                        "turnstile.message.id": "user-2"}) in events
        assert ("turnstile.cancel", {"turnstile.cause": "user"}) in events
        (alone,) = named(spans, "turnstile.admission")
        assert [dict(e.attributes or {}) for e in alone.events] == [
            {"turnstile.verdict": "block", "turnstile.message.id": "user-4"}]
    run(main)


def test_RT29_steering_and_context_taken_by_a_step_are_events_of_that_step() -> None:
    """Steering and context staged during step 1 are drained at its end (R11): the step
    that took them carries the events."""
    model = ScriptedModel([calls_reply(("c1", "lookup", '{"word": "a"}')),
                           usage_reply("b", 1, 1)], chunk_delay=0.01)

    async def main() -> None:
        agent, exporter = traced(model)
        trace_agent(agent, tracer_provider=_provider(exporter2 := InMemorySpanExporter()),
                    capture_content=True)
        async with agent:
            agent.followup("go")
            while not agent.accepts_next_step:
                await asyncio.sleep(0.005)
            agent.steer("use short words")
            agent.inject(user_message("ctx-1", "dictionary updated", plugin_source("dict")))
            await agent.when_idle()
        steps = named(exporter.get_finished_spans(), "turnstile.step")
        first = [(e.name, dict(e.attributes or {})) for e in steps[0].events]
        assert ("turnstile.steering", {"turnstile.message.id": "user-2",
                                       "turnstile.source.kind": "user"}) in first
        assert ("turnstile.context", {"turnstile.message.id": "ctx-1",
                                      "turnstile.source.kind": "plugin",
                                      "turnstile.source.plugin": "dict"}) in first
        detailed = named(exporter2.get_finished_spans(), "turnstile.step")[0]
        texts = [dict(e.attributes or {}).get("turnstile.message.text") for e in detailed.events]
        assert "use short words" in texts and "dictionary updated" in texts
        (call,) = named(exporter2.get_finished_spans(), "execute_tool lookup")
        assert attrs(call)["gen_ai.tool.call.arguments"] == '{"word": "a"}'
        assert "a: a word" in str(attrs(call)["gen_ai.tool.call.result"])
    run(main)


def _provider(exporter: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def test_RT29_tracing_changes_nothing_the_agent_does_and_can_be_stopped() -> None:
    def replies() -> list[Any]:
        return [calls_reply(("c1", "lookup", '{"word": "x"}')), usage_reply("y", 2, 3),
                ModelFailure("down", "UNAVAILABLE"), usage_reply("z", 1, 1)]

    async def session(trace: bool) -> list[Any]:
        model = ScriptedModel(replies())
        agent = Agent(model, tools=[lookup], clock=lambda: 0.0)
        if trace:
            stop = trace_agent(agent, tracer_provider=_provider(InMemorySpanExporter()))
        agent.hooks.request_error.use(retry_request)
        async with agent:
            agent.followup("one")
            agent.followup("two")
            await agent.when_idle()
            if trace:
                stop()
        return [e.to_json() for e in agent.session.events]

    async def main() -> None:
        assert await session(True) == await session(False)
    run(main)


def test_RT29_an_allow_with_rewritten_content_is_still_an_allow() -> None:
    async def rewrite(submit: PromptSubmit, rest: Next[PromptDecision]) -> PromptDecision:
        content = freeze([{"type": "text", "text": "rewritten"}])
        assert isinstance(content, FrozenList)
        return Allow(content=content)

    async def main() -> None:
        agent, exporter = traced(ScriptedModel([usage_reply("ok", 1, 1)]))
        agent.hooks.prompt_submit.use(rewrite)
        async with agent:
            agent.followup("original")
            await agent.when_idle()
        (turn,) = named(exporter.get_finished_spans(), "invoke_agent helper")
        assert [dict(e.attributes or {}) for e in turn.events] == [
            {"turnstile.verdict": "allow", "turnstile.message.id": "user-1"}]
    run(main)


@pytest.mark.parametrize("kind", ["max-tokens", "error"])
def test_RT29_finish_reasons_follow_the_conventions(kind: str) -> None:
    finish: dict[str, Any] = {"type": "finish", "kind": kind}
    if kind == "error":
        finish["failure"] = {"message": "stream broke", "code": "STREAM_ERROR"}

    async def main() -> None:
        agent, exporter = traced(ScriptedModel([[{"type": "text", "text": "t"}, finish]]))
        async with agent:
            agent.followup("go")
            await agent.when_idle()
        (chat,) = named(exporter.get_finished_spans(), "chat scripted-1")
        reasons = attrs(chat)["gen_ai.response.finish_reasons"]
        assert reasons == ("length",) if kind == "max-tokens" else ("error",)
        if kind == "error":
            assert chat.status.status_code == StatusCode.ERROR
            assert attrs(chat)["error.type"] == "STREAM_ERROR"
    run(main)


class CountingProvider(NoOpTracerProvider):
    """A tracer provider that records nothing, counting the spans asked of it."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def get_tracer(self, *args: Any, **kwargs: Any) -> Tracer:
        provider = self

        class Counting(NoOpTracer):
            def start_span(self, name: str, *more: Any, **options: Any) -> Span:
                provider.started.append(name)
                return super().start_span(name, *more, **options)
        return Counting()


def test_RT29_a_turn_that_does_not_record_costs_one_span() -> None:
    """No SDK (or sampled out): the turn's span does not record, so its steps, requests
    and calls get no span of their own."""
    provider = CountingProvider()

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "lookup", '{"word": "a"}')),
                               usage_reply("b", 1, 1), usage_reply("c", 1, 1)])
        agent = Agent(model, tools=[lookup])
        trace_agent(agent, tracer_provider=provider)
        async with agent:
            agent.followup("one")
            agent.followup("two")
            await agent.when_idle()
    run(main)
    assert provider.started == ["invoke_agent turnstile", "invoke_agent turnstile"]
    sampled_out = InMemorySpanExporter()
    sdk = TracerProvider(sampler=ALWAYS_OFF)
    sdk.add_span_processor(SimpleSpanProcessor(sampled_out))

    async def sampled() -> None:
        agent = Agent(ScriptedModel([calls_reply(("c1", "lookup", '{"word": "a"}'))]),
                      tools=[lookup])
        trace_agent(agent, tracer_provider=sdk)
        async with agent:
            agent.followup("one")
            await agent.when_idle()
    run(sampled)
    assert sampled_out.get_finished_spans() == ()
