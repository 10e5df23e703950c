"""Tools from MCP servers (specs/runtime.md RT28), against a real MCP server written with the
official SDK (tests/fixtures/mcp_server.py), over stdio and over streamable HTTP on
127.0.0.1; the model is scripted, everything else is real."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from scenario_helpers import at, obj
from test_runtime_tools import results as tool_results

from machine.errors import ValidationError
from machine.runtime import Agent, ScriptedModel, calls_reply, text_reply
from machine.runtime.mcp import McpConnectError, McpServer, McpToolError

SERVER = Path(__file__).resolve().parent / "fixtures" / "mcp_server.py"
#: Generous bounds: a server start imports the SDK (seconds on a busy machine).
WAIT = 120.0


def run(main: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(asyncio.wait_for(main(), 4 * WAIT))


def stdio_server(**options: Any) -> McpServer:
    return McpServer.stdio(sys.executable, [str(SERVER), "stdio"], connect_timeout=WAIT,
                           **options)


@pytest.fixture(scope="module")
def http_url() -> Iterator[str]:
    """The fixture server over streamable HTTP on 127.0.0.1 (a port it chose and printed)."""
    process = subprocess.Popen([sys.executable, str(SERVER), "http"], stdout=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, text=True)
    try:
        assert process.stdout is not None
        port = int(process.stdout.readline())
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=WAIT)


def results(agent: Agent) -> list[dict[str, Any]]:
    """Each tool result's text, error flag and code (the call ids left out)."""
    return [{key: value for key, value in result.items() if key != "id"}
            for result in tool_results(agent)]


def turn_ends(agent: Agent) -> list[str]:
    return [str(at(e.data, "reason", "kind")) for e in agent.session.events
            if e.type == "turn/end"]


def call(name: str, arguments: dict[str, Any] | None = None, call_id: str = "c1") -> list[Any]:
    return calls_reply((call_id, name, json.dumps(arguments or {})))


async def asked(agent: Agent, prompt: str = "go") -> None:
    agent.followup(prompt)
    await agent.when_idle(timeout=WAIT)


async def eventually(check: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"not reached in {WAIT:g} s: {what}"
        await asyncio.sleep(0.05)


def test_RT28_stdio_tools_become_agent_tools_with_their_schemas() -> None:
    async def main() -> None:
        async with stdio_server() as server:
            tools = {tool.name: tool for tool in server.tools}
            assert {"add", "shout", "refuse", "crash", "hang"} <= set(tools)
            listed = {tool.name: tool for tool in server.listed}
            assert tools["add"].parameters == listed["add"].input_schema   # as given
            assert tools["add"].description == "Add two integers."
            assert (tools["add"].mode, tools["shout"].mode) == ("parallel", "exclusive")
            model = ScriptedModel([call("add", {"a": 2, "b": 3}), text_reply("five")])
            async with Agent(model, tools=server.tools) as agent:
                await asked(agent)
            advertised = {obj(spec)["name"]: obj(spec) for spec in model.calls[0].tools}
            assert advertised["add"]["parameters"] == listed["add"].input_schema
            assert results(agent) == [{"text": "5", "error": False, "code": None}]
            result = next(e for e in agent.session.events if e.type == "tool/result")
            assert at(result.data, "meta", "mcp", "structuredContent") == {"result": 5}
            assert turn_ends(agent) == ["completed"]
    run(main)


def test_RT28_streamable_http_tools_work_the_same(http_url: str) -> None:
    async def main() -> None:
        async with McpServer.http(http_url, connect_timeout=WAIT) as server:
            assert server.name == http_url
            model = ScriptedModel([calls_reply(("c1", "shout", '{"text": "quiet"}'),
                                               ("c2", "refuse", '{"reason": "no"}')),
                                   text_reply("done")])
            async with Agent(model, tools=server.tools) as agent:
                await asked(agent)
            assert results(agent)[0]["text"] == "QUIET"
            refused = results(agent)[1]
            assert refused["error"] and "refused: no" in refused["text"]
            assert refused["code"] == "MCP_TOOL_ERROR"
            assert turn_ends(agent) == ["completed"]
    run(main)


def test_RT28_http_headers_are_sent_with_every_request(http_url: str) -> None:
    async def main() -> None:
        async with McpServer.http(http_url, headers={"X-Team": "blue"},
                                  connect_timeout=WAIT) as server:
            answer = await server.call("request_header", {"name": "x-team"})
            assert at(answer.content, 0, "text") == "blue"
        async with McpServer.http(http_url, connect_timeout=WAIT) as plain:
            answer = await plain.call("request_header", {"name": "x-team"})
            assert at(answer.content, 0, "text") == "-"
    run(main)


def test_RT28_an_error_result_and_other_content_reach_the_model() -> None:
    async def main() -> None:
        async with stdio_server() as server:
            model = ScriptedModel([calls_reply(("c1", "refuse", '{"reason": "policy"}'),
                                               ("c2", "picture"),
                                               ("c3", "add", '{"a": "x"}')),
                                   text_reply("ok")])
            async with Agent(model, tools=server.tools) as agent:
                await asked(agent)
            refused, picture, invalid = results(agent)
            assert refused["error"] and "refused: policy" in refused["text"]
            assert picture == {"text": "[image content (image/png) not shown]", "error": False,
                               "code": None}
            assert invalid["error"]                  # the server's own argument check
            history = model.calls[1].messages
            assert any("refused: policy" in json.dumps(m.to_json()) for m in history)
    run(main)


def test_RT28_a_cancel_reaches_the_call_in_flight(tmp_path: Path) -> None:
    marker = tmp_path / "marker"

    async def main() -> None:
        async with stdio_server() as server:
            model = ScriptedModel([call("wait_for_cancel", {"marker": str(marker)})])
            async with Agent(model, tools=server.tools) as agent:
                agent.followup("go")
                await eventually(lambda: marker.exists(), "the tool started on the server")
                agent.cancel()
                await agent.when_idle(timeout=WAIT)
                assert turn_ends(agent) == ["aborted"]
                await eventually(lambda: marker.read_text(encoding="utf-8") == "cancelled",
                                 "the server's handler was cancelled")
                # the connection is still good: the next turn calls a tool
                model.replies[:] = [call("add", {"a": 1, "b": 1}, "c2"), text_reply("two")]
                await asked(agent, "again")
                assert results(agent)[-1]["text"] == "2"
    run(main)


def test_RT28_a_crashed_server_is_a_tool_failure_the_model_sees() -> None:
    async def main() -> None:
        server = await stdio_server().start()
        model = ScriptedModel([call("crash"), text_reply("it crashed"),
                               call("add", {"a": 1, "b": 2}, "c2"), text_reply("still gone")])
        agent = Agent(model, tools=server.tools)
        agent.close_on_dispose(server.close)
        agent.followup("crash it")
        agent.followup("then add")              # accepted while the first turn runs
        await agent.when_idle(timeout=WAIT)
        crashed, later = results(agent)
        assert crashed["error"] and crashed["code"] == "MCP_SERVER_GONE"
        assert "Error: MCP server" in crashed["text"]
        assert later["code"] in ("MCP_SERVER_GONE", "MCP_NOT_CONNECTED")
        assert turn_ends(agent) == ["completed", "completed"]     # nothing accepted was lost
        assert not server.connected
        await agent.dispose(timeout=WAIT)
    run(main)


def test_RT28_a_hung_server_times_out_as_a_tool_failure() -> None:
    async def main() -> None:
        async with stdio_server(call_timeout=1.0) as server:
            model = ScriptedModel([call("hang"), text_reply("it hung")])
            async with Agent(model, tools=server.tools) as agent:
                await asked(agent)
            (hung,) = results(agent)
            assert hung["error"] and hung["code"] == "MCP_TIMEOUT"
            assert "no answer after 1 s" in hung["text"]
            assert turn_ends(agent) == ["completed"]
    run(main)


def test_RT28_garbage_fails_the_calls_in_flight_and_the_server_stays_usable() -> None:
    async def main() -> None:
        async with stdio_server() as server:
            model = ScriptedModel([call("garbage"), call("wrong_shape", call_id="c2"),
                                   call("add", {"a": 2, "b": 2}, "c3"), text_reply("done")])
            async with Agent(model, tools=server.tools) as agent:
                await asked(agent)
            garbage, wrong, fine = results(agent)
            assert garbage["code"] == "MCP_GARBAGE" and "not an MCP message" in garbage["text"]
            assert wrong["code"] == "MCP_GARBAGE" and "not an MCP tool result" in wrong["text"]
            assert fine == {"text": "4", "error": False, "code": None}
    run(main)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_RT28_the_server_lives_as_long_as_the_agent() -> None:
    async def main() -> None:
        server = await stdio_server().start()
        model = ScriptedModel([call("pid"), text_reply("ok")])
        agent = Agent(model, tools=server.tools)
        agent.close_on_dispose(server.close)
        await asked(agent)
        pid = int(results(agent)[0]["text"])
        assert _alive(pid) and server.connected
        await agent.dispose(timeout=WAIT)
        assert not server.connected and not _alive(pid)
        with pytest.raises(McpToolError) as refused:
            await server.call("add", {"a": 1, "b": 1})
        assert refused.value.code == "MCP_NOT_CONNECTED"
        with pytest.raises(McpConnectError):
            await server.start()
    run(main)


def test_RT28_a_server_that_cannot_start_is_a_typed_error() -> None:
    async def main() -> None:
        with pytest.raises(McpConnectError, match="cannot connect"):
            await McpServer.stdio("/nonexistent/mcp-server", connect_timeout=WAIT).start()
        silent = McpServer.stdio(sys.executable, ["-c", "import time; time.sleep(600)"],
                                 connect_timeout=1.0)
        with pytest.raises(McpConnectError, match="no handshake after 1 s"):
            await silent.start()
        assert not silent.connected
        with pytest.raises(McpConnectError, match="cannot connect"):
            await McpServer.http("http://127.0.0.1:9/mcp", connect_timeout=WAIT).start()
    run(main)


def test_RT28_bad_options_are_refused_with_their_name() -> None:
    makers: list[tuple[Callable[[], McpServer], str]] = [
                        (lambda: McpServer.stdio(""), "command"),
                        (lambda: McpServer.stdio("x", "a b"), "args"),
                        (lambda: McpServer.http("ftp://x"), "url"),
                        (lambda: McpServer.stdio("x", call_timeout=0), "call_timeout"),
                        (lambda: McpServer.stdio("x", connect_timeout=float("inf")),
                         "connect_timeout"),
                        (lambda: McpServer.stdio("x", modes={"a": "fast"}),  # type: ignore[dict-item]
                         "modes.a")]
    for make, field in makers:
        with pytest.raises(ValidationError) as error:
            make()
        assert error.value.path == field
    with pytest.raises(RuntimeError, match="start"):
        _ = McpServer.stdio("x").tools


def test_RT28_prefix_and_modes_name_and_schedule_the_tools() -> None:
    async def main() -> None:
        async with stdio_server(prefix="calc_", modes={"add": "exclusive"}) as server:
            names = {tool.name: tool.mode for tool in server.tools}
            assert names["calc_add"] == "exclusive" and names["calc_pid"] == "parallel"
            model = ScriptedModel([call("calc_shout", {"text": "hi"}), text_reply("ok")])
            async with Agent(model, tools=server.tools) as agent:
                await asked(agent)
            assert results(agent)[0]["text"] == "HI"
    run(main)



def test_RT7_close_on_dispose_runs_after_teardown_last_first_errors_logged(
        caplog: pytest.LogCaptureFixture) -> None:
    order: list[str] = []

    async def main() -> None:
        agent = Agent(ScriptedModel())

        def closer(name: str, fail: bool = False) -> Callable[[], Awaitable[None]]:
            async def close() -> None:
                assert agent.disposed         # after teardown
                order.append(name)
                if fail:
                    raise RuntimeError(f"{name} failed")
            return close
        agent.close_on_dispose(closer("first"))
        agent.close_on_dispose(closer("second", fail=True))
        with pytest.raises(TypeError):
            agent.close_on_dispose("nope")  # type: ignore[arg-type]
        await asked(agent)
        await agent.dispose()
        assert order == ["second", "first"]
        await agent.dispose()
        assert order == ["second", "first"]     # once
    run(main)
    assert "second failed" in caplog.text
