"""``turnstile demo`` / ``make demo``: a narrated session through the asyncio runtime.

Five moments of the loop's routing, each printed as the durable log events
and live notifications it produced (colour on a terminal, plain when piped):

1. idle injection: a context appended at once, no turn;
2. a blocked admission with retained steering: the blocked prompt leaves no
   trace, the steering accepted during its admission waits for the next turn;
3. late steering from a ``turn/end`` observer: it becomes the next prompt;
4. a tool batch with contexts: parallel reads, results in model order, the
   tools' contexts after every result;
5. a cancel with ``keep_inbox``: the streaming turn is aborted, the queued
   prompt survives and runs.

Then the session log is validated and the conformance corpus is replayed
through the runtime (every vector must give exactly the core's outputs).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from machine.events import Event, LiveEvent
from machine.io import Control, Durable, Live, Output
from machine.jsonvalue import Frozen, FrozenDict, FrozenList
from machine.log import validate_events
from machine.runtime.agent import Agent
from machine.runtime.hooks import Next, PromptSubmit
from machine.runtime.model import Hang, ScriptedModel, calls_reply, text_reply
from machine.runtime.sink import InMemorySink
from machine.runtime.tools import Tool, ToolCall
from machine.specfiles import CHECKOUT_SPECS, SHIPPED_SPECS, spec_root
from machine.vocabulary import Block, PromptDecision, ToolResult, user_message

__all__ = ["main", "run_demo"]

CLOCK_START: Final = 1_764_489_600_000


@dataclass(frozen=True, slots=True)
class _Style:
    on: bool

    def __call__(self, text: str, code: str) -> str:
        return f"\033[{code}m{text}\033[0m" if self.on else text


def _get(value: Frozen, *path: str | int) -> Frozen:
    """The value at *path* inside frozen JSON, or None."""
    for key in path:
        if isinstance(key, str) and isinstance(value, FrozenDict):
            value = value.get(key)
        elif isinstance(key, int) and isinstance(value, FrozenList) and key < len(value):
            value = value[key]
        else:
            return None
    return value


def _text(message: Frozen) -> str:
    if not isinstance(message, FrozenDict):
        return ""
    content = message.get("content")
    parts = [str(b.get("text", "")) for b in content if isinstance(b, FrozenDict)] \
        if isinstance(content, FrozenList) else []
    return "".join(parts)


def _source(message: Frozen) -> str:
    source = message.get("source") if isinstance(message, FrozenDict) else None
    if not isinstance(source, FrozenDict):
        return ""
    kind = str(source.get("kind"))
    return f"{kind}:{source['plugin']}" if kind == "plugin" else kind


def _quote(text: str, limit: int = 48) -> str:
    text = text.replace("\n", " ")
    return repr(text if len(text) <= limit else text[:limit - 1] + "…")


def _event_detail(event: Event) -> str:
    d = event.data
    kind = event.type
    if kind == "user/message":
        return f"{_quote(_text(d))}  [{_source(d)}]"
    if kind == "steering/message":
        return f"{_quote(_text(d.get('message')))}  [{_source(d.get('message'))}]"
    if kind == "turn/start":
        trigger = d.get("trigger")
        return f"turn {d['turn']}  trigger {trigger.get('kind') if isinstance(trigger, FrozenDict) else ''}"
    if kind == "turn/end":
        reason = d.get("reason")
        return f"turn {d['turn']}  reason {reason.get('kind') if isinstance(reason, FrozenDict) else ''}"
    if kind in ("step/start", "step/end"):
        return f"step {d['turn']}.{d['step']}"
    if kind == "request/header":
        header = d.get("header")
        config = header.get("config") if isinstance(header, FrozenDict) else None
        model = config.get("model") if isinstance(config, FrozenDict) else "?"
        return f"{d['reason']}  model {model}"
    if kind == "assistant/message":
        message = d.get("message")
        content = _get(message, "content")
        calls = [str(b.get("name")) for b in (content if isinstance(content, FrozenList) else ())
                 if isinstance(b, FrozenDict) and b.get("type") == "tool-call"]
        text = _text(message)
        return (_quote(text) + "  " if text else "") + (f"calls {', '.join(calls)}" if calls else "")
    if kind == "tool/call":
        return f"{d['callId']}  {d['name']}({_args(d.get('arguments'))})"
    if kind == "tool/result":
        block = _get(d, "message", "content", 0)
        inner = _get(block, "content")
        text = _text(FrozenDict({"content": inner})) if isinstance(inner, FrozenList) else ""
        error = d.get("error")
        code = f"  {error.get('code')}" if isinstance(error, FrozenDict) else ""
        return f"{block.get('toolCallId') if isinstance(block, FrozenDict) else ''}  {_quote(text)}{code}"
    return ""


def _args(arguments: Frozen) -> str:
    if isinstance(arguments, FrozenDict):
        return ", ".join(f"{k}={v!r}" for k, v in arguments.items())
    return repr(arguments)


def _live_detail(event: LiveEvent) -> str:
    p = event.payload
    kind = event.type
    if kind in ("agent/inbox/enqueue", "agent/inbox/dequeue"):
        return f"{p['placement']:<8}  {_quote(_text(p.get('message')))}"
    if kind == "agent/status":
        return str(p["status"])
    if kind == "agent/settled":
        reason = p.get("reason")
        return f"turn {p['turn']}  {reason.get('kind') if isinstance(reason, FrozenDict) else ''}"
    if kind in ("agent/inbox/discard", "agent/context/discard"):
        messages = p.get("messages")
        return ", ".join(_quote(_text(m)) for m in messages) if isinstance(messages, FrozenList) else ""
    if kind == "agent/cancel-requested":
        cause = p.get("cause")
        return f"cause {cause.get('kind') if isinstance(cause, FrozenDict) else ''}"
    if kind in ("agent/warning", "agent/error"):
        return str(p.get("text") or p.get("error"))
    if kind == "agent/session-start":
        return str(p.get("source"))
    if kind == "agent/created":
        return f"status {p.get('status')}"
    return ""


class _Printer:
    def __init__(self, out: TextIO, colour: bool) -> None:
        self.out = out
        self.style = _Style(colour)
        self.width = max(80, shutil.get_terminal_size((110, 24)).columns) if colour else 110
        self.pending: list[Output] = []

    def line(self, text: str = "") -> None:
        print(text, file=self.out)

    def heading(self, number: int, title: str, story: Sequence[str]) -> None:
        self.line()
        self.line(self.style(f"▸ {number}. {title}", "1;36"))
        for sentence in story:
            self.line(self.style(f"  {sentence}", "3"))

    def note(self, text: str) -> None:
        self.line(self.style(f"  ⇒ {text}", "33"))

    def rows(self, outputs: Iterable[Output]) -> None:
        """The durable and live outputs as a table; a run of chunks is one row."""
        chunk_run: list[Event] = []

        def flush_chunks() -> None:
            if not chunk_run:
                return
            seqs = f"{chunk_run[0].seq}-{chunk_run[-1].seq}" if len(chunk_run) > 1 \
                else str(chunk_run[0].seq)
            text = "".join(str(_get(e.data, "chunk", "text") or "") for e in chunk_run)
            kinds = [str(_get(e.data, "chunk", "type")) for e in chunk_run]
            detail = f"×{len(chunk_run)}  {_quote(text)}" + ("  +finish" if "finish" in kinds else "")
            self._row("log", seqs, "assistant/chunk", detail, "2")
            chunk_run.clear()

        for output in outputs:
            if isinstance(output, Durable):
                if output.event.type == "assistant/chunk":
                    chunk_run.append(output.event)
                    continue
                flush_chunks()
                colour = "1;32" if output.event.type in ("turn/start", "turn/end") else "32"
                self._row("log", str(output.event.seq), output.event.type,
                          _event_detail(output.event), colour)
            elif isinstance(output, Live):
                flush_chunks()
                self._row("live", "", output.event.type, _live_detail(output.event), "35")
            elif isinstance(output, Control) and output.kind == "abort":
                flush_chunks()
                reason = output.payload.get("reason")
                kind = reason.get("kind") if isinstance(reason, FrozenDict) else ""
                self._row("ctl", "", "abort", f"signal id {output.payload.get('signal')}, "
                          f"reason {kind}", "31")
        flush_chunks()

    def _row(self, kind: str, seq: str, type_: str, detail: str, colour: str) -> None:
        s = self.style
        head = f"  {kind:<4} {seq:>5}  {type_:<24} "
        room = max(10, self.width - len(head))
        if len(detail) > room:
            detail = detail[:room - 1] + "…"
        self.line(s(f"  {kind:<4} {seq:>5}  ", "2") + s(f"{type_:<24}", colour) + " " + detail)


async def _session(printer: _Printer) -> tuple[Agent, InMemorySink]:
    """The narrated session; returns the disposed agent and its store."""
    clock = iter(range(CLOCK_START, CLOCK_START + 10**6))
    store = InMemorySink()
    model = ScriptedModel([
        text_reply("build/  src/  README.md", pieces=2),
        text_reply("src/ holds main.py and db.py."),
        text_reply("README: a small demo service.", pieces=2),
        calls_reply(("call-1", "read", '{"path": "app.toml"}'),
                    ("call-2", "read", '{"path": "db.toml"}'), text="Reading both."),
        text_reply("Both configs point at port 8080."),
        Hang(({"type": "text", "text": "Once upon"}, {"type": "text", "text": " a time"})),
        text_reply("Goodbye!"),
    ], provider="demo", model="demo-1")

    async def read(call: ToolCall) -> ToolResult:
        path = call.arguments.get("path") if isinstance(call.arguments, dict) else "?"
        await asyncio.sleep(0.002 if path == "app.toml" else 0.001)   # the second read ends first
        context = user_message(f"ctx-{call.call_id}", f"{path} was read at revision 42",
                               {"kind": "plugin", "plugin": "fs"})
        return ToolResult([{"type": "text", "text": f"port = 8080  # {path}"}],  # type: ignore[arg-type]
                          additional_contexts=(context,))

    deliberating = asyncio.Event()
    verdict: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    async def guard(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        if "rm -rf" in submit.message.text:
            deliberating.set()
            await verdict
            return Block("destructive command")
        return await next_()

    agent = Agent(model, tools=[Tool("read", read, "parallel", "Read a file.")],
                  sink=store, clock=lambda: next(clock))
    agent.hooks.prompt_submit.use(guard)
    outputs: list[Output] = []
    agent.observe(outputs.append)

    def section() -> list[Output]:
        taken = list(outputs)
        outputs.clear()
        return taken

    async with agent:
        printer.heading(1, "Idle injection", [
            "A shell plugin injects its working directory while the agent is idle."])
        agent.inject(user_message("ctx-0", "cwd is /srv/app", {"kind": "plugin", "plugin": "shell"}))
        printer.rows(section())
        printer.note("appended at once as a user/message: no turn, no model call")

        printer.heading(2, "A blocked admission with retained steering", [
            "The user asks for `rm -rf build/`; the prompt-submit guard deliberates.",
            "Meanwhile the user steers; the guard then blocks the prompt."])
        agent.followup("rm -rf build/")
        await deliberating.wait()
        agent.steer("actually, just list the files")
        verdict.set_result(None)
        await agent.when_idle()
        printer.rows(section())
        printer.note(f"the blocked prompt left no trace; the steering is retained "
                     f"(pending steering: {agent.core.pending_steering})")
        agent.followup("list the files")
        await agent.when_idle()
        printer.rows(section())
        printer.note("the next admitted turn takes the retained steering before its prompt")

        printer.heading(3, "Late steering from a turn/end observer", [
            "A listener on turn/end steers once; the window is already closed."])
        def late(event: Event) -> None:
            if event.data["turn"] == 2:
                agent.steer("also summarise README.md")
        stop = agent.on("turn/end", late)
        agent.followup("what is in src/?")
        await agent.when_idle()
        stop()
        printer.rows(section())
        printer.note("the late steer became a queued prompt: turn 3 ran right after turn 2's "
                     "post-turn flush (the barrier that makes the log durable, R12.4), with no "
                     "idle in between")

        printer.heading(4, "A tool batch with contexts", [
            "The model reads two files with a parallel-safe tool; the second read ends first."])
        agent.followup("read the two config files")
        await agent.when_idle()
        printer.rows(section())
        printer.note("results in model order; the tools' contexts come after every result")

        printer.heading(5, "A cancel with keep_inbox", [
            "While the model streams an essay, the user queues a goodbye,",
            "then cancels the turn with keep_inbox=True."])
        streaming = asyncio.Event()
        stop = agent.on("assistant/chunk", lambda e: streaming.set())
        agent.followup("write a long essay")
        await streaming.wait()
        stop()
        agent.followup("then say goodbye")
        agent.cancel("user", keep_inbox=True)
        await agent.when_idle()
        printer.rows(section())
        printer.note("the turn ended aborted; the queued prompt survived and ran")
    printer.line()
    printer.line(printer.style("▸ Disposal", "1;36"))
    printer.rows(section())
    return agent, store


def _corpus(printer: _Printer, specs: Path | None, *, required: bool) -> bool:
    """Replay the conformance vectors and example scripts through the runtime."""
    s = printer.style
    printer.line()
    printer.line(s("▸ The conformance corpus, through the asyncio runtime", "1;36"))
    ok = True
    logger = logging.getLogger("turnstile")
    level = logger.level
    logger.setLevel(logging.ERROR)          # the vectors' own warnings are expected: not shown
    try:
        ok = _replay_corpus(printer, specs, required=required)
    finally:
        logger.setLevel(level)
    return ok


def _replay_corpus(printer: _Printer, specs: Path | None, *, required: bool) -> bool:
    from machine.conformance.vectors import MalformedError, find_vectors, load_vector
    from machine.runner import ScriptError, load_script
    from machine.runtime.replay import check_vector, replay_script

    s = printer.style
    ok = True
    vector_dir = None if specs is None else specs / "conformance" / "vectors"
    paths = list(find_vectors([vector_dir])) if vector_dir is not None and vector_dir.is_dir() \
        else []
    if not paths and required:      # an installation without its corpus is incomplete
        printer.line(s(f"  no conformance vectors found (looked in {CHECKOUT_SPECS} and "
                       f"{SHIPPED_SPECS}): the installation is incomplete", "31"))
        ok = False
    elif not paths:
        printer.line(f"  no conformance vectors under {vector_dir} (skipped)")
    else:
        failed: list[str] = []
        for path in paths:
            try:
                problem = check_vector(load_vector(path))
            except MalformedError as error:
                problem = str(error)
            if problem is not None:
                failed.append(f"{path.stem}: {problem}")
        passed = len(paths) - len(failed)
        verdict = s("all identical", "1;32") if not failed else s(f"{len(failed)} differ", "1;31")
        printer.line(f"  {passed}/{len(paths)} vectors give exactly the core's outputs: {verdict}")
        for line in failed[:10]:
            printer.line(s(f"    {line}", "31"))
        ok = not failed
    scripts = sorted((specs / "examples").glob("*.json")) if specs is not None else []
    for path in scripts:
        try:
            problem = replay_script(load_script(path))
        except ScriptError as error:
            problem = str(error)
        mark = s("identical", "32") if problem is None else s(f"DIFFERS: {problem}", "31")
        printer.line(f"  example script {path.name}: {mark}")
        ok = ok and problem is None
    return ok


def run_demo(out: TextIO, *, colour: bool, root: Path | None = None) -> int:
    """Print the narrated session, check its log and the corpus; 0 if everything holds.

    The corpus and the example scripts are those of the installation (`machine.specfiles`),
    and missing ones fail the demo; with *root*, those of the repository at *root*, and
    missing ones are skipped.
    """
    printer = _Printer(out, colour)
    s = printer.style
    printer.line(s("turnstile demo", "1") + " — a narrated session through the asyncio runtime "
                 "(machine.runtime.Agent)")
    printer.line(s("  columns: log = durable session event (seq), live = notification, "
                   "ctl = control", "2"))
    printer.line(s("  (ctl abort: the core cancels the work that carries that signal id; each "
                   "admission and turn gets its own id: not an OS signal)", "2"))
    agent, store = asyncio.run(asyncio.wait_for(_session(printer), 60))
    events = list(agent.session.events)
    violation = validate_events(events)
    turns = sum(1 for e in events if e.type == "turn/start")
    printer.line()
    printer.line(s("▸ The session log", "1;36"))
    printer.line(f"  {len(events)} events, {turns} turns, {store.flushes} store flushes (one "
                 f"after every turn: the log made durable); "
                 + (s("valid (rules L1-L14)", "32") if violation is None
                    else s(f"INVALID: {violation}", "31")))
    specs = spec_root() if root is None else root / "specs"
    ok = _corpus(printer, specs, required=root is None) and violation is None
    printer.line()
    return 0 if ok else 1


def main(out: TextIO | None = None, *, colour: bool | None = None) -> int:
    """Run the demo; colour defaults to on for a terminal (off when piped or NO_COLOR is set)."""
    stream = out if out is not None else sys.stdout
    if colour is None:
        colour = stream.isatty() and not os.environ.get("NO_COLOR")
    try:
        return run_demo(stream, colour=colour)
    except BrokenPipeError:                 # piped into `head`: stop quietly
        if stream is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    sys.exit(main())
