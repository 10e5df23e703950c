"""``turnstile chat``: a small agent over an OpenAI-compatible endpoint or Anthropic
(specs/runtime.md RT20).

    turnstile chat --base-url http://127.0.0.1:8000/v1 --model qwen2.5 [--session s.jsonl [--resume]]
    turnstile chat --provider anthropic --model claude-sonnet-4-5 [--base-url URL]

It is the worked example of the runtime, end to end:

* the model is `OpenAIChat` (or `AnthropicMessages` with ``--provider anthropic``), with two
  harmless tools (``current_time``, ``word_count``) and a request-error handler that
  retries as the retry policy says, showing "retrying in N s";
* the session is a JSONL file (``--session``), continued with ``--resume`` (`Agent.resume`),
  which first shows the conversation so far;
* on a terminal the input line is its own line at the bottom (prompt_toolkit), with
  history and completion of the commands, while the answer streams above it (rich:
  colour, tool calls and their results, usage per turn); a line typed while the model is
  working is **steering** (it reaches the model at the next step of the same turn);
* ``/help``, ``/inject TEXT`` (context: appended at once when idle, staged for the next
  step while a turn runs), ``/cancel`` and ``/quit`` are handled here, never sent to the
  model (``//text`` sends ``/text``); Ctrl-C cancels the running turn; Ctrl-D or the end
  of input leaves once the agent is idle;
* a line that is not UTF-8 text is refused with a message, and the chat goes on.

Exit status: 0; 1 when the session cannot be opened or ends in failure (its last turn
failed); 2 for usage errors. Without a terminal (input from a pipe) the same chat runs on
plain lines, without prompt_toolkit.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, Final, TextIO, cast

from machine.cli.terminal import is_terminal
from machine.errors import TurnstileError
from machine.events import Event, LiveEvent
from machine.jsonvalue import FrozenDict, FrozenList
from machine.payloads import AgentErrorData, AssistantChunkData, ToolCallData, TurnEndData
from machine.runtime.agent import Agent
from machine.runtime.hooks import Next, RequestErrorContext
from machine.runtime.model import ModelAdapter
from machine.runtime.retry import RETRY, RetryAction, sleep_unless_aborted
from machine.runtime.tools import ToolCall, tool
from machine.store.errors import StoreError
from machine.store.jsonl import SUFFIX, JsonlStore
from machine.vocabulary import plugin_source, user_message

__all__ = ["COMMANDS", "TOOLS", "configure", "main", "run_chat"]

PROMPT: Final = "you> "
#: The commands the chat handles itself, with what they do.
COMMANDS: Final = {
    "/help": "this list",
    "/inject": "TEXT: add context (the model sees it at its next step)",
    "/cancel": "cancel the running turn (Ctrl-C does too)",
    "/quit": "leave (Ctrl-D too)",
}
HELP: Final = ("type a message; while the model works, a line steers it; "
               + "; ".join(f"{name} {what}" for name, what in COMMANDS.items())
               + "; //text sends /text")
#: How much of a tool's result is shown.
RESULT_PREVIEW: Final = 200


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


def _model(args: argparse.Namespace) -> ModelAdapter:
    provider = args.provider or "openai"
    key_variable = args.api_key_env or ("ANTHROPIC_API_KEY" if provider == "anthropic"
                                        else "OPENAI_API_KEY")
    api_key = os.environ.get(key_variable)
    if provider == "anthropic":
        from machine.runtime.adapters.anthropic import AnthropicMessages  # the anthropic extra
        return AnthropicMessages(args.model, base_url=args.base_url, api_key=api_key)
    if args.base_url is None:
        raise ChatError("--base-url is needed for an OpenAI-compatible endpoint")
    from machine.runtime.adapters.openai import OpenAIChat  # the openai extra
    return OpenAIChat(args.model, base_url=args.base_url, provider=provider, api_key=api_key)


def open_agent(args: argparse.Namespace) -> tuple[Agent, str]:
    """The agent for *args* and a line saying where its session lives."""
    model = _model(args)
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


def _text_of(message: object) -> str:
    content = message.get("content") if isinstance(message, FrozenDict) else None
    if not isinstance(content, FrozenList):
        return ""
    return "".join(str(block.get("text", "")) for block in content
                   if isinstance(block, FrozenDict) and block.get("type") == "text")


def _result_text(event: Event) -> tuple[str, bool]:
    """A tool result's text (its first block's inner text) and whether it is an error."""
    content = _get(event.data, "message", "content")
    block = content[0] if isinstance(content, FrozenList) and content else None
    if not isinstance(block, FrozenDict):
        return "", False
    return _text_of(block), block.get("isError") is True


def _get(value: object, *keys: str) -> object:
    for key in keys:
        if not isinstance(value, FrozenDict):
            return None
        value = value.get(key)
    return value


class View:
    """What the user sees, drawn with rich: the model's text as it streams, tools and their
    results, steering, context, retries, errors and the usage of each turn."""

    def __init__(self, out: TextIO | None, colour: bool) -> None:
        from rich.console import Console
        # file=None: rich writes to whatever sys.stdout is at the time (prompt_toolkit
        # swaps it while the input line is shown, so output goes above that line).
        self.console = Console(file=out, force_terminal=colour, no_color=not colour,
                               highlight=False, soft_wrap=True)
        self.colour = colour
        self.streaming = ""             # the kind of chunk last written: reasoning or text
        #: With an input line (prompt_toolkit), the streamed line not finished yet is shown
        #: just above the input line (`partial`), and printed above when it is complete:
        #: output never shares a line with what is being typed. *redraw* shows a change.
        self.hold_partial = False
        self.partial: list[tuple[str, str]] = []      # (style, text) of the unfinished line
        self.redraw: Callable[[], None] = lambda: None
        self.in_code = False                            # inside a code fence of the answer
        self.usage = [0, 0]             # this turn's tokens in and out
        self.retrying = False           # the turn that just failed is being retried
        self.last_end = ""              # how the last turn ended

    def attach(self, agent: Agent) -> None:
        agent.on("assistant/chunk", self.chunk)
        agent.on("assistant/message", self.message)
        agent.on("tool/call", self.tool_call)
        agent.on("tool/result", self.tool_result)
        agent.on("steering/message",
                 lambda e: self.say(f"[steering] {_text_of(e.data.get('message'))}", "magenta"))
        agent.on("user/message", self.context)
        agent.on("turn/end", self.turn_end)
        agent.on("agent/error", self.error)
        agent.on("agent/inbox/enqueue", self.enqueued)

    def write(self, text: str, style: str | None = None) -> None:
        if self.hold_partial:
            self._held(text, style)
            return
        self.console.print(text, end="", style=style, markup=False, highlight=False)
        self.console.file.flush()

    def _held(self, text: str, style: str | None) -> None:
        """Complete lines are printed (above the input line); the rest is kept in `partial`."""
        *done, rest = text.split("\n")
        for piece in done:
            self.partial.append((style or "", piece))
            if all(not part_style for part_style, _ in self.partial):
                self._markdown_line("".join(part for _, part in self.partial))
            else:
                from rich.text import Text
                line = Text()
                for part_style, part in self.partial:
                    line.append(part, style=part_style or None)
                self.console.print(line, soft_wrap=True)
            self.partial = []
        if rest:
            self.partial.append((style or "", rest))
        self.redraw()

    def _markdown_line(self, line: str) -> None:
        """One finished line of the answer, as Markdown: headings, lists, quotes, emphasis
        and code spans styled; lines inside a code fence shown as code. Line by line, so the
        answer still streams (a line is final once printed)."""
        fence = line.lstrip().startswith("```")
        if fence or self.in_code:
            self.in_code = self.in_code != fence
            self.console.print(line, style="dim" if fence else "green", markup=False,
                               highlight=False, soft_wrap=True)
            return
        stripped = line.lstrip()
        if not stripped or not self.colour:
            self.console.print(line, markup=False, highlight=False, soft_wrap=True)
            return
        if stripped.startswith("#"):
            level = len(stripped) - len(stripped.lstrip("#"))
            if stripped[level:level + 1] == " ":
                self.console.print(stripped[level + 1:], markup=False, highlight=False,
                                   style="bold underline" if level == 1 else "bold",
                                   soft_wrap=True)
                return
        from rich.markdown import Markdown
        with self.console.capture() as captured:
            self.console.print(Markdown(line))
        rendered = "\n".join(part.rstrip() for part in captured.get().strip("\n").split("\n"))
        self.console.file.write(rendered + "\n")
        self.console.file.flush()

    def say(self, line: str, style: str | None = None) -> None:
        """A line of its own. With an input line it goes above the streamed line that is not
        finished yet, which goes on; without one, that line is ended first."""
        if self.hold_partial:
            self.console.print(line, style=style, markup=False, highlight=False)
            return
        if self.streaming:
            self.write("\n")
        self.streaming = ""
        self.write(line + "\n", style)

    def chunk(self, event: Event) -> None:
        chunk = event.data_as(AssistantChunkData)
        kind = chunk.chunk_type
        if kind not in ("text", "reasoning"):
            return
        if kind != self.streaming:
            if self.streaming:
                self.write("\n")
            if kind == "reasoning":
                self.write("(thinking) ", "dim italic")
            self.streaming = kind
        self.write(chunk.text, "dim italic" if kind == "reasoning" else None)

    def message(self, event: Event) -> None:
        if self.streaming:              # the message is complete: so is its last line
            self.write("\n")
            self.streaming = ""
        self.in_code = False
        usage = event.data.get("usage")
        if isinstance(usage, FrozenDict):
            for index, key in enumerate(("inputTokens", "outputTokens")):
                value = usage.get(key)
                if isinstance(value, int):
                    self.usage[index] += value

    def tool_call(self, event: Event) -> None:
        call = event.data_as(ToolCallData)
        self.say(f"[tool] {call.name}({call.arguments})", "cyan")

    def tool_result(self, event: Event) -> None:
        text, failed = _result_text(event)
        shown = " ".join(text.split())
        if len(shown) > RESULT_PREVIEW:
            shown = shown[:RESULT_PREVIEW - 1] + "…"
        self.say(f"[result] {shown}", "red" if failed else "dim cyan")

    def context(self, event: Event) -> None:
        if event.message.source.get("kind") == "plugin":
            self.say(f"[context] {event.message.text}", "magenta")

    def turn_end(self, event: Event) -> None:
        end = event.data_as(TurnEndData)
        kind = end.reason.kind
        self.last_end = kind
        if self.streaming:
            self.write("\n")
        self.streaming = ""
        inputs, outputs = self.usage
        self.usage = [0, 0]
        if kind == "error" and self.retrying:
            self.retrying = False
            return                      # said with the retry notice
        if kind != "completed":
            self.write(f"[turn {end.turn} ended: {kind}]\n", "red" if kind == "error" else "yellow")
        if inputs or outputs:
            self.write(f"(turn {end.turn}: {inputs} tokens in, {outputs} out)\n", "dim")

    def error(self, notice: LiveEvent) -> None:
        if not self.retrying:           # a retried failure was said with its retry
            self.say(f"[error] {notice.payload_as(AgentErrorData).error.rendered()}",
                     "bold red")

    def enqueued(self, notice: LiveEvent) -> None:
        if notice.payload.get("placement") == "steering":
            self.say("[steering accepted: the model sees it at its next step]", "magenta")

    def retry_notice(self, error: str, seconds: float, attempt: int) -> None:
        self.retrying = True
        self.say(f"[error] {error}; retrying in {seconds:.1f} s (attempt {attempt + 1})",
                 "yellow")

    def history(self, agent: Agent) -> None:
        """The conversation so far (``--resume``)."""
        from rich.markdown import Markdown
        self.say("── the conversation so far ──", "dim")
        for event in agent.session.events:
            kind = event.type
            if kind == "user/message" and event.message.source.get("kind") == "user":
                self.say(f"{PROMPT}{event.message.text}", "bold")
            elif kind == "user/message" and event.message.source.get("kind") == "plugin":
                self.context(event)
            elif kind == "steering/message":
                self.say(f"[steering] {_text_of(event.data.get('message'))}", "magenta")
            elif kind == "assistant/message":
                text = _text_of(event.data.get("message"))
                if text:
                    self.console.print(Markdown(text) if self.colour else text)
            elif kind == "tool/call":
                self.tool_call(event)
            elif kind == "turn/end" and _get(event.data, "reason", "kind") != "completed":
                self.say(f"[turn {event.data.get('turn')} ended: "
                         f"{_get(event.data, 'reason', 'kind')}]", "yellow")
        self.say("── now ──", "dim")


def refused(line: str) -> str | None:
    """Why *line* cannot be sent (not UTF-8 text: a byte the terminal could not decode), or
    None."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError as error:
        byte = ord(line[error.start]) - 0xDC00 if 0xDC80 <= ord(line[error.start]) <= 0xDCFF \
            else None
        what = f"byte 0x{byte:02x}" if byte is not None else "an unpaired surrogate"
        return f"that line is not UTF-8 text ({what} at character {error.start + 1}); " \
               "nothing was sent"
    return None


class Chat:
    """The chat's logic: each line typed, as the module docstring says."""

    def __init__(self, agent: Agent, view: View) -> None:
        self.agent = agent
        self.view = view
        self.leaving = False

    async def retry(self, context: RequestErrorContext, rest: Next[RetryAction | None]
                    ) -> RetryAction | None:
        """`retry_request`, saying "retrying in N s"."""
        decided = await rest()
        if decided is not None:
            return decided
        attempt = len(context.prior_failures) + 1
        wait = context.retry_policy.delay(context.failure, attempt)
        if wait is None:
            return None
        self.view.retry_notice(context.error.rendered(), wait, attempt)
        if await sleep_unless_aborted(wait, context.signal):
            return RETRY
        self.view.retrying = False
        return None

    def line(self, line: str) -> None:
        """Handle one line typed (sets `leaving` for /quit)."""
        problem = refused(line)
        if problem is not None:
            self.view.say(f"[refused] {problem}", "red")
            return
        text = line.strip()
        if not text:
            return
        if text.startswith("/") and not text.startswith("//"):
            self.command(text)
            return
        if text.startswith("//"):
            line = line.lstrip()[1:]
        try:
            if self.agent.status == "running":
                self.agent.steer(line)           # reaches the model at its next step
            else:
                self.agent.followup(line)
        except TurnstileError as error:          # refused by the core: nothing was sent
            self.view.say(f"[refused] {error}", "red")

    def command(self, text: str) -> None:
        name, _, rest = text.partition(" ")
        if name in ("/quit", "/exit"):
            self.leaving = True
        elif name == "/help":
            self.view.say("\n".join([f"  {n:<8} {what}" for n, what in COMMANDS.items()]
                                    + ["  //text   sends /text to the model",
                                       "  a line typed while the model works steers it"]))
        elif name == "/cancel":
            if self.agent.status == "running":
                self.cancel()
            else:
                self.view.say("[nothing to cancel]", "dim")
        elif name == "/inject":
            if not rest.strip():
                self.view.say("[usage: /inject TEXT]", "red")
                return
            staged = self.agent.status == "running"
            try:
                self.agent.inject(user_message(f"chat-{len(self.agent.session)}", rest,
                                               plugin_source("chat")))
            except TurnstileError as error:
                self.view.say(f"[refused] {error}", "red")
                return
            if staged:
                self.view.say("[context staged: the model sees it at its next step]",
                              "magenta")
        else:
            self.view.say(f"[unknown command {name}: /help lists them; //text sends /text]",
                          "red")

    def cancel(self) -> None:
        self.agent.cancel()
        self.view.say("[cancelled]", "yellow")

    def interrupt(self) -> None:
        """Ctrl-C: cancel the running turn; at the prompt, say how to leave."""
        if self.agent.status == "running":
            self.cancel()
        else:
            self.view.say("(/quit or Ctrl-D to leave)", "dim")


class _AboveInput:
    """Where the chat's output goes while the input line is shown: each flush erases the
    input line, writes above it and has it drawn again below.

    Why not prompt_toolkit's ``patch_stdout``: it writes in the terminal's cooked mode,
    in which the terminal itself echoes what is typed meanwhile, so keys pressed while the
    answer streams landed in the middle of it. Here the terminal stays in raw mode and only
    prompt_toolkit draws what is typed."""

    def __init__(self, out: IO[str], session: Any) -> None:
        self.out = out
        self.session = session
        self.pending: list[str] = []

    def write(self, text: str) -> int:
        self.pending.append(text)
        return len(text)

    def flush(self) -> None:
        if not self.pending:
            return
        text, self.pending = "".join(self.pending), []
        app = self.session.app
        if app.is_running and not app.is_done:
            app.renderer.erase()        # the input line goes; the cursor is where it was
            self.out.write(text)
            self.out.flush()
            app.renderer.reset()
            app.invalidate()            # drawn again below the new output
        else:
            self.out.write(text)
            self.out.flush()

    def isatty(self) -> bool:
        return self.out.isatty()

    def fileno(self) -> int:
        return self.out.fileno()

    @property
    def encoding(self) -> str:
        return getattr(self.out, "encoding", "utf-8") or "utf-8"


async def _interactive(chat: Chat) -> None:
    """A terminal: the input line stays at the bottom while the answer streams above."""
    from prompt_toolkit import PromptSession
    from prompt_toolkit.completion import WordCompleter
    from prompt_toolkit.formatted_text import FormattedText
    from prompt_toolkit.history import InMemoryHistory

    view = chat.view
    completer = WordCompleter(list(COMMANDS), sentence=True, match_middle=False)

    def message() -> FormattedText:
        """The streamed line not finished yet, above the input line."""
        if not view.partial:
            return FormattedText([("bold", PROMPT)])
        return FormattedText([*((_pt_style(style), text) for style, text in view.partial),
                              ("", "\n"), ("bold", PROMPT)])

    session: PromptSession[str] = PromptSession(history=InMemoryHistory(), completer=completer,
                                                complete_while_typing=True,
                                                reserve_space_for_menu=len(COMMANDS))
    view.hold_partial = True
    view.redraw = lambda: session.app.invalidate() if session.app.is_running else None
    above = _AboveInput(view.console.file, session)
    view.console.file = cast(IO[str], above)     # a file as far as rich is concerned
    try:
        with _keys_kept():
            await _prompting(chat, session, message)
    finally:
        view.console.file = above.out
    if view.partial:                    # the line being streamed when the chat ended
        view.hold_partial = False
        view.write("\n")
    view.hold_partial = False


@contextlib.contextmanager
def _keys_kept() -> Iterator[None]:
    """Between two prompts (while a line is handled) the terminal stays without echo, line
    editing and signals, as during a prompt: what is typed then, Ctrl-C included, waits
    for the next prompt instead of being echoed into the output or becoming a SIGINT that
    the chat would miss. The terminal's settings are restored at the end."""
    try:
        import termios
        fd = sys.stdin.fileno()
        saved = termios.tcgetattr(fd)
    except (ImportError, OSError, ValueError, AttributeError):   # not a POSIX terminal
        yield
        return
    quiet = list(saved)
    quiet[3] &= ~(termios.ECHO | termios.ICANON | termios.ISIG)      # the local modes
    termios.tcsetattr(fd, termios.TCSANOW, quiet)
    try:
        yield
    finally:
        termios.tcsetattr(fd, termios.TCSANOW, saved)


async def _prompting(chat: Chat, session: Any, message: Callable[[], Any]) -> None:
    """Read lines until the chat is left."""
    while not chat.leaving:
        try:
            line = await session.prompt_async(message)
        except KeyboardInterrupt:
            chat.interrupt()
            continue
        except EOFError:                # Ctrl-D: finish what was asked first
            await chat.agent.when_idle()
            break
        chat.line(line)


def _pt_style(style: str) -> str:
    """A rich style name as prompt_toolkit's ("dim italic" -> "italic fg:ansibrightblack")."""
    words = style.split()
    return " ".join("fg:ansibrightblack" if word == "dim" else
                    word if word in ("bold", "italic", "underline") else f"fg:ansi{word}"
                    for word in words)


def _read_lines(stream: Any, loop: asyncio.AbstractEventLoop,
                lines: asyncio.Queue[str | None]) -> None:
    """A thread: every line of a byte stream (decoded as UTF-8, undecodable bytes kept as
    surrogates so the chat can refuse the line), then None at end of input."""
    for raw in iter(stream.readline, b""):
        text = raw.decode("utf-8", "surrogateescape").rstrip("\n")
        loop.call_soon_threadsafe(lines.put_nowait, text)
    loop.call_soon_threadsafe(lines.put_nowait, None)


async def _plain(chat: Chat, stdin: Any) -> None:
    """Input from a pipe or a file: one line at a time."""
    loop = asyncio.get_running_loop()
    lines: asyncio.Queue[str | None] = asyncio.Queue()
    threading.Thread(target=_read_lines, args=(stdin, loop, lines), daemon=True).start()
    while not chat.leaving:
        line = await lines.get()
        if line is None:                # end of input: finish what was asked first
            await chat.agent.when_idle()
            break
        chat.line(line)


async def run_chat(args: argparse.Namespace, stdin: Any, stdout: TextIO | None,
                   interactive: bool | None = None) -> int:
    """The chat loop (see the module docstring); returns the exit status. *stdin* is a byte
    stream; *interactive* (default: whether standard input and output are a terminal)
    chooses prompt_toolkit."""
    if interactive is None:
        interactive = is_terminal(sys.stdin) and is_terminal(sys.stdout)
    _check_extras(interactive)
    agent, where = open_agent(args)
    view = View(stdout, colour=interactive and not os.environ.get("NO_COLOR"))
    chat = Chat(agent, view)
    if agent.load_report is not None or (args.resume and len(agent.session)):
        view.history(agent)
    view.attach(agent)
    agent.hooks.request_error.use(chat.retry)
    loop = asyncio.get_running_loop()
    handled = False
    if not interactive:                 # prompt_toolkit reads Ctrl-C itself
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signal.SIGINT, chat.interrupt)
            handled = True
    endpoint = args.base_url or "the provider's default endpoint"
    view.say(f"turnstile chat: {args.model} ({args.provider or 'openai'}) at {endpoint}; "
             f"{where}", "bold")
    view.say(HELP, "dim")
    try:
        async with agent:
            if interactive:
                await _interactive(chat)
            else:
                await _plain(chat, stdin)
    finally:
        if handled:
            loop.remove_signal_handler(signal.SIGINT)
    view.say("bye")
    return 1 if view.last_end == "error" else 0


def _check_extras(interactive: bool) -> None:
    """rich always, prompt_toolkit on a terminal: else a usage error naming the extra."""
    import importlib.util
    needed = ["rich", "prompt_toolkit"] if interactive else ["rich"]
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        raise ChatError(f"the chat needs {' and '.join(missing)}: pip install "
                        "'turnstile-agent[cli]'")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Chat with a model of an OpenAI-compatible endpoint or of Anthropic "
                          "through the turnstile runtime. " + HELP + ".")
    parser.add_argument("--base-url", default=None, help="the endpoint, e.g. "
                        "http://127.0.0.1:8000/v1 or https://api.deepseek.com (needed for "
                        "OpenAI-compatible providers; Anthropic's by default)")
    parser.add_argument("--model", required=True, help="the model name")
    parser.add_argument("--provider", default=None,
                        help="'anthropic' for the Messages API; any other name is an "
                             "OpenAI-compatible endpoint, recorded under that name "
                             "(default: openai)")
    parser.add_argument("--api-key-env", default=None, metavar="VAR",
                        help="the environment variable holding the API key (default: "
                             "ANTHROPIC_API_KEY or OPENAI_API_KEY)")
    parser.add_argument("--system", default=None, help="a system prompt")
    parser.add_argument("--session", metavar="FILE", default=None,
                        help=f"keep the session in FILE (NAME{SUFFIX})")
    parser.add_argument("--resume", action="store_true",
                        help="continue the session in --session FILE (its conversation is "
                             "shown first)")


def main(args: argparse.Namespace) -> int:
    """``turnstile chat``: exit 0, 1 for a session that cannot be opened or that ended in
    failure, 2 for usage."""
    try:
        return asyncio.run(run_chat(args, sys.stdin.buffer, None))
    except ChatError as error:
        print(f"turnstile chat: {error}", file=sys.stderr)
        return 2
    except StoreError as error:
        print(f"turnstile chat: {error}", file=sys.stderr)
        return 1
    except (ImportError, TurnstileError) as error:   # a missing extra; a bad option
        print(f"turnstile chat: {error}", file=sys.stderr)
        return 2
