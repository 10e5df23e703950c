"""Tools through the runtime: pools, order, contexts, cancellation (reference §10; specs/runtime.md
RT10)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from scenario_helpers import at, obj

from machine.runtime import (
    Agent,
    RaisedError,
    ScriptedModel,
    Tool,
    ToolCall,
    ToolRegistry,
    ToolResult,
    calls_reply,
    text_reply,
    tool,
)
from machine.vocabulary import ErrorInfo


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 60))


def results(agent: Agent) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for e in agent.session.events:
        if e.type == "tool/result":
            block = obj(at(e.data, "message", "content", 0))
            error = e.data.get("error")
            out.append({"id": block["toolCallId"], "text": at(block, "content", 0, "text"),
                        "error": block.get("isError", False),
                        "code": obj(error).get("code") if error else None})
    return out


def kinds(agent: Agent) -> list[str]:
    return [e.type for e in agent.session.events]


class Concurrency:
    """Counts tool bodies running at once; each body finishes in reverse start order."""

    def __init__(self) -> None:
        self.running = 0
        self.peak = 0
        self.started: list[str] = []

    async def body(self, call: ToolCall) -> str:
        self.running += 1
        self.peak = max(self.peak, self.running)
        self.started.append(call.call_id)
        try:
            # Wait for a second body to join, counted in loop turns rather than time, so
            # the peak a pool reaches does not depend on the machine's speed; a body that
            # runs alone goes on after those turns.
            for _ in range(1000):
                if self.running >= 2:
                    break
                await asyncio.sleep(0)
            # later calls finish first: results must still be committed in model order
            await asyncio.sleep(0.001 * (10 - int(call.call_id[1:])))
        finally:
            self.running -= 1
        return f"done {call.call_id}"


def test_a_parallel_pool_honours_max_parallel_tool_calls_and_commits_in_model_order() -> None:
    counter = Concurrency()
    calls = [(f"c{i}", "fetch") for i in range(1, 6)]

    async def main() -> None:
        model = ScriptedModel([calls_reply(*calls), text_reply("done")])
        async with Agent(model, tools=[Tool("fetch", counter.body, "parallel")],
                         max_parallel_tool_calls=2) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert [r["id"] for r in results(agent)] == [f"c{i}" for i in range(1, 6)]
            assert results(agent)[0]["text"] == "done c1"
    run(main)
    assert counter.peak == 2 and counter.started == [f"c{i}" for i in range(1, 6)]


def test_exclusive_calls_run_alone_and_split_pools() -> None:
    counter = Concurrency()

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "par"), ("c2", "par"), ("c3", "exc"),
                                           ("c4", "par")), text_reply("done")])
        tools = [Tool("par", counter.body, "parallel"), Tool("exc", counter.body)]
        async with Agent(model, tools=tools) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert [r["id"] for r in results(agent)] == ["c1", "c2", "c3", "c4"]
            calls_then_results = [e.type for e in agent.session.events
                                  if e.type in ("tool/call", "tool/result")]
            assert calls_then_results == ["tool/call", "tool/call", "tool/result", "tool/result",
                                          "tool/call", "tool/result", "tool/call", "tool/result"]
    run(main)
    assert counter.peak == 2


def test_contexts_come_after_all_results_and_concludes_turn_ends_the_turn() -> None:
    async def note(call: ToolCall) -> ToolResult:
        context = {"id": f"ctx-{call.call_id}", "role": "user", "source": {"kind": "plugin",
                   "plugin": "notes"}, "content": [{"type": "text", "text": f"ctx {call.call_id}"}]}
        return ToolResult([{"type": "text", "text": "noted"}],  # type: ignore[arg-type]
                          additional_contexts=(context,),  # type: ignore[arg-type]
                          concludes_turn=call.call_id == "c2")

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "note"), ("c2", "note"))])
        async with Agent(model, tools=[Tool("note", note)]) as agent:
            agent.followup("go")
            await agent.when_idle()
            tail = kinds(agent)[-8:]
            assert tail == ["tool/call", "tool/result", "tool/call", "tool/result",
                            "user/message", "user/message", "step/end", "turn/end"]
            assert len(model.calls) == 1                  # the turn concluded after step 1
    run(main)


def test_cancel_during_a_tool_gives_aborted_results_and_pairs_for_calls_not_started() -> None:
    async def main() -> None:
        entered = asyncio.Event()
        release = asyncio.Event()
        ran: list[str] = []

        async def slow(call: ToolCall) -> str:
            ran.append(call.call_id)
            entered.set()
            await release.wait()          # ignores the signal: finishes after the abort
            return "late output"

        model = ScriptedModel([calls_reply(("c1", "slow"), ("c2", "slow"), ("c3", "slow"))])
        async with Agent(model, tools=[Tool("slow", slow)]) as agent:
            agent.followup("go")
            await entered.wait()
            agent.cancel("user")
            release.set()
            await agent.when_idle()
            assert [(r["id"], r["code"]) for r in results(agent)] == [
                ("c1", "ABORTED"), ("c2", "ABORTED_BEFORE_DISPATCH"),
                ("c3", "ABORTED_BEFORE_DISPATCH")]
            assert ran == ["c1"]
            assert kinds(agent)[-8:] == ["tool/call", "tool/result", "tool/call", "tool/result",
                                         "tool/call", "tool/result", "step/end", "turn/end"]
    run(main)


def test_a_cooperative_tool_stops_on_its_signal() -> None:
    async def main() -> None:
        started = asyncio.Event()

        async def waits(call: ToolCall) -> str:
            started.set()
            cause = await call.signal.wait()
            return f"stopped by {cause.kind}"

        model = ScriptedModel([calls_reply(("c1", "waits"))])
        async with Agent(model, tools=[Tool("waits", waits)]) as agent:
            agent.followup("go")
            await started.wait()
            agent.cancel("user")
            await agent.when_idle()
            assert results(agent)[0]["code"] == "ABORTED"
    run(main)


def test_R10_12_a_failing_body_is_an_error_result_whatever_it_raises() -> None:
    """RT9: a RaisedError reports its ErrorInfo exactly (its code included); any other
    exception is described by ErrorInfo.from_exception."""
    async def broken(call: ToolCall) -> str:
        raise FileNotFoundError("no such file: a.txt")

    async def fatal(call: ToolCall) -> str:
        raise RaisedError(ErrorInfo("runner crashed", "RunnerError", "RUNNER_DOWN"))

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "broken")), text_reply("sorry"),
                               calls_reply(("c2", "fatal"))])
        async with Agent(model, tools=[Tool("broken", broken), Tool("fatal", fatal)]) as agent:
            agent.followup("read it")
            agent.followup("again")
            await agent.when_idle()
            first, second = results(agent)
            assert first["text"] == "Error: no such file: a.txt"
            assert second["text"] == "Error: runner crashed" and second["code"] == "RUNNER_DOWN"
            ends = [e.data["reason"] for e in agent.session.events if e.type == "turn/end"]
            assert ends == [{"kind": "completed"}, {"kind": "completed"}]
    run(main)


def test_unknown_tools_get_an_error_result_unless_there_is_a_fallback() -> None:
    async def anything(call: ToolCall) -> str:
        return f"handled {call.name}"

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "missing")), text_reply("ok"),
                               calls_reply(("c2", "missing")), text_reply("ok")])
        async with Agent(model) as agent:
            agent.followup("one")
            await agent.when_idle()
            assert results(agent)[0]["code"] == "UNKNOWN_TOOL"
        registry = ToolRegistry([], fallback=Tool("proxy", anything))
        async with Agent(model, tools=registry) as agent:
            agent.followup("two")
            await agent.when_idle()
            assert results(agent)[0]["text"] == "handled missing"
    run(main)


def test_prepare_can_answer_and_finalize_post_processes() -> None:
    bodies: list[str] = []

    async def body(call: ToolCall) -> str:
        bodies.append(call.call_id)
        return "raw"

    async def cached(call: ToolCall) -> str | None:
        return "from cache" if call.arguments == {"cached": True} else None

    async def shout(call: ToolCall, result: ToolResult) -> ToolResult:
        return ToolResult([{"type": "text", "text": "RAW!"}])  # type: ignore[arg-type]

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "t", '{"cached": true}'), ("c2", "t", "")),
                               text_reply("ok")])
        async with Agent(model, tools=[Tool("t", body, prepare=cached,
                                            finalize=shout)]) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert [r["text"] for r in results(agent)] == ["from cache", "RAW!"]
    run(main)
    assert bodies == ["c2"]


def test_tool_calls_get_parsed_arguments() -> None:
    seen: list[Any] = []

    async def record(call: ToolCall) -> str:
        seen.append(call.arguments)
        return "ok"

    async def main() -> None:
        model = ScriptedModel([calls_reply(("c1", "r", ""), ("c2", "r", '{"x": [1, 2]}'),
                                           ("c3", "r", "not json")), text_reply("ok")])
        async with Agent(model, tools=[Tool("r", record)]) as agent:
            agent.followup("go")
            await agent.when_idle()
    run(main)
    assert seen == [{}, {"x": [1, 2]}, "not json"]


def test_the_tool_decorator_and_specs() -> None:
    @tool(mode="parallel", parameters={"type": "object"})
    async def search(call: ToolCall) -> str:
        """Search the web."""
        return "results"

    assert search.name == "search" and search.mode == "parallel"
    assert search.spec() == {"name": "search", "description": "Search the web.",
                             "parameters": {"type": "object"}}
    registry = ToolRegistry([search])
    assert registry.modes() == {"search": "parallel"} and "search" in registry
