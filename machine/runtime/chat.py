"""``turnstile chat``: a small agent over any OpenAI-compatible endpoint (specs/runtime.md RT20).

    turnstile chat --base-url http://127.0.0.1:8000/v1 --model qwen2.5 [--session s.jsonl [--resume]]

It is the worked example of the runtime, end to end:

* the model is the `OpenAIChat` adapter, with two harmless tools
  (``current_time``, ``word_count``) and the retry policy's request-error
  handler (`retry_request`);
* the session is a JSONL file (``--session``), continued with ``--resume``
  (`Agent.resume`);
* a line typed at the prompt is a follow-up; typed while the model is working it
  is **steering** (it reaches the model at the next step of the same turn);
  ``/inject TEXT`` injects context (appended at once when idle, staged for the
  next step while a turn runs); ``/quit`` leaves at once, end of input once
  the agent is idle;
* Ctrl-C **cancels** the running turn (``agent.cancel()``); at the prompt it only
  says how to leave.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Final, TextIO

from machine.errors import TurnstileError
from machine.events import Event, LiveEvent
from machine.payloads import AgentErrorData, AssistantChunkData, ToolCallData, TurnEndData
from machine.runtime.agent import Agent
from machine.runtime.retry import retry_request
from machine.runtime.tools import ToolCall, tool
from machine.store.errors import StoreError
from machine.store.jsonl import SUFFIX, JsonlStore
from machine.vocabulary import plugin_source, user_message

__all__ = ["TOOLS", "configure", "main", "run_chat"]

PROMPT: Final = "you> "
HELP: Final = ("type a message; while the model works, a line steers it; /inject TEXT adds "
               "context; Ctrl-C cancels the turn; /quit or Ctrl-D leaves")


@tool(parameters={"type": "object", "properties": {}})
async def current_time(call: ToolCall) -> str:
    """The current date and time (UTC, ISO 8601)."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@tool(parameters={"type": "object", "properties": {"text": {"type": "string"}},
                  "required": ["text"]})
async def word_count(call: ToolCall) -> str:
    """How many words a text has."""
    return str(len(call.arg("text", str).split()))


TOOLS: Final = (current_time, word_count)


class ChatError(Exception):
    """A usage problem: printed, exit status 2."""


def open_agent(args: argparse.Namespace) -> tuple[Agent, str]:
    """The agent for *args* and a line saying where its session lives."""
    from machine.runtime.adapters.openai import OpenAIChat  # needs the openai extra

    model = OpenAIChat(args.model, base_url=args.base_url, provider=args.provider,
                       api_key=os.environ.get(args.api_key_env))
    if args.session is None:
        if args.resume:
            raise ChatError("--resume needs --session FILE")
        return (Agent(model, tools=TOOLS, system=args.system),
                "session kept in memory (use --session FILE to keep it)")
    path = Path(args.session)
    if not path.name.endswith(SUFFIX) or len(path.name) == len(SUFFIX):
        raise ChatError(f"{path}: a session file is named NAME{SUFFIX}")
    store, session_id = JsonlStore(path.parent), path.name[:-len(SUFFIX)]
    if args.resume:
        agent = Agent.resume(store, session_id, model, mode="salvage", tools=TOOLS,
                             system=args.system)
        report = agent.load_report
        repaired = "" if report is None or report.clean else " (repaired: see the warning)"
        turns = agent.session.last_turn
        return agent, (f"resumed {path}: {len(agent.session)} events, "
                       f"{turns} turn{'' if turns == 1 else 's'}{repaired}")
    if path.exists():
        raise ChatError(f"{path} exists: pass --resume to continue it")
    return (Agent.resume(store, session_id, model, create=True, tools=TOOLS, system=args.system),
            f"new session {path}")


class Console:
    """What the user sees: the model's text as it streams, tools, steering, errors."""

    def __init__(self, agent: Agent, out: TextIO) -> None:
        self.out = out
        self.streaming = ""             # the kind of chunk last written: reasoning or text
        agent.on("assistant/chunk", self.chunk)
        agent.on("tool/call", self.tool_call)
        agent.on("steering/message", lambda e: self.say(f"[steering] {e.message.text}"))
        agent.on("user/message", self.context)
        agent.on("turn/end", self.turn_end)
        agent.on("agent/error", self.error)
        agent.on("agent/status", self.status)
        agent.on("agent/inbox/enqueue", self.enqueued)

    def write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def say(self, line: str) -> None:
        self.write(f"\n{line}\n")
        self.streaming = ""

    def chunk(self, event: Event) -> None:
        chunk = event.data_as(AssistantChunkData)
        kind = chunk.chunk_type
        if kind not in ("text", "reasoning"):
            return
        if kind != self.streaming:
            self.write("(thinking) " if kind == "reasoning" else "\n" if self.streaming else "")
            self.streaming = kind
        self.write(chunk.text)

    def tool_call(self, event: Event) -> None:
        call = event.data_as(ToolCallData)
        self.say(f"[tool] {call.name}({call.arguments})")

    def context(self, event: Event) -> None:
        if event.message.source.get("kind") == "plugin":
            self.say(f"[context] {event.message.text}")

    def turn_end(self, event: Event) -> None:
        end = event.data_as(TurnEndData)
        self.streaming = ""
        self.write("\n" if end.reason.kind == "completed" else
                   f"\n[turn {end.turn} ended: {end.reason.kind}]\n")

    def error(self, notice: LiveEvent) -> None:
        self.say(f"[error] {notice.payload_as(AgentErrorData).error.rendered()}")

    def enqueued(self, notice: LiveEvent) -> None:
        if notice.payload.get("placement") == "steering":
            self.say("[steering accepted: the model sees it at its next step]")

    def status(self, notice: LiveEvent) -> None:
        if notice.payload.get("status") == "idle":
            self.write(PROMPT)


def _read_lines(stream: TextIO, loop: asyncio.AbstractEventLoop,
                lines: asyncio.Queue[str | None]) -> None:
    """A thread: every line typed, then None at end of input."""
    for line in iter(stream.readline, ""):
        loop.call_soon_threadsafe(lines.put_nowait, line.rstrip("\n"))
    loop.call_soon_threadsafe(lines.put_nowait, None)


async def run_chat(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    """The chat loop (see the module docstring); returns the exit status."""
    agent, where = open_agent(args)
    console = Console(agent, stdout)
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_read_lines, args=(stdin, loop, lines), daemon=True).start()

    def interrupt() -> None:
        if agent.status == "running":
            agent.cancel()
            console.say("[cancelled]")
        else:
            console.write(f"\n(/quit or Ctrl-D to leave)\n{PROMPT}")

    with contextlib.suppress(NotImplementedError, RuntimeError):   # no signals: no Ctrl-C
        loop.add_signal_handler(signal.SIGINT, interrupt)
    agent.hooks.request_error.use(retry_request)
    console.write(f"turnstile chat: {args.model} at {args.base_url}; {where}\n{HELP}\n{PROMPT}")
    try:
        async with agent:
            while True:
                line = await lines.get()
                if line is None:                # end of input: finish what was asked first
                    await agent.when_idle()
                    break
                if line.strip() in ("/quit", "/exit"):
                    break                       # leaving now cancels a running turn
                if line.startswith("/inject "):
                    agent.inject(user_message(f"chat-{len(agent.session)}", line[8:],
                                              plugin_source("chat")))
                    if agent.status == "idle":
                        console.write(PROMPT)
                elif not line.strip():
                    if agent.status == "idle":
                        console.write(PROMPT)
                elif agent.status == "running":
                    agent.steer(line)           # reaches the model at its next step
                else:
                    agent.followup(line)
    finally:
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.remove_signal_handler(signal.SIGINT)
    console.write("\nbye\n")
    return 0


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Chat with a model of an OpenAI-compatible endpoint through the "
                          "turnstile runtime. " + HELP + ".")
    parser.add_argument("--base-url", required=True, help="the endpoint, e.g. "
                        "http://127.0.0.1:8000/v1 or https://api.deepseek.com")
    parser.add_argument("--model", required=True, help="the model name")
    parser.add_argument("--provider", default="openai",
                        help="the provider's name in the session log (default: openai)")
    parser.add_argument("--api-key-env", default="OPENAI_API_KEY", metavar="VAR",
                        help="the environment variable holding the API key")
    parser.add_argument("--system", default=None, help="a system prompt")
    parser.add_argument("--session", metavar="FILE", default=None,
                        help=f"keep the session in FILE (NAME{SUFFIX})")
    parser.add_argument("--resume", action="store_true",
                        help="continue the session in --session FILE")


def main(args: argparse.Namespace) -> int:
    """``turnstile chat``: exit 0, 1 for a session that cannot be opened, 2 for usage."""
    try:
        return asyncio.run(run_chat(args, sys.stdin, sys.stdout))
    except ChatError as error:
        print(f"turnstile chat: {error}", file=sys.stderr)
        return 2
    except StoreError as error:
        print(f"turnstile chat: {error}", file=sys.stderr)
        return 1
    except (ImportError, TurnstileError) as error:   # no openai extra; a bad option
        print(f"turnstile chat: {error}", file=sys.stderr)
        return 2
