"""Extension points of the runtime: waterfalls and serial hooks (reference §3.2-§3.4;
specs/runtime.md RT8)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from scenario_helpers import at, obj, string

from machine.runtime import (
    RETRY,
    Agent,
    Allow,
    Block,
    Hooks,
    ModelCall,
    ModelFailure,
    Next,
    PromptDecision,
    PromptSubmit,
    RequestContext,
    RequestErrorContext,
    RetryAction,
    ScriptedModel,
    Serial,
    Signal,
    StepContext,
    Tool,
    ToolCall,
    TurnStopping,
    Waterfall,
    calls_reply,
    text_reply,
)
from machine.runtime.hooks import JsonValue
from machine.vocabulary import CancelCause


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


def msg(id_: str, text: str, plugin: str = "guard") -> dict[str, Any]:
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": text}],
            "source": {"kind": "plugin", "plugin": plugin}}


def texts(agent: Agent, *types: str) -> list[str]:
    out: list[str] = []
    for e in agent.session.events:
        if e.type in types:
            message = e.data.get("message", e.data)
            out.append(string(at(message, "content", 0, "text")))
    return out


# --------------------------------------------------------------------------
# Composition
# --------------------------------------------------------------------------


def test_a_waterfall_runs_outermost_first_in_registration_order_with_prepend() -> None:
    trace: list[str] = []
    point: Waterfall[str, str] = Waterfall("demo")

    def handler(name: str) -> Callable[[str, Next[str]], Awaitable[str]]:
        async def h(context: str, next_: Next[str]) -> str:
            trace.append(f"{name}>")
            inner = await next_()
            trace.append(f"<{name}")
            return f"{name}({inner})"
        return h

    point.use(handler("a"))
    point.use(handler("b"))
    point.use(handler("first"), prepend=True)
    result = asyncio.run(point.run("ctx", "default"))
    assert result == "first(a(b(default)))"
    assert trace == ["first>", "a>", "b>", "<b", "<a", "<first"]


def test_a_waterfall_handler_that_does_not_call_next_replaces_the_inside() -> None:
    point: Waterfall[str, str] = Waterfall("demo")
    reached: list[str] = []

    async def inner(context: str, next_: Next[str]) -> str:
        reached.append("inner")
        return await next_()

    async def cut(context: str, next_: Next[str]) -> str:
        return "replaced"

    point.use(cut)
    stop = point.use(inner)
    assert asyncio.run(point.run("ctx", "default")) == "replaced" and reached == []
    stop()
    assert len(point) == 1


def test_a_waterfall_snapshots_its_handlers_at_invocation() -> None:
    point: Waterfall[str, str] = Waterfall("demo")

    async def adds_another(context: str, next_: Next[str]) -> str:
        point.use(late)
        return await next_()

    async def late(context: str, next_: Next[str]) -> str:
        return "late"

    point.use(adds_another)
    assert asyncio.run(point.run("ctx", "default")) == "default"


def test_serial_handlers_run_in_order_and_a_raise_stops_the_rest() -> None:
    point: Serial[str] = Serial("demo")
    trace: list[str] = []

    async def one(context: str) -> None:
        trace.append("one")

    async def boom(context: str) -> None:
        trace.append("boom")
        raise RuntimeError("stop")

    async def never(context: str) -> None:
        trace.append("never")

    for handler in (one, boom, never):
        point.use(handler)
    with pytest.raises(RuntimeError):
        asyncio.run(point.run("ctx"))
    assert trace == ["one", "boom"]


# --------------------------------------------------------------------------
# prompt-submit
# --------------------------------------------------------------------------


def test_prompt_submit_allow_with_content_and_contexts_and_the_admission_signal() -> None:
    seen: list[tuple[str, Signal]] = []

    async def rewrite(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        seen.append((submit.message.text, submit.signal))
        decision = await next_()
        assert isinstance(decision, Allow)
        # The ignores below: `Allow` takes content and contexts in their JSON form (it
        # validates and freezes them), but its fields are typed as the frozen values.
        return Allow(content=[{"type": "text", "text": submit.message.text.upper()}],  # type: ignore[arg-type]
                     additional_contexts=(*decision.additional_contexts,
                                          msg("c2", "outer ctx")))  # type: ignore[arg-type]

    async def context(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        return Allow(additional_contexts=(msg("c1", "inner ctx"),))  # type: ignore[arg-type]  # as above

    async def main() -> None:
        hooks = Hooks()
        hooks.prompt_submit.use(rewrite)
        hooks.prompt_submit.use(context)
        async with Agent(ScriptedModel(), hooks=hooks) as agent:
            agent.followup({"id": "p", "role": "user", "content": [{"type": "text", "text": "hi"}],
                            "source": {"kind": "user"}})
            await agent.when_idle()
            assert texts(agent, "user/message") == ["HI", "inner ctx", "outer ctx"]
            first = agent.session.events[1]
            assert first.data["id"] == "p"                          # the identity is kept
            assert seen[0][0] == "hi" and not seen[0][1].aborted
    run(main)


def test_a_blocked_prompt_leaves_no_trace_and_staged_steering_is_retained() -> None:
    async def guard(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        if "rm -rf" in submit.message.text:
            agent_ref[0].steer("only list files")          # during the admission: steering
            return Block("dangerous")
        return await next_()

    agent_ref: list[Agent] = []

    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            agent_ref.append(agent)
            agent.hooks.prompt_submit.use(guard)
            agent.followup("rm -rf /")
            await agent.when_idle()
            assert not agent.session and agent.core.pending_steering == 1   # retained
            agent.followup("list files")
            await agent.when_idle()
            kinds = [e.type for e in agent.session.events][:3]
            assert kinds == ["turn/start", "steering/message", "user/message"]
            assert texts(agent, "steering/message", "user/message") == ["only list files",
                                                                        "list files"]
    run(main)


def test_a_raising_prompt_handler_drops_only_that_prompt(caplog: pytest.LogCaptureFixture
                                                         ) -> None:
    async def flaky(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        if submit.message.text == "bad":
            raise ValueError("cannot judge")
        return await next_()

    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            agent.hooks.prompt_submit.use(flaky)
            agent.followup("bad")
            agent.followup("good")
            await agent.when_idle()
            assert texts(agent, "user/message") == ["good"]
    with caplog.at_level(logging.WARNING, logger="turnstile"):
        run(main)
    assert "prompt admission failed: cannot judge" in caplog.text


# --------------------------------------------------------------------------
# step, turn-stopping, request, request-error
# --------------------------------------------------------------------------


def test_serial_step_hooks_get_turn_step_and_the_turn_signal() -> None:
    calls: list[tuple[str, int, int, int]] = []

    def hook(name: str) -> Callable[[StepContext], Awaitable[None]]:
        async def h(context: StepContext) -> None:
            calls.append((name, context.turn, context.step, context.signal.id))
        return h

    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            agent.hooks.step.use(hook("a"))
            agent.hooks.step.use(hook("b"))
            agent.followup("go")
            await agent.when_idle()
    run(main)
    assert [c[:3] for c in calls] == [("a", 1, 1), ("b", 1, 1)] and calls[0][3] == calls[1][3]


def test_a_raising_step_hook_fails_only_that_turn() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            async def broken(context: StepContext) -> None:
                if context.turn == 1:
                    raise RuntimeError("step hook broke")
            agent.hooks.step.use(broken)
            errors: list[str] = []
            agent.on("agent/error", lambda e: errors.append(string(obj(e.payload["error"])["message"])))
            agent.followup("one")
            agent.followup("two")
            await agent.when_idle()
            ends = [e.data["reason"] for e in agent.session.events if e.type == "turn/end"]
            assert ends[0] == {"kind": "error", "step": 1, "message": "step hook broke"}
            assert ends[1] == {"kind": "completed"} and errors == ["step hook broke"]
    run(main)


def test_steering_from_turn_stopping_extends_the_turn() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel([text_reply("1"), text_reply("2")])) as agent:
            async def loop_once(context: TurnStopping) -> None:
                steps = sum(1 for e in agent.session.events if e.type == "step/start")
                if steps == 1:
                    agent.steer("keep going")
            agent.hooks.turn_stopping.use(loop_once)
            agent.followup("go")
            await agent.when_idle()
            kinds = [e.type for e in agent.session.events]
            assert kinds.count("turn/start") == 1 and kinds.count("step/start") == 2
            assert texts(agent, "steering/message") == ["keep going"]
    run(main)


def test_the_request_waterfall_changes_the_config_and_the_header_records_it() -> None:
    configs: list[dict[str, JsonValue]] = []

    async def bigger(context: RequestContext, next_: Next[Any]) -> Any:
        config = dict(await next_())
        if context.step == 2:
            config["maxTokens"] = 2048
        return config

    class Recording(ScriptedModel):
        def stream(self, call: ModelCall) -> Any:
            configs.append(dict(call.config))
            return super().stream(call)

    async def main() -> None:
        model = Recording([calls_reply(("c1", "noop")), text_reply("done")])

        async def noop(call: ToolCall) -> str:
            return "ok"
        async with Agent(model, tools=[Tool("noop", noop)], request_options={"maxTokens": 1024},
                         system="be brief") as agent:
            agent.hooks.request.use(bigger)
            agent.followup("go")
            await agent.when_idle()
            headers = [e.data for e in agent.session.events if e.type == "request/header"]
            assert [h["reason"] for h in headers] == ["initial", "change"]
            assert obj(headers[0]["header"])["system"] == "be brief"
            assert obj(headers[0]["header"])["tools"] == [{"name": "noop"}]
    run(main)
    assert [c["maxTokens"] for c in configs] == [1024, 2048]


def test_the_request_error_waterfall_can_ask_for_a_retry() -> None:
    seen: list[RequestErrorContext] = []

    async def retry_once(context: RequestErrorContext, next_: Next[RetryAction | None]
                         ) -> RetryAction | None:
        seen.append(context)
        return RETRY if not context.prior_failures else await next_()

    async def main() -> None:
        failure = ModelFailure("overloaded", "OVERLOADED", status=529, retry_after_ms=10)
        async with Agent(ScriptedModel([failure, text_reply("ok")])) as agent:
            agent.hooks.request_error.use(retry_once)
            agent.followup("go")
            await agent.when_idle()
            triggers = [e.data["trigger"] for e in agent.session.events if e.type == "turn/start"]
            assert triggers[1] == {"kind": "retry"}
            reasons = [obj(e.data["reason"])["kind"] for e in agent.session.events
                       if e.type == "turn/end"]
            assert reasons == ["error", "completed"]
    run(main)
    assert seen[0].failure.status == 529 and seen[0].error.name == "ModelFailure"
    assert seen[0].prior_failures == ()


def test_hooks_see_the_turn_signal_aborted_by_a_cancel() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            observed: list[CancelCause | None] = []

            async def cancels(context: StepContext) -> None:
                agent.cancel("parent")
                observed.append(context.signal.reason)
                await context.signal.wait()
            agent.hooks.step.use(cancels)
            agent.followup("go")
            await agent.when_idle()
            assert observed == [CancelCause("parent")]
            assert [e.data["reason"] for e in agent.session.events
                    if e.type == "turn/end"] == [{"kind": "aborted"}]
    run(main)


def test_a_hook_raising_its_own_cancelled_error_fails_the_turn_instead_of_hanging() -> None:
    async def main() -> None:
        async with Agent(ScriptedModel()) as agent:
            async def awaits_a_cancelled_future(context: StepContext) -> None:
                future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                future.cancel()
                await future
            agent.hooks.step.use(awaits_a_cancelled_future)
            agent.followup("go")
            await agent.when_idle()
            reason = obj(next(e.data["reason"] for e in agent.session.events
                              if e.type == "turn/end"))
            assert reason["kind"] == "error" and reason["message"] == "CancelledError"
    run(main)
