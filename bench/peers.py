"""A whole turn beside the peers (issue 27, item 5): client CPU per agent turn through the
real adapters and SDKs, against a local server in another process, at long histories.

Each agent holds a history of N messages (turns of four: a prompt, a call with its text, its
result, an answer) and runs further turns of the same shape: the prompt goes to the model,
which calls the ``read`` tool; the tool's result goes back and the model answers. That is two
streamed requests per turn, each carrying the whole history. Every agent runs in a fresh
process, one after the other, so the client's CPU time (`time.process_time`; the server is
another process) is what a user's process pays for a turn, the framework's own work, the
mapping of its history and the SDK's encoding of the request all counted:

* turnstile: `machine.runtime.Agent` with `OpenAIChat` (its default: each message encoded
  once, the body posted through the SDK client's transport), seeded with the history as its
  session, ``agent.run(prompt)`` per turn;
* pydantic-ai: ``Agent(OpenAIChatModel(...), tools=[read])``, ``run_stream_events`` per turn
  with the history as ``message_history`` (the messages of the previous run carried over);
* the OpenAI Agents SDK: ``Agent(model=OpenAIChatCompletionsModel(...), tools=[read])``,
  ``Runner.run_streamed`` per turn with the history as its input items (tracing disabled, so
  nothing is exported).

The figure is the median CPU time of the turns after the first (a running session), and the
first turn apart (a process that has just resumed a long session).
"""

from __future__ import annotations

import importlib.util
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import (
    Section,
    child_figures,
    load_text,
    local_server,
    paired_rows,
    server_script,
)

SIZES = (1_000, 10_000)
QUICK_SIZES = (12,)
#: Turns run after the history is built; the first is reported apart.
TURNS = 6
QUICK_TURNS = 2
#: (label, how, the module the path needs).
PATHS = (("turnstile Agent + OpenAIChat", "turnstile", "openai"),
         ("pydantic-ai Agent + OpenAIChatModel", "pydantic-ai", "pydantic_ai"),
         ("OpenAI Agents SDK + OpenAIChatCompletionsModel", "agents-sdk", "agents"))

SERVER = server_script("""
ANSWER = openai_text("It doubles its input and returns it.", usage=(5, 2))
calls = itertools.count(1)

def choose(request):
    # a model that calls `read` once per prompt, then answers: the last message of the
    # request says which (a tool result: answer; anything else: call the tool)
    last = json.loads(request.body)["messages"][-1]
    if last.get("role") == "tool":
        return ANSWER
    return openai_tool_calls((f"call_peer_{next(calls)}", "read", '{"path": "src/file.py"}'),
                             text="Let me read it.")
""")

MEASURE = r"""
import asyncio, json, statistics, sys, time

how, size, turns, url = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
SOURCE = "def double(x):\n    return x * 2\n"
PROMPT = "Please look at file number {} and tell me what its function does."

def history_turns():
    # the history's turns: (prompt, call id, path, answer)
    return [(PROMPT.format(t), f"call_{t}", f"src/file_{t}.py",
             "It doubles its input and returns it.") for t in range(1, max(1, size // 4) + 1)]

READS = []

async def read_body(path):
    READS.append(path)   # the tool ran: each turn must have called it once
    return SOURCE

if how == "turnstile":
    from machine.log import SessionLog
    from machine.runtime import Agent, ToolCall, tool
    from machine.runtime.adapters.openai import OpenAIChat

    MODEL = {"kind": "model", "provider": "openai", "model": "m"}

    def seeded():
        log = SessionLog(clock=lambda: 1.0)
        for t, (prompt, call_id, path, answer) in enumerate(history_turns(), 1):
            arguments = {"path": path}
            log.append("turn/start", {"turn": t, "trigger": {"kind": "message",
                                                             "source": {"kind": "user"}}})
            log.append("user/message", {"id": f"u{t}", "role": "user", "content": [
                {"type": "text", "text": prompt}], "source": {"kind": "user"}},
                surface_op="append")
            log.append("step/start", {"turn": t, "step": 1})
            log.append("assistant/message", {"turn": t, "step": 1, "message": {
                "id": f"a{t}", "role": "assistant", "content": [
                    {"type": "text", "text": "Let me read it."},
                    {"type": "tool-call", "id": call_id, "name": "read",
                     "arguments": json.dumps(arguments)}], "source": MODEL}},
                surface_op="append", source_event_seqs=[])
            call = log.append("tool/call", {"turn": t, "step": 1, "callId": call_id,
                                            "name": "read", "arguments": arguments})
            log.append("tool/result", {"turn": t, "step": 1, "message": {
                "id": f"r{t}", "role": "user", "content": [
                    {"type": "tool-result", "toolCallId": call_id,
                     "content": [{"type": "text", "text": SOURCE}]}],
                "source": {"kind": "tool", "callId": call_id}}},
                surface_op="append", source_event_seqs=[call.seq])
            log.append("step/end", {"turn": t, "step": 1})
            log.append("step/start", {"turn": t, "step": 2})
            log.append("assistant/message", {"turn": t, "step": 2, "message": {
                "id": f"b{t}", "role": "assistant", "content": [
                    {"type": "text", "text": answer}], "source": MODEL}},
                surface_op="append", source_event_seqs=[])
            log.append("step/end", {"turn": t, "step": 2})
            log.append("turn/end", {"turn": t, "reason": {"kind": "completed"}})
        return log

    @tool(parameters={"type": "object", "properties": {"path": {"type": "string"}},
                      "required": ["path"]})
    async def read(call: ToolCall) -> str:
        "Read a file."
        return await read_body(call.arg("path", str))

    async def main():
        agent = Agent(OpenAIChat("m", base_url=url + "/v1", api_key="k"), tools=[read],
                      system="Be brief.", session=seeded(), session_start="resume")
        times = []
        async with agent:
            for t in range(turns):
                started = time.process_time()
                result = await agent.run(PROMPT.format(100_000 + t))
                times.append(time.process_time() - started)
                assert result.outcome == "completed", result
        return times, len(agent.session.history(len(agent.session)))

elif how == "pydantic-ai":
    from pydantic_ai import Agent
    from pydantic_ai.messages import (ModelRequest, ModelResponse, SystemPromptPart, TextPart,
                                      ToolCallPart, ToolReturnPart, UserPromptPart)
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    def seeded():
        out = [ModelRequest(parts=[SystemPromptPart("Be brief.")])]
        for prompt, call_id, path, answer in history_turns():
            out.append(ModelRequest(parts=[UserPromptPart(prompt)]))
            out.append(ModelResponse(parts=[TextPart("Let me read it."), ToolCallPart(
                "read", json.dumps({"path": path}), call_id)]))
            out.append(ModelRequest(parts=[ToolReturnPart("read", SOURCE, call_id)]))
            out.append(ModelResponse(parts=[TextPart(answer)]))
        return out

    async def main():
        agent = Agent(OpenAIChatModel("m", provider=OpenAIProvider(base_url=url + "/v1",
                                                                   api_key="k")))

        @agent.tool_plain
        async def read(path: str) -> str:
            "Read a file."
            return await read_body(path)

        history = seeded()
        times = []
        for t in range(turns):
            started = time.process_time()
            final = None
            async with agent.run_stream_events(PROMPT.format(100_000 + t),
                                               message_history=history) as events:
                async for event in events:
                    final = event
            history = final.result.all_messages()
            times.append(time.process_time() - started)
        return times, len(history)

else:
    from agents import (Agent, OpenAIChatCompletionsModel, Runner, function_tool,
                        set_tracing_disabled)
    from openai import AsyncOpenAI

    set_tracing_disabled(True)

    def seeded():
        items = []
        for prompt, call_id, path, answer in history_turns():
            items.append({"role": "user", "content": prompt})
            items.append({"role": "assistant", "content": "Let me read it."})
            items.append({"type": "function_call", "call_id": call_id, "name": "read",
                          "arguments": json.dumps({"path": path})})
            items.append({"type": "function_call_output", "call_id": call_id, "output": SOURCE})
            items.append({"role": "assistant", "content": answer})
        return items

    @function_tool
    async def read(path: str) -> str:
        "Read a file."
        return await read_body(path)

    async def main():
        client = AsyncOpenAI(base_url=url + "/v1", api_key="k")
        agent = Agent(name="bench", instructions="Be brief.", tools=[read],
                      model=OpenAIChatCompletionsModel(model="m", openai_client=client))
        items = seeded()
        times = []
        for t in range(turns):
            started = time.process_time()
            result = Runner.run_streamed(agent, items + [
                {"role": "user", "content": PROMPT.format(100_000 + t)}])
            async for _ in result.stream_events():
                pass
            items = result.to_input_list()
            times.append(time.process_time() - started)
        return times, len(items)

times, messages = asyncio.run(main())
assert len(READS) == turns, f"the tool ran {len(READS)} times in {turns} turns"
print(json.dumps({"first": times[0], "next": statistics.median(times[1:]), "turns": len(times),
                  "messages": messages}))
"""


def run(quick: bool) -> Section:
    started = time.perf_counter()
    root = Path(__file__).resolve().parent.parent
    sizes = QUICK_SIZES if quick else SIZES
    turns = QUICK_TURNS if quick else TURNS
    figures: dict[str, Any] = {}
    skipped: list[str] = []
    with local_server(SERVER, root) as url, tempfile.TemporaryDirectory() as empty:
        for label, how, module in PATHS:
            if importlib.util.find_spec(module) is None:
                skipped.append(f"{label}: {module} is not installed (the [bench] extra)")
                continue
            for size in sizes:
                figures[f"{label}/{size}"] = child_figures(
                    MEASURE, [how, str(size), str(turns), url], root, empty,
                    f"{label} at {size}")
    return _section(figures, sizes, skipped, time.perf_counter() - started)


def _section(figures: dict[str, Any], sizes: tuple[int, ...], skipped: list[str],
             seconds: float) -> Section:
    headers = ["agent", *(f"{size:,} messages: next / first turn" for size in sizes)]
    rows = paired_rows(figures, [path[0] for path in PATHS], sizes, ("next", "first"))
    notes = ["Client CPU time per agent turn, ms (`time.process_time` in the agent's process; "
             "the server is another process): a prompt, the model's call of one tool, the "
             "tool's result and the model's answer, two streamed Chat Completions requests each "
             "carrying the whole history, through each framework's own agent, mapping and the "
             "official openai SDK's transport, against a local server over loopback HTTP. "
             "*next*: the median of the turns after the first (a running session); *first*: "
             "the first turn of a fresh process holding that history."]
    summary: dict[str, float] = {}
    ours = PATHS[0][0]
    for size in sizes:
        now = figures.get(f"{ours}/{size}")
        if not now:
            continue
        ratios = []
        for label, how, _ in PATHS[1:]:
            peer = figures.get(f"{label}/{size}")
            if peer:
                summary[f"{how}/{size}"] = peer["next"] / now["next"]
                summary[f"{how}/{size}/first"] = peer["first"] / now["first"]
                ratios.append(f"{label.split(' +')[0]} × {peer['next'] / now['next']:,.1f} "
                              f"(first turn × {peer['first'] / now['first']:,.1f})")
        if ratios:
            notes.append(f"At {size:,} messages, CPU per turn of the peer ÷ turnstile's: "
                         + "; ".join(ratios) + ".")
    notes.extend(f"Not run: {reason}." for reason in skipped)
    figures["summary"] = summary
    return Section(title="11. A turn beside the peers, the SDK's encoding counted",
                   headers=headers, rows=rows, notes=notes, figures=figures, seconds=seconds)


if __name__ == "__main__":  # pragma: no cover - by hand
    print(run("--quick" in sys.argv).markdown())
    print(load_text())
