"""``turnstile chat`` against the fake server, through a pseudo-terminal (specs/runtime.md RT20).

The chat runs as a real process on a pseudo-terminal. What it writes is read twice: as a
stream with the terminal's control sequences taken out (`Terminal.expect`: text in the
order it appeared) and through a terminal emulator, pyte (`Terminal.lines`: the screen a
person sees, to check that the input line stays a line of its own)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pyte
import pytest

from machine.cli.main import main as cli_main
from machine.log import validate_events
from machine.runtime.adapters.fake_server import (
    FakeServer,
    Reply,
    anthropic_text,
    openai_text,
    openai_tool_calls,
)
from machine.runtime.chat import refused
from machine.store import JsonlStore

ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0                 # generous: CI is a loaded 2-core machine; nothing is timed
COLUMNS, ROWS = 160, 400    # tall enough that nothing scrolls off during a test
#: Control sequences: CSI (colours, cursor moves), OSC, charset and keypad modes, BS, BEL.
CONTROL = re.compile(r"\x1b(\[[0-?]*[ -/]*[@-~]|\][^\x07]*\x07|[()][0-9A-Za-z]|[=>])|[\x08\x07]")
UP, TAB, ENTER, CTRL_C, CTRL_D = b"\x1b[A", b"\t", b"\r", b"\x03", b"\x04"


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")}
    env["PYTHONUNBUFFERED"] = "1"
    env["TERM"] = "xterm-256color"
    # No terminal emulator answers prompt_toolkit's cursor-position requests here.
    env["PROMPT_TOOLKIT_NO_CPR"] = "1"
    env.pop("NO_COLOR", None)
    return env


def _controlling_terminal() -> None:
    """In the child, after its new session: make the pseudo-terminal (its stdin) the
    controlling terminal, so that Ctrl-C typed on it is a SIGINT."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """``turnstile chat`` on a pseudo-terminal: type, press keys, read the screen."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "machine.cli.main", "chat", *args], stdin=slave, stdout=slave,
            stderr=slave, cwd=ROOT, env=_environment(), start_new_session=True, close_fds=True,
            preexec_fn=_controlling_terminal)
        os.close(slave)
        self.raw = ""
        self.text = ""
        self.seen = 0
        self.screen = pyte.Screen(COLUMNS, ROWS)
        self.stream = pyte.Stream(self.screen)

    def expect(self, text: str) -> str:
        """Read until *text* appears after what was expected before; returns the new part."""
        self._until(lambda: text in self.text[self.seen:], repr(text))
        end = self.text.index(text, self.seen) + len(text)
        part, self.seen = self.text[self.seen:end], end
        return part

    def lines(self) -> list[str]:
        """The screen's lines as shown, without the blank ones."""
        return [line.rstrip() for line in self.screen.display if line.strip()]

    def shows(self, check: Callable[[list[str]], bool], what: str) -> list[str]:
        """Read until the screen satisfies *check*; its lines."""
        self._until(lambda: check(self.lines()), what)
        return self.lines()

    def _until(self, done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + WAIT
        while not done():
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.process.poll() is not None and not self._read(0.1)):
                raise AssertionError(f"{what} never appeared; the output:\n{self.text}\n"
                                     f"the screen:\n" + "\n".join(self.lines()))
            self._read(min(remaining, 0.5))

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:
            return False
        decoded = data.decode("utf-8", "replace")
        self.raw += decoded
        self.stream.feed(decoded)
        self.text = CONTROL.sub("", self.raw).replace("\r\n", "\n")
        return bool(data)

    def type(self, text: str | bytes, enter: bool = True) -> None:
        data = text.encode() if isinstance(text, str) else text
        os.write(self.master, data + (ENTER if enter else b""))

    def key(self, key: bytes) -> None:
        os.write(self.master, key)

    def close(self) -> int:
        """Wait for the chat to exit; its exit status."""
        return self.process.wait(WAIT)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(WAIT)
        os.close(self.master)


@contextlib.contextmanager
def chatting(*args: str) -> Iterator[Terminal]:
    """``turnstile chat ARGS`` on a pseudo-terminal, killed at the end whatever happened."""
    chat = Terminal(*args)
    try:
        yield chat
    finally:
        chat.kill()


def input_line(lines: list[str]) -> str:
    """The input line: the last line of the screen that starts with the prompt."""
    return next(line for line in reversed(lines) if line.startswith("you>"))


def test_RT20_chat_streams_steers_injects_cancels_calls_tools_and_quits() -> None:
    with FakeServer.start_in_thread([
            openai_text("first answer", pieces=3).but(hold_at=2),
            openai_text("after steering"),
            openai_text("never finished", pieces=3).but(hold_at=2),
            openai_tool_calls(("c1", "word_count", '{"text": "a b c"}')),
            openai_text("three words")]) as server:
        with chatting("--base-url", server.openai_base_url, "--model", "fake-model") as chat:
            chat.expect("you>")
            chat.type("hello")
            chat.expect("firs")                        # streamed; the server now holds
            chat.type("also th", enter=False)          # typed while the answer streams
            screen = chat.shows(lambda s: input_line(s) == "you> also th",
                                "the typed text on the input line")
            streamed = screen[screen.index("you> also th") - 1]
            assert streamed.endswith("firs")           # the answer: on the line above
            chat.type("is")                            # sent while streaming: steering
            chat.expect("[steering accepted")
            server.release()
            chat.expect("[steering] also this")
            chat.expect("after steering")
            chat.expect("(turn 1: ")                   # usage per turn
            chat.type("/inject cwd is /tmp")
            chat.expect("[context] cwd is /tmp")
            chat.type("count words")
            chat.expect("neve")
            # /inject is said at once, not at the step's end; the Ctrl-C typed right after
            # it (before the next prompt is up) still cancels the turn
            chat.key(b"/inject the turn is slow" + ENTER + CTRL_C)
            chat.expect("[context staged: the model sees it at its next step]")
            chat.expect("[cancelled]")
            chat.expect("[turn 2 ended: aborted]")
            server.release()
            chat.key(CTRL_C)                           # at the prompt: only a hint
            chat.expect("/quit or Ctrl-D to leave")
            chat.type("how many words in a b c?")
            chat.expect('[tool] word_count({"text": "a b c"})')
            chat.expect("[result] 3")
            chat.expect("three words")
            chat.expect("(turn 3: ")
            chat.type("/quit")
            chat.expect("bye")
            assert chat.close() == 0
        second = server.requests[1].json["messages"]
        assert second[-2:] == [{"role": "assistant", "content": "first answer"},
                               {"role": "user", "content": "also this"}]
        third = server.requests[2].json["messages"]
        assert {"role": "user", "content": "[context from plugin:chat]\ncwd is /tmp"} in third
        assert third[-1] == {"role": "user", "content": "count words"}
        fifth = server.requests[4].json["messages"]
        assert fifth[-1] == {"role": "tool", "tool_call_id": "c1", "content": "3"}
        assert [t["function"]["name"] for t in server.requests[0].json["tools"]] == [
            "current_time", "word_count"]


def test_RT20_commands_are_local_with_history_completion_and_refused_bytes() -> None:
    with FakeServer.start_in_thread([openai_text("one"), openai_text("two"),
                                     openai_text("slash")]) as server:
        with chatting("--base-url", server.openai_base_url, "--model", "fake-model") as chat:
            chat.expect("you>")
            chat.type("first question")
            chat.expect("one")
            chat.expect("(turn 1: ")
            chat.key(UP)                                # history: the line typed before
            chat.shows(lambda s: input_line(s) == "you> first question", "the recalled line")
            chat.key(ENTER)
            chat.expect("two")
            chat.expect("(turn 2: ")
            chat.type("/he", enter=False)               # completion of the commands
            chat.shows(lambda s: any(line.strip() == "/help" for line in s[-6:]),
                       "the completion menu")
            chat.key(TAB)
            chat.shows(lambda s: input_line(s) == "you> /help", "the completed command")
            chat.key(ENTER)
            chat.expect("/cancel  cancel the running turn")      # /help, answered here
            chat.type("/cancel")
            chat.expect("[nothing to cancel]")
            chat.type("/frobnicate now")
            chat.expect("[unknown command /frobnicate")
            chat.type("/inject")
            chat.expect("[usage: /inject TEXT]")
            chat.type(b"caf\xe9 au lait")               # Latin-1: not UTF-8
            chat.expect("[refused] that line is not UTF-8 text (byte 0xe9 at character 4)")
            chat.type("//etc is a folder")              # // sends a line starting with /
            chat.expect("slash")
            chat.key(CTRL_D)
            chat.expect("bye")
            assert chat.close() == 0
        sent = [request.json["messages"][-1]["content"] for request in server.requests]
        assert sent == ["first question", "first question", "/etc is a folder"]


def test_RT20_the_answer_is_shown_as_markdown_line_by_line() -> None:
    answer = "# Plan\n- **first** step\n```\nx = `raw` # kept\n```\nThat is *all*."
    with FakeServer.start_in_thread([openai_text(answer, pieces=4)]) as server, \
            chatting("--base-url", server.openai_base_url, "--model", "fake-model") as chat:
        chat.expect("you>")
        chat.type("plan it")
        chat.expect("(turn 1: ")
        screen = chat.lines()
        start = screen.index("you> plan it")
        assert screen[start + 1:start + 7] == [
            "Plan", " • first step", "```", "x = `raw` # kept", "```", "That is all."]
        rows = [row.rstrip() for row in chat.screen.display]
        step = rows.index(" • first step")
        assert chat.screen.buffer[step][3].bold          # **first**: emphasis, drawn bold
        assert not chat.screen.buffer[step][10].bold     # "step"
        heading = rows.index("Plan", step - 2)
        assert chat.screen.buffer[heading][0].underscore
        chat.type("/quit")
        assert chat.close() == 0


def test_RT20_retries_are_shown_and_a_failed_session_exits_1() -> None:
    unavailable = Reply.error(503, {"error": {"message": "overloaded", "type": "server"}})
    with FakeServer.start_in_thread([unavailable, openai_text("recovered"),
                                     unavailable, unavailable, unavailable]) as server:
        with chatting("--base-url", server.openai_base_url, "--model", "fake-model") as chat:
            chat.expect("you>")
            chat.type("hi")
            chat.expect("[error] openai 503: overloaded; retrying in ")
            chat.expect(" s (attempt 2)")
            chat.expect("recovered")
            chat.type("again")
            chat.expect("; retrying in ")
            chat.expect(" s (attempt 2)")
            chat.expect("; retrying in ")
            chat.expect(" s (attempt 3)")
            chat.expect("[error] openai 503: overloaded")   # the policy gave up
            chat.expect("[turn 5 ended: error]")
            chat.key(CTRL_D)
            chat.expect("bye")
            assert chat.close() == 1                   # the session ended in failure
        assert len(server.requests) == 5
    assert chat.text.count("overloaded") == 4       # each failure said once
    assert "turn 1 ended" not in chat.text


def _chat_once(base_url: str, *args: str, lines: str | bytes
               ) -> subprocess.CompletedProcess[str]:
    data = lines.encode() if isinstance(lines, str) else lines
    result = subprocess.run([sys.executable, "-m", "machine.cli.main", "chat", "--base-url", base_url,
                             "--model", "fake-model", *args], input=data, capture_output=True,
                            cwd=ROOT, env=_environment(), timeout=WAIT, check=False)
    return subprocess.CompletedProcess(result.args, result.returncode,
                                       result.stdout.decode("utf-8", "replace"),
                                       result.stderr.decode("utf-8", "replace"))


def test_RT20_chat_keeps_a_session_file_and_resume_shows_the_conversation(
        tmp_path: Path) -> None:
    session = tmp_path / "talk.jsonl"
    with FakeServer.start_in_thread([openai_tool_calls(("c1", "word_count", '{"text": "x y"}')),
                                     openai_text("hello back"),
                                     openai_text("still here")]) as server:
        first = _chat_once(server.openai_base_url, "--session", str(session), lines="hi\n")
        assert first.returncode == 0, first.stderr
        assert f"new session {session}" in first.stdout and "hello back" in first.stdout
        again = _chat_once(server.openai_base_url, "--session", str(session), lines="x\n")
        assert again.returncode == 2 and "pass --resume" in again.stderr
        with chatting("--base-url", server.openai_base_url, "--model", "fake-model",
                        "--session", str(session), "--resume") as chat:
            chat.expect("the conversation so far")
            chat.expect("you> hi")
            chat.expect('[tool] word_count({"text": "x y"})')
            chat.expect("hello back")
            chat.expect("── now ──")
            chat.expect("events, 1 turn")
            chat.type("and now?")
            chat.expect("still here")
            chat.type("/quit")
            chat.expect("bye")
            assert chat.close() == 0
        assert server.requests[2].json["messages"][-2:] == [
            {"role": "assistant", "content": "hello back"},
            {"role": "user", "content": "and now?"}]
    events = JsonlStore(tmp_path).load("talk").events
    assert validate_events(events) is None
    assert [e.data["turn"] for e in events if e.type == "turn/start"] == [1, 2]
    assert [e.data["reason"] for e in events if e.type == "request/header"] == ["initial",
                                                                                "resume"]


def test_RT20_provider_anthropic_speaks_the_messages_api() -> None:
    with FakeServer.start_in_thread([anthropic_text("bonjour", pieces=2)]) as server:
        with chatting("--provider", "anthropic", "--base-url", server.base_url,
                        "--model", "claude-test") as chat:
            chat.expect("claude-test (anthropic)")
            chat.type("salut")
            chat.expect("bonjour")
            chat.expect("(turn 1: 5 tokens in, 2 out)")
            chat.type("/quit")
            chat.expect("bye")
            assert chat.close() == 0
        (request,) = server.requests
        assert request.path == "/v1/messages"
        assert request.json["model"] == "claude-test"
        assert request.json["messages"] == [
            {"role": "user", "content": [{"type": "text", "text": "salut"}]}]


def test_RT20_piped_input_refuses_undecodable_lines_and_goes_on() -> None:
    with FakeServer.start_in_thread([openai_text("fine")]) as server:
        result = _chat_once(server.openai_base_url, lines=b"caf\xe9\nhello\n")
        assert result.returncode == 0, result.stderr
        assert "[refused] that line is not UTF-8 text (byte 0xe9 at character 4)" \
            in result.stdout
        assert "fine" in result.stdout
        assert [r.json["messages"][-1]["content"] for r in server.requests] == ["hello"]
        assert "\x1b[" not in result.stdout             # no colour into a pipe


def test_RT20_refused_names_the_byte() -> None:
    assert refused("plain") is None
    assert refused("caf\udce9") == ("that line is not UTF-8 text (byte 0xe9 at character 4); "
                                    "nothing was sent")
    assert refused("\ud800") is not None and "unpaired surrogate" in str(refused("\ud800"))


@pytest.mark.parametrize(("args", "message"), [
    (["--resume"], "--resume needs --session FILE"),
    (["--session", "talk.txt"], "a session file is named NAME.jsonl"),
    (["--session", "MISSING.jsonl", "--resume"], "MISSING"),
])
def test_RT20_chat_usage_errors_exit_with_a_message(
        args: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    status = cli_main(["chat", "--base-url", "http://127.0.0.1:9/v1", "--model", "m", *args])
    assert status in (1, 2)
    assert message in capsys.readouterr().err


def test_RT20_an_openai_compatible_provider_needs_a_base_url(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["chat", "--model", "m"]) == 2
    assert "--base-url is needed" in capsys.readouterr().err


def test_RT20_a_missing_cli_extra_is_named(monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "rich" else real(name, *rest))
    assert cli_main(["chat", "--base-url", "http://127.0.0.1:9/v1", "--model", "m"]) == 2
    assert "the chat needs rich: pip install 'turnstile-agent[cli]'" in capsys.readouterr().err
