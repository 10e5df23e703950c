"""Provider requests (issue 27, specs/providers.md W10): client CPU per request through the
real adapters and the official SDKs, against a local server in another process.

A history of N messages (turns of four: a prompt, a call with its text, its result, an
answer; about 200 bytes each on the wire) is sent by each path, each path in a fresh
process, one after the other, so the client's CPU time (`time.process_time`, the server
being another process) is what a user's process pays:

* ``OpenAIChat`` and ``AnthropicMessages`` as they are (each message encoded once, the body
  posted through the SDK client's transport);
* the same adapters through the SDK's own ``create`` (``direct=False``: the SDK transforms
  the whole history on every request);
* the adapters of `BASE`, before this work (their files taken from git): the SDK's
  ``create`` and the O(n²) missing-results pass;
* the plain SDK: ``client.chat.completions.create(messages=...)`` given the wire messages
  ready-made (what any caller of the SDK pays per request, mapping aside);
* pydantic-ai's ``OpenAIChatModel`` (``pydantic_ai.direct.model_request_stream``) over the
  same SDK, with the same history as its messages.

For each: the *first* request of a fresh adapter at N messages (nothing encoded yet: a
process that resumes a long session), and the *next* request after a turn's four messages
are added (what a running session pays per request). Each figure is the median of its
repeats (one for the paths that re-encode everything, from 10,000 messages). Every
request streams a short reply to the end.
"""

from __future__ import annotations

import importlib.util
import subprocess
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
    milliseconds,
    paired_rows,
    server_script,
)

#: The commit before this work (the adapters with the SDK's create and the O(n²) pass).
BASE = "1d2aea6"
SIZES = (100, 1_000, 10_000, 100_000)
QUICK_SIZES = (10,)
#: Paths measured: (label, dialect, how). ``now``: this tree's adapter; ``sdk-create``: this
#: tree's adapter with direct=False; ``before``: BASE's adapter; ``plain-sdk``: the SDK given
#: ready wire messages; ``pydantic-ai``: its OpenAIChatModel.
PATHS = (("OpenAIChat", "chat", "now"), ("OpenAIChat, direct=False", "chat", "sdk-create"),
         (f"OpenAIChat at {BASE}", "chat", "before"), ("openai SDK, messages ready", "chat",
                                                       "plain-sdk"),
         ("pydantic-ai OpenAIChatModel", "chat", "pydantic-ai"),
         ("AnthropicMessages", "messages", "now"),
         ("AnthropicMessages, direct=False", "messages", "sdk-create"),
         (f"AnthropicMessages at {BASE}", "messages", "before"))
#: Paths whose every request re-encodes the whole history: fewer repeats at large sizes.
_SLOW = ("sdk-create", "before", "plain-sdk", "pydantic-ai")

SERVER = server_script("""
CHAT, MESSAGES = openai_text("ok", usage=(5, 2)), anthropic_text("ok")

def choose(request):
    # a short reply in the dialect the request's path names
    return MESSAGES if request.path.endswith("/messages") else CHAT
""")

MEASURE = r"""
import asyncio, json, statistics, sys, time
from machine.jsonvalue import FrozenDict
from machine.log import SessionLog
from machine.runtime.model import ModelCall
from machine.runtime.signal import Signal

dialect, how, size, repeats, url = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
MODEL = {"kind": "model", "provider": "p", "model": "m"}
SCHEMA = {"type": "object", "properties": {"path": {"type": "string"}}}
HEADER = FrozenDict({"config": {"provider": "p", "model": "m"}, "system": "Be brief.",
                     "tools": [{"name": "read", "description": "Read a file.", "parameters": SCHEMA}]})

def turn(log, t):
    log.append("turn/start", {"turn": t, "trigger": {"kind": "message", "source": {"kind": "user"}}})
    log.append("user/message", {"id": f"u{t}", "role": "user", "content": [{"type": "text",
               "text": f"Please look at file number {t} and tell me what its function does."}],
               "source": {"kind": "user"}}, surface_op="append")
    log.append("step/start", {"turn": t, "step": 1})
    log.append("assistant/message", {"turn": t, "step": 1, "message": {"id": f"a{t}",
               "role": "assistant", "content": [{"type": "text", "text": "Let me read it."},
               {"type": "tool-call", "id": f"call_{t}", "name": "read",
                "arguments": json.dumps({"path": f"src/file_{t}.py"})}], "source": MODEL}},
               surface_op="append", source_event_seqs=[])
    call = log.append("tool/call", {"turn": t, "step": 1, "callId": f"call_{t}", "name": "read",
                      "arguments": {"path": f"src/file_{t}.py"}})
    log.append("tool/result", {"turn": t, "step": 1, "message": {"id": f"r{t}", "role": "user",
               "content": [{"type": "tool-result", "toolCallId": f"call_{t}", "content": [
                   {"type": "text", "text": "def double(x):\n    return x * 2\n"}]}],
               "source": {"kind": "tool", "callId": f"call_{t}"}}}, surface_op="append",
               source_event_seqs=[call.seq])
    log.append("step/end", {"turn": t, "step": 1})
    log.append("step/start", {"turn": t, "step": 2})
    log.append("assistant/message", {"turn": t, "step": 2, "message": {"id": f"b{t}",
               "role": "assistant", "content": [{"type": "text",
               "text": "It doubles its input and returns it."}], "source": MODEL}},
               surface_op="append", source_event_seqs=[])
    log.append("step/end", {"turn": t, "step": 2})
    log.append("turn/end", {"turn": t, "reason": {"kind": "completed"}})

log = SessionLog(clock=lambda: 1.0)
turns = max(1, size // 4)
for t in range(1, turns + 1):
    turn(log, t)

def adapter():
    if how == "pydantic-ai":
        from pydantic_ai.models.openai import OpenAIChatModel
        from pydantic_ai.providers.openai import OpenAIProvider
        return OpenAIChatModel("m", provider=OpenAIProvider(base_url=url + "/v1", api_key="k"))
    options = {} if how == "before" else {"direct": how == "now"}
    if dialect == "chat" or how == "plain-sdk":
        from machine.runtime.adapters.openai import OpenAIChat
        return OpenAIChat("m", base_url=url + "/v1", api_key="k", **options)
    from machine.runtime.adapters.anthropic import AnthropicMessages
    return AnthropicMessages("m", base_url=url, api_key="k", **options)

def pydantic_messages(history):
    from pydantic_ai.messages import (ModelRequest, ModelResponse, SystemPromptPart, TextPart,
                                      ToolCallPart, ToolReturnPart, UserPromptPart)
    out = [ModelRequest(parts=[SystemPromptPart("Be brief.")])]
    for m in history:
        if m.role == "assistant":
            parts = [TextPart(b["text"]) if b["type"] == "text" else
                     ToolCallPart(b["name"], b["arguments"], b["id"]) for b in m.content]
            out.append(ModelResponse(parts=parts))
        elif m.source.get("kind") == "tool":
            block = m.content[0]
            out.append(ModelRequest(parts=[ToolReturnPart("read", block["content"][0]["text"],
                                                          block["toolCallId"])]))
        else:
            out.append(ModelRequest(parts=[UserPromptPart(m.content[0]["text"])]))
    return out

async def request(model, history, ready):
    started = time.process_time()
    if how == "pydantic-ai":
        from pydantic_ai.direct import model_request_stream
        from pydantic_ai.models import ModelRequestParameters
        from pydantic_ai.tools import ToolDefinition
        params = ModelRequestParameters(function_tools=[ToolDefinition(
            name="read", description="Read a file.", parameters_json_schema=SCHEMA)])
        async with model_request_stream(model, ready, model_request_parameters=params) as stream:
            async for _ in stream:
                pass
    elif how == "plain-sdk":
        stream = await model.client.chat.completions.create(
            model="m", messages=ready, stream=True, tools=model.request(
                ModelCall(1, 1, Signal(1), HEADER, ()))["tools"],
            stream_options={"include_usage": True})
        async for _ in stream:
            pass
        await stream.close()
    else:
        async for _ in model.stream(ModelCall(1, 1, Signal(1), HEADER, history)):
            pass
    return time.process_time() - started

def ready_of(model, history):
    if how == "pydantic-ai":
        return pydantic_messages(history)
    if how == "plain-sdk":
        return model.request(ModelCall(1, 1, Signal(1), HEADER, history))["messages"]
    return None

async def main():
    results = {"first": [], "next": []}
    extra = turns
    for _ in range(repeats):
        model = adapter()
        await request(model, log.history(4), ready_of(model, log.history(4)))   # warm up
        history = log.history(len(log))
        ready = ready_of(model, history)
        results["first"].append(await request(model, history, ready))
        extra += 1
        turn(log, extra)
        history = log.history(len(log))
        ready = ready_of(model, history)
        results["next"].append(await request(model, history, ready))
    print(json.dumps({key: statistics.median(values) for key, values in results.items()}
                     | {"messages": len(log.history(len(log)))}))

asyncio.run(main())
"""


def _base_tree(folder: str) -> str | None:
    """BASE's machine/ and model/ into *folder*; an error text, or None."""
    root = Path(__file__).resolve().parent.parent
    archive = subprocess.run(["git", "-C", str(root), "archive", BASE, "machine", "model"],
                             capture_output=True, check=False)
    if archive.returncode != 0:
        return "git archive " + BASE + " failed: " + archive.stderr.decode(errors="replace")
    subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
    (Path(folder) / "machine" / "_model").symlink_to(Path(folder) / "model")
    return None


def _pydantic_ai() -> bool:
    """Whether pydantic-ai is installed (the [bench] extra; the measure runs in a child)."""
    return importlib.util.find_spec("pydantic_ai") is not None


def run(quick: bool) -> Section:
    started = time.perf_counter()
    root = Path(__file__).resolve().parent.parent
    sizes = QUICK_SIZES if quick else SIZES
    figures: dict[str, Any] = {}
    skipped: list[str] = []
    with local_server(SERVER, root) as url, tempfile.TemporaryDirectory() as before, \
            tempfile.TemporaryDirectory() as empty:
        why = _base_tree(before)
        for label, dialect, how in PATHS:
            if how == "before" and why:
                skipped.append(f"{label}: {why}")
                continue
            if how == "pydantic-ai" and not _pydantic_ai():
                skipped.append(f"{label}: pydantic-ai is not installed (the [bench] extra)")
                continue
            tree = before if how == "before" else str(root)
            for size in sizes:
                repeats = 1 if quick or (how in _SLOW and size >= 10_000) else 7
                figures[f"{label}/{size}"] = child_figures(
                    MEASURE, [dialect, how, str(size), str(repeats), url], tree, empty,
                    f"{label} at {size}")
    return _section(figures, sizes, skipped, time.perf_counter() - started)


def _section(figures: dict[str, Any], sizes: tuple[int, ...], skipped: list[str],
             seconds: float) -> Section:
    headers = ["path", *(f"{size:,}: first / next" for size in sizes)]
    rows = paired_rows(figures, [path[0] for path in PATHS], sizes, ("first", "next"))
    notes = ["Client CPU time per request, ms (`time.process_time` in the client's process; "
             "the server is another process): the *first* request of a fresh adapter at that "
             "many messages, and the *next* one after a turn's four messages are added. "
             "Every request streams a short reply to its end, through the SDK's transport "
             "over loopback HTTP, so each figure includes the SDK's own cost per request "
             "(about 2–3 ms here) and sending the body (about 200 bytes a message)."]
    ten = 10_000 if 10_000 in sizes else max(sizes)
    now = figures.get(f"OpenAIChat/{ten}")
    pai = figures.get(f"pydantic-ai OpenAIChatModel/{ten}")
    before = figures.get(f"OpenAIChat at {BASE}/{ten}")
    claude = figures.get(f"AnthropicMessages/{ten}")
    summary: dict[str, float] = {}
    if now:
        summary["size"] = ten
        summary["openai_next_ms"] = now["next"] * 1e3
        summary["openai_first_ms"] = now["first"] * 1e3
        summary["next_over_first"] = now["next"] / now["first"]
        notes.append(f"At {ten:,} messages, `OpenAIChat`: {milliseconds(now['next'])} ms per request in "
                     f"a running session (the next request), {milliseconds(now['first'])} ms for the "
                     f"first request of a fresh adapter, which encodes every message once; the "
                     f"next ÷ the first: {now['next'] / now['first']:.1%}.")
    if claude:
        summary["anthropic_next_ms"] = claude["next"] * 1e3
    if now and before:
        summary["before_over_now"] = before["next"] / now["next"]
        notes.append(f"Against {BASE} (before), the next request: × "
                     f"{before['next'] / now['next']:,.0f} less CPU; the first: × "
                     f"{before['first'] / now['first']:,.1f}.")
    if now and pai:
        summary["pydantic_ai_over_now"] = pai["next"] / now["next"]
        summary["pydantic_ai_over_now_first"] = pai["first"] / now["first"]
        notes.append(f"Against pydantic-ai's OpenAI path, same run: × "
                     f"{pai['next'] / now['next']:,.0f} less CPU per request in a running "
                     f"session, × {pai['first'] / now['first']:,.1f} for the first request "
                     "of a fresh adapter.")
    notes.extend(f"Not run: {reason}." for reason in skipped)
    figures["summary"] = summary
    return Section(title="10. Provider requests (specs/providers.md W10)",
                   headers=headers, rows=rows, notes=notes, figures=figures, seconds=seconds)


if __name__ == "__main__":  # pragma: no cover - by hand
    print(run("--quick" in sys.argv).markdown())
    print(load_text())
