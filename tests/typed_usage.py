"""The common ways of using the runtime, written as a user would, checked by ``mypy --strict``
(``make typecheck``) with no casts and no ``Any``; `tests/test_typed_usage.py` runs them too.

``assert_type`` pins what the type checker must infer."""

from __future__ import annotations

import json
from typing import assert_type

from pydantic import BaseModel

from machine import Event, LiveEvent, Message, json_default, thaw
from machine.payloads import (
    AssistantMessageData,
    ExtensionData,
    SettledData,
    SteeringMessageData,
    TurnEndData,
    UserMessageData,
)
from machine.runtime import (
    RETRY,
    Agent,
    Approval,
    Limits,
    MessageFate,
    Next,
    RequestErrorContext,
    RetryAction,
    RunEvent,
    RunOutcome,
    RunResult,
    ScriptedModel,
    Sent,
    ToolCall,
    Usage,
    calls_reply,
    text_reply,
    tool,
)
from machine.store import JsonlStore
from machine.vocabulary import TurnEndReason


@tool(parameters={"type": "object", "properties": {"path": {"type": "string"},
                                                   "limit": {"type": "integer"}}})
async def read(call: ToolCall) -> str:
    """Read the start of a file."""
    path = call.arg("path", str)
    assert_type(path, str)
    limit = call.arg("limit", int, 100)
    assert_type(limit, int)
    everything = call.params
    return f"{path}[:{limit}] of {len(everything)} arguments"


async def retry_twice(context: RequestErrorContext, next: Next[RetryAction | None]
                      ) -> RetryAction | None:
    wait = context.retry_policy.delay(context.failure, len(context.prior_failures) + 1)
    assert_type(wait, float | None)
    return RETRY if wait is not None and len(context.prior_failures) < 2 else await next()


def describe(event: Event) -> str:
    """A listener of every durable event: typed views and `match`."""
    match event.view:
        case UserMessageData(message) | SteeringMessageData(_, message):
            assert_type(message, Message)
            return f"{event.seq} said {message.text}"
        case TurnEndData(turn, reason):
            assert_type(reason, TurnEndReason)
            return f"turn {turn} ended {reason.kind}"
        case AssistantMessageData(message=message, usage=usage):
            return f"model: {message.text} ({thaw(usage) if usage is not None else 'no usage'})"
        case ExtensionData(type=kind):
            return f"extension {kind}"
        case _:
            return event.type


def settled(notice: LiveEvent) -> None:
    reason = notice.payload_as(SettledData).reason
    print("settled", reason.kind, json.dumps(notice.payload, default=json_default))


async def session(store_root: str) -> list[str]:
    """An agent on a stored session, with typed listeners."""
    lines: list[str] = []
    model = ScriptedModel([text_reply("hello")])
    agent = Agent.resume(JsonlStore(store_root), "typed", model, tools=[read], create=True)
    agent.hooks.request_error.use(retry_twice)
    agent.on("*", lambda event: lines.append(describe(event)))
    agent.on("turn/end", lambda event: lines.append(event.data_as(TurnEndData).reason.kind))
    agent.on("agent/settled", settled)
    agent.on("user/message", lambda event: lines.append(event.message.text))
    async with agent:
        agent.followup("hi")
        await agent.when_idle(timeout=30)
    return lines


class Answer(BaseModel):
    """A typed answer (RT23)."""

    word: str
    length: int


@tool(requires_approval=lambda call: call.arguments != {"text": "safe"})
async def count(text: str, call: ToolCall) -> int:
    """Count the characters of a text (a typed tool, RT22)."""
    assert_type(call.call_id, str)
    return len(text)


async def runs() -> list[str]:
    """The run API (RT21), structured output (RT23), limits (RT24), approvals (RT25) and
    fates (RT26), typed."""
    lines: list[str] = []
    model = ScriptedModel([calls_reply(("c1", "count", '{"text": "hello"}')),
                           calls_reply(("c2", "final_result", '{"word": "hello", "length": 5}')),
                           text_reply("plain")])
    async with Agent(model, tools=[count], limits=Limits(steps=5)) as agent:
        def decide(event: Event) -> None:
            pending: tuple[Approval, ...] = agent.approvals
            agent.approve(pending[0].call_id)
        agent.on("approval/request", decide)
        typed = await agent.run("count hello", output_type=Answer)
        assert_type(typed, RunResult[Answer])
        answer = typed.output
        assert_type(answer, Answer)
        outcome: RunOutcome = typed.outcome
        usage: Usage = typed.usage
        lines.append(f"{answer.word} {answer.length} {outcome} {usage.requests}")
        stream = agent.stream("and now?")
        async for item in stream:
            assert_type(item, RunEvent)
            lines.append(item.type)
        plain = await stream.result()
        assert_type(plain.output, str)
        sent = agent.inject("noted")
        assert_type(sent, Sent)
        fate = await sent.wait()
        assert_type(fate, MessageFate)
        lines.append(fate.describe())
    return lines
