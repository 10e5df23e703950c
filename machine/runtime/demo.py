"""``turnstile demo`` / ``make demo``: what goes wrong at an agent loop's seams, and what
turnstile does instead, told through the asyncio runtime with a scripted model.

Four scenes, each shown as a loop without this design handles it (a loop that writes each
message the moment it arrives, or the original implementation where it lost input) and as
turnstile does, with the request the model is sent next or the session log it leaves (colour
on a terminal, plain when piped):

1. the user types while a tool runs: written at once, the message splits the call from its
   result and the provider refuses the next request; turnstile holds it to the step's end;
2. messages arriving as a turn ends: a plugin's report and a late line of the user's, lost
   by the original; turnstile writes the report and runs the line as the next prompt;
3. a cancel in the middle of an answer: the text the user watched stream is kept, so "go on"
   has something to go on from;
4. a blocked prompt: no trace of it, the context beside it kept.

Then the session log is checked against the session rules and the conformance corpus is
replayed through the runtime (every vector must give exactly the core's outputs).
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
from machine.jsonvalue import Frozen, FrozenDict, FrozenList
from machine.log import validate_events
from machine.providers import chat_refusals
from machine.runtime.agent import Agent
from machine.runtime.hooks import JsonValue, Next, PromptSubmit
from machine.runtime.model import Hang, ScriptedModel, calls_reply, text_reply
from machine.runtime.sink import InMemorySink
from machine.runtime.tools import Tool, ToolCall
from machine.specfiles import CHECKOUT_SPECS, SHIPPED_SPECS, spec_root
from machine.vocabulary import Block, Message, PromptDecision, ToolResult, user_message

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

    def line(self, text: str = "") -> None:
        print(text, file=self.out)

    def heading(self, number: int, title: str, story: Sequence[str]) -> None:
        self.line()
        self.line(self.style(f"▸ {number}. {title}", "1;36"))
        for sentence in story:
            self.line(self.style(f"  {sentence}", "3"))

    def side(self, title: str, good: bool) -> None:
        self.line(self.style(f"  {title}", "1;32" if good else "1;31"))

    def verdict(self, text: str, good: bool) -> None:
        mark = "✓" if good else "✗"
        self.line(self.style(f"    {mark} {text}", "32" if good else "31"))

    def conversation(self, messages: Iterable[_Said]) -> None:
        """Messages as a model request carries them: role, then what it says."""
        for said in messages:
            head = f"    {said.role:<10} "
            room = max(10, self.width - len(head))
            text = said.text if len(said.text) <= room else said.text[:room - 1] + "…"
            colour = {"user": "35", "assistant": "34", "tool": "33"}.get(said.role, "0")
            self.line(self.style(f"    {said.role:<10}", colour) + " " + text)

    def log(self, events: Iterable[Event]) -> None:
        """Session log events, a run of streamed chunks as one row."""
        chunks: list[Event] = []

        def flush_chunks() -> None:
            if chunks:
                text = "".join(str(_get(e.data, "chunk", "text") or "") for e in chunks)
                self._row(f"{chunks[0].seq}-{chunks[-1].seq}" if len(chunks) > 1
                          else str(chunks[0].seq), "assistant/chunk",
                          f"×{len(chunks)}  {_quote(text)}", "2")
                chunks.clear()

        for event in events:
            if event.type == "assistant/chunk":
                chunks.append(event)
                continue
            flush_chunks()
            colour = "1;32" if event.type in ("turn/start", "turn/end") else "32"
            self._row(str(event.seq), event.type, _event_detail(event), colour)
        flush_chunks()

    def _row(self, seq: str, type_: str, detail: str, colour: str) -> None:
        head = f"    {seq:>5}  {type_:<19} "
        room = max(10, self.width - len(head))
        if len(detail) > room:
            detail = detail[:room - 1] + "…"
        self.line(self.style(f"    {seq:>5}  ", "2") + self.style(f"{type_:<19}", colour)
                  + " " + detail)


@dataclass(frozen=True, slots=True)
class _Said:
    """One message of a request, as the demo prints it."""

    role: str             # user, assistant or tool
    text: str
    calls: tuple[str, ...] = ()      # the tool-call ids an assistant message makes
    answers: str = ""                # the tool-call id a tool message answers

    @classmethod
    def of(cls, message: Message) -> _Said:
        blocks = [b for b in message.content if isinstance(b, FrozenDict)]
        calls = tuple(str(b.get("id")) for b in blocks if b.get("type") == "tool-call")
        results = [b for b in blocks if b.get("type") == "tool-result"]
        if results:
            inner = results[0].get("content")
            text = "".join(str(b.get("text", "")) for b in inner if isinstance(b, FrozenDict)) \
                if isinstance(inner, FrozenList) else ""
            return cls("tool", f"result of {results[0].get('toolCallId')}: {_quote(text)}",
                       answers=str(results[0].get("toolCallId")))
        names = [f"{b.get('name')}({b.get('arguments')})" for b in blocks
                 if b.get("type") == "tool-call"]
        text = "".join(str(b.get("text", "")) for b in blocks if b.get("type") == "text")
        shown = (_quote(text) if text else "") + ("  " if text and names else "") + (
            f"calls {', '.join(names)}" if names else "")
        if message.role == "assistant" and isinstance(message.source, FrozenDict) and \
                message.source.get("kind") == "model" and not calls and not text:
            shown = "(nothing)"
        return cls(message.role, shown, calls)


def chat_refusal(messages: Sequence[_Said]) -> str | None:
    """What the Chat Completions API answers (HTTP 400) to these messages, by the providers'
    rules (`machine.providers.rules`, specs/providers.md); None when it accepts them."""
    body: list[dict[str, JsonValue]] = []
    for said in messages:
        if said.role == "tool":
            body.append({"role": "tool", "tool_call_id": said.answers, "content": said.text})
        elif said.calls:
            body.append({"role": "assistant", "content": said.text, "tool_calls": [
                {"id": call, "type": "function",
                 "function": {"name": "read", "arguments": "{}"}} for call in said.calls]})
        else:
            body.append({"role": said.role, "content": said.text})
    refusals = chat_refusals({"model": "demo-1", "messages": body})
    return refusals[0].message if refusals else None


async def _session(printer: _Printer) -> tuple[Agent, InMemorySink]:
    """The four scenes, through one agent; returns the disposed agent and its store."""
    clock = iter(range(CLOCK_START, CLOCK_START + 10**6))
    store = InMemorySink()
    model = ScriptedModel([
        calls_reply(("call-1", "read", '{"path": "config.toml"}'), text="Reading the config."),
        text_reply("Switching to staging.toml: it listens on port 8443."),
        text_reply("Done: the tests are running.", pieces=2),
        text_reply("Deploying to staging now."),
        Hang(({"type": "text", "text": "Once upon a time, "},
              {"type": "text", "text": "a fox found a key"})),
        text_reply("…and the key opened the old mill's door."),
        text_reply("build/  src/  README.md"),
    ], provider="demo", model="demo-1")

    reading = asyncio.Event()
    typed = asyncio.Event()

    async def read(call: ToolCall) -> ToolResult:
        reading.set()
        await typed.wait()                   # the user types while the read runs
        return ToolResult([{"type": "text", "text": "port = 8080"}])  # type: ignore[arg-type]

    async def guard(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        if "rm -rf" in submit.message.text:
            return Block("destructive command")
        return await next_()

    agent = Agent(model, tools=[Tool("read", read, "parallel", "Read a file.")],
                  sink=store, clock=lambda: next(clock))
    agent.hooks.prompt_submit.use(guard)

    def since(mark: int) -> list[Event]:
        return list(agent.session.events)[mark:]

    async with agent:
        # -- 1 -------------------------------------------------------------------------
        printer.heading(1, "The user types while a tool runs", [
            "The model asks to read config.toml. While the read runs, the user types",
            "\"use staging.toml instead\"."])
        agent.followup("deploy the app")
        await reading.wait()
        agent.steer("use staging.toml instead")
        typed.set()
        await agent.when_idle()
        naive = [_Said("user", _quote("deploy the app")),
                 _Said("assistant", f"{_quote('Reading the config.')}  calls "
                       "read({\"path\": \"config.toml\"})", ("call-1",)),
                 _Said("user", _quote("use staging.toml instead")),
                 _Said("tool", f"result of call-1: {_quote('port = 8080')}", answers="call-1")]
        printer.side("Without turnstile: a loop that writes each message the moment it arrives "
                     "puts it between the call and its result; the next request is", False)
        printer.conversation(naive)
        problem = chat_refusal(naive)
        printer.verdict(f"refused by the provider (HTTP 400): {problem}", problem is None)
        after = [_Said.of(m) for m in model.calls[1].messages]
        printer.side("With turnstile: the message waits for the step to end, then joins the "
                     "same turn; the next request is", True)
        printer.conversation(after)
        answer = model_answer(agent, 1)
        printer.verdict("every tool result follows its call; the model answers the new "
                        f"instruction in the same turn: {_quote(answer, 80)}",
                        chat_refusal(after) is None)

        # -- 2 -------------------------------------------------------------------------
        printer.heading(2, "Messages that arrive as a turn ends", [
            "A CI plugin listens for the end of each turn and reports \"tests passed\";",
            "the user's next line, \"and deploy it\", arrives at that same moment."])
        mark = len(agent.session.events)

        def at_turn_end(event: Event) -> None:
            if event.data["turn"] == 2:
                agent.inject(user_message("ci-1", "tests passed (42 of 42)",
                                          {"kind": "plugin", "plugin": "ci"}))
                agent.steer("and deploy it")
        stop = agent.on("turn/end", at_turn_end)
        agent.followup("run the tests")
        await agent.when_idle()
        stop()
        printer.side("Without turnstile: the original loop refuses a write made by a listener "
                     "of the turn's end (it is still announcing it) and swallows the error", False)
        printer.verdict("the report \"tests passed\" is lost; and a loop that takes a typed "
                        "line only into a running turn drops \"and deploy it\" too", False)
        printer.side("With turnstile: the report is written right after the turn's end, and "
                     "the late line becomes the next prompt, run at once", True)
        closed = next(i for i, e in enumerate(since(mark)) if e.type == "turn/end")
        printer.log(since(mark)[closed:closed + 4])
        after_end = [e for e in since(mark)[closed:] if e.type in ("user/message", "turn/start")]
        said = [_text(e.data) for e in after_end if e.type == "user/message"]
        printer.verdict("nothing accepted was lost: after the turn's end, "
                        + ", then ".join(_describe(e) for e in after_end),
                        said == ["tests passed (42 of 42)", "and deploy it"])

        # -- 3 -------------------------------------------------------------------------
        printer.heading(3, "A cancel in the middle of an answer", [
            "The model streams a story; the user reads \"Once upon a time, a fox found a key\",",
            "cancels, then says \"go on\"."])
        streaming = asyncio.Event()
        stop = agent.on("assistant/chunk", lambda e: streaming.set()
                        if "fox" in str(_get(e.data, "chunk", "text")) else None)
        agent.followup("tell me a story")
        await streaming.wait()
        stop()
        agent.cancel("user")
        await agent.when_idle()
        agent.followup("go on")
        await agent.when_idle()
        request = [_Said.of(m) for m in model.calls[-1].messages][-3:]
        kept = [e for e in agent.session.events if e.type == "assistant/message"
                and e.data.get("interrupted") is True]
        printer.side("Without turnstile: the cancelled text stays on the user's screen but not "
                     "in the history; the next request ends with", False)
        printer.conversation([m for m in request if m.role != "assistant"])
        printer.verdict("the model never sees what it said, so \"go on\" has nothing to go on "
                        "from", False)
        printer.side("With turnstile: what the user watched stream is kept as the turn's "
                     "answer, marked interrupted; the next request ends with", True)
        printer.conversation(request)
        printer.verdict(f"the model continues the story: {_quote(model_answer(agent, -1), 80)}",
                        len(kept) == 1)

        # -- 4 -------------------------------------------------------------------------
        printer.heading(4, "A blocked prompt", [
            "A shell plugin adds \"cwd is /srv/app\" as the user asks for `rm -rf /`;",
            "a guard blocks the command."])
        mark = len(agent.session.events)
        agent.inject(user_message("cwd-1", "cwd is /srv/app", {"kind": "plugin", "plugin": "shell"}))
        agent.followup("rm -rf /")
        await agent.when_idle()
        agent.followup("list the files")
        await agent.when_idle()
        printer.side("Without turnstile: a loop that writes the prompt before asking the guard",
                     False)
        printer.verdict("keeps `rm -rf /` in every later request the model is sent; one that "
                        "drops the whole send loses the plugin's context with it", False)
        printer.side("With turnstile: the blocked prompt leaves no trace, the plugin's context "
                     "is kept, and the next prompt runs as usual", True)
        printer.log(since(mark))
        texts = [_text(e.data) for e in since(mark) if e.type == "user/message"]
        printer.verdict("the log holds the context and \"list the files\", never \"rm -rf /\"",
                        "rm -rf /" not in texts and "cwd is /srv/app" in texts)
    return agent, store


def model_answer(agent: Agent, turn: int) -> str:
    """The text of the last assistant message of *turn* (-1: the last turn)."""
    events = list(agent.session.events)
    wanted = agent.session.last_turn if turn == -1 else turn
    answers = [e for e in events if e.type == "assistant/message" and e.data["turn"] == wanted]
    return _text(answers[-1].data.get("message")) if answers else ""


def _describe(event: Event) -> str:
    if event.type == "turn/start":
        return f"turn {event.data['turn']} starts"
    return _quote(_text(event.data))


def _corpus(printer: _Printer, specs: Path | None, *, required: bool) -> bool:
    """Replay the conformance vectors and example scripts through the runtime."""
    s = printer.style
    printer.line()
    printer.line(s("▸ The conformance corpus, replayed through the asyncio runtime", "1;36"))
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
    from machine.cli.runner import ScriptError, load_script
    from machine.conformance.vectors import MalformedError, find_vectors, load_vector
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
    printer.line(s("turnstile demo", "1") + " — what goes wrong at an agent loop's seams, "
                 "and what turnstile does instead")
    printer.line(s("  One agent (machine.runtime.Agent) with a scripted model and a file tool; "
                   "log rows are the session log: position, event, what it holds.", "2"))
    agent, store = asyncio.run(asyncio.wait_for(_session(printer), 60))
    events = list(agent.session.events)
    violation = validate_events(events)
    turns = sum(1 for e in events if e.type == "turn/start")
    printer.line()
    printer.line(s("▸ The session log", "1;36"))
    printer.line(f"  {len(events)} events in {turns} turns, saved to the store after every "
                 f"turn ({store.flushes} saves); "
                 + (s("every session rule holds", "32") if violation is None
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
