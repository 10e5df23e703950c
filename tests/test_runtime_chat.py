"""``turnstile chat`` against the fake server, through a pseudo-terminal (specs/runtime.md RT20)."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

from machine.cli import main as cli_main
from machine.log import validate_events
from machine.runtime.adapters.fake_server import (
    FakeServer,
    openai_text,
    openai_tool_calls,
)
from machine.store import JsonlStore

ROOT = Path(__file__).resolve().parents[1]
WAIT = 60.0                 # generous: CI is a loaded 2-core machine; nothing is timed


def _environment() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("API_KEY")}
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _controlling_terminal() -> None:
    """In the child, after its new session: make the pseudo-terminal (its stdin) the
    controlling terminal, so that Ctrl-C typed on it is a SIGINT."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """``turnstile chat`` on a pseudo-terminal: type lines, press Ctrl-C, read the screen."""

    def __init__(self, *args: str) -> None:
        self.master, slave = pty.openpty()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "machine.cli", "chat", *args], stdin=slave, stdout=slave,
            stderr=slave, cwd=ROOT, env=_environment(), start_new_session=True, close_fds=True,
            preexec_fn=_controlling_terminal)
        os.close(slave)
        self.screen = ""
        self.seen = 0

    def expect(self, text: str) -> str:
        """Read until *text* appears after what was expected before; returns the new part."""
        deadline = time.monotonic() + WAIT
        while text not in self.screen[self.seen:]:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or (self.process.poll() is not None and not self._read(0.1)):
                raise AssertionError(f"{text!r} never appeared; the screen:\n{self.screen}")
            self._read(min(remaining, 0.5))
        end = self.screen.index(text, self.seen) + len(text)
        part, self.seen = self.screen[self.seen:end], end
        return part

    def _read(self, timeout: float) -> bool:
        ready, _, _ = select.select([self.master], [], [], timeout)
        if not ready:
            return False
        try:
            data = os.read(self.master, 65536)
        except OSError:
            return False
        self.screen += data.decode("utf-8", "replace").replace("\r\n", "\n")
        return bool(data)

    def type(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def interrupt(self) -> None:
        os.write(self.master, b"\x03")               # the terminal turns it into SIGINT

    def close(self) -> int:
        """Wait for the chat to exit; its exit status."""
        return self.process.wait(WAIT)

    def kill(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(WAIT)
        os.close(self.master)


def test_RT20_chat_streams_steers_injects_cancels_calls_tools_and_quits() -> None:
    with FakeServer.start_in_thread([
            openai_text("first answer", pieces=3).but(hold_at=2),
            openai_text("after steering"),
            openai_text("never finished", pieces=3).but(hold_at=2),
            openai_tool_calls(("c1", "word_count", '{"text": "a b c"}')),
            openai_text("three words")]) as server:
        chat = Terminal("--base-url", server.openai_base_url, "--model", "fake-model")
        try:
            chat.expect("you> ")
            chat.type("hello")
            chat.expect("firs")                        # streamed; the server now holds
            chat.type("also this")                     # typed while streaming: steering
            chat.expect("[steering accepted")
            server.release()
            chat.expect("[steering] also this")
            chat.expect("after steering")
            chat.expect("you> ")
            chat.type("/inject cwd is /tmp")
            chat.expect("[context] cwd is /tmp")
            chat.type("count words")
            chat.expect("neve")
            chat.interrupt()                           # Ctrl-C: cancel the turn
            chat.expect("[cancelled]")
            chat.expect("[turn 2 ended: aborted]")
            chat.expect("you> ")
            server.release()
            chat.interrupt()                           # at the prompt: only a hint
            chat.expect("/quit or Ctrl-D to leave")
            chat.type("how many words in a b c?")
            chat.expect('[tool] word_count({"text": "a b c"})')
            chat.expect("three words")
            chat.expect("you> ")
            chat.type("/quit")
            chat.expect("bye")
            assert chat.close() == 0
        finally:
            chat.kill()
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


def _chat_once(base_url: str, *args: str, lines: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "machine.cli", "chat", "--base-url", base_url,
                           "--model", "fake-model", *args], input=lines, capture_output=True,
                          text=True, cwd=ROOT, env=_environment(), timeout=WAIT, check=False)


def test_RT20_chat_keeps_a_session_file_and_resumes_it(tmp_path: Path) -> None:
    session = tmp_path / "talk.jsonl"
    with FakeServer.start_in_thread([openai_text("hello back"),
                                     openai_text("still here")]) as server:
        first = _chat_once(server.openai_base_url, "--session", str(session), lines="hi\n")
        assert first.returncode == 0, first.stderr
        assert f"new session {session}" in first.stdout and "hello back" in first.stdout
        again = _chat_once(server.openai_base_url, "--session", str(session), lines="x\n")
        assert again.returncode == 2 and "pass --resume" in again.stderr
        second = _chat_once(server.openai_base_url, "--session", str(session), "--resume",
                            lines="and now?\n")
        assert second.returncode == 0, second.stderr
        assert "events, 1 turn\n" in second.stdout and "still here" in second.stdout
        assert server.requests[1].json["messages"][-3:] == [
            {"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello back"},
            {"role": "user", "content": "and now?"}]
    events = JsonlStore(tmp_path).load("talk").events
    assert validate_events(events) is None
    assert [e.data["turn"] for e in events if e.type == "turn/start"] == [1, 2]
    assert [e.data["reason"] for e in events if e.type == "request/header"] == ["initial",
                                                                                "resume"]


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
