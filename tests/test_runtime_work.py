"""Where effect work runs (specs/runtime.md RT5): in a task when it runs the user's code,
answered at its delivery when it runs none."""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Generator
from typing import Any

from machine.events import Event
from machine.io import Effect, Output
from machine.runtime import Agent, ScriptedModel, StepContext, Tool, ToolCall, calls_reply, text_reply


def _task_names(agent: Agent, prompts: list[str]) -> tuple[list[str], list[Output]]:
    names: list[str] = []
    outputs: list[Output] = []
    agent.observe(outputs.append)

    async def main() -> None:
        loop = asyncio.get_running_loop()

        def factory(loop: asyncio.AbstractEventLoop,
                    coro: Generator[Any, None, Any] | Coroutine[Any, Any, Any]
                    ) -> asyncio.Task[Any]:
            task = asyncio.Task(coro, loop=loop)
            loop.call_soon(lambda: names.append(task.get_name()))   # named after creation
            return task
        loop.set_task_factory(factory)
        async with agent:
            for prompt in prompts:
                agent.followup(prompt)
                await agent.when_idle(timeout=30)
    asyncio.run(main())
    return [n for n in names if n.startswith("turnstile-")], outputs


def _kinds(names: list[str]) -> list[str]:
    return [n.removeprefix("turnstile-").rsplit("-", 1)[0] for n in names]


def test_RT5_work_that_runs_no_user_code_needs_no_task() -> None:
    agent = Agent(ScriptedModel([text_reply("a"), text_reply("b")]))
    names, outputs = _task_names(agent, ["one", "two"])
    assert _kinds(names) == ["model", "model"]
    kinds = [o.kind for o in outputs if isinstance(o, Effect)]
    assert {"prompt-submit", "step", "system-prompt", "request", "turn-stopping",
            "flush"} <= set(kinds)                  # every effect was still requested


def test_RT5_user_code_always_runs_in_a_task_of_its_own() -> None:
    ran_in: list[str] = []

    async def step(context: StepContext) -> None:
        task = asyncio.current_task()
        ran_in.append(task.get_name() if task is not None else "no task")

    async def system(context: StepContext) -> str:
        task = asyncio.current_task()
        ran_in.append(task.get_name() if task is not None else "no task")
        return "be brief"

    async def body(call: ToolCall) -> str:
        return "ok"

    agent = Agent(ScriptedModel([calls_reply(("c1", "t", "{}")), text_reply("done")]),
                  tools=[Tool("t", body)], system=system)
    agent.hooks.step.use(step)
    names, _ = _task_names(agent, ["go"])
    assert _kinds(names) == ["step", "system-prompt", "model", "tool-execute", "step",
                             "system-prompt", "model"]
    assert all(name.startswith(("turnstile-step-", "turnstile-system-prompt-"))
               for name in ran_in) and len(ran_in) == 4


def test_RT5_an_answered_effect_is_still_seen_by_observers_before_its_consequences() -> None:
    agent = Agent(ScriptedModel([text_reply("a")]))
    _, outputs = _task_names(agent, ["one"])
    order = [o.kind if isinstance(o, Effect) else getattr(getattr(o, "event", None), "type", "")
             for o in outputs]
    assert order.index("step") < order.index("system-prompt") < order.index("step/start")
    assert order.index("request") < order.index("request/header")
    events: list[Event] = list(agent.session.events)
    assert events[-1].type == "turn/end"
