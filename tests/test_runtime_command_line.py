"""The command line's streams (specs/runtime.md RT27): closed pipes end a command quietly,
``-`` reads standard input wherever a command takes files, progress is shown only on a
terminal. The pipe tests run the real ``turnstile`` in a subprocess."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from machine.cli import terminal
from machine.cli.main import main
from machine.cli.terminal import EXIT_SIGPIPE, progress_bar
from machine.conformance.vectors import dump_vector
from machine.store import JsonlStore
from machine.store.testing import sample_session, store_events

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "specs" / "examples"
VALID_LOG = EXAMPLES / "multi-turn-with-injection.jsonl"
CORPUS = ROOT / "specs" / "conformance" / "vectors"
#: Generous: a subprocess start imports the package (the machine may be busy).
WAIT = 300


def turnstile(*argv: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "machine", *argv], input=stdin,
                          capture_output=True, timeout=WAIT, check=False, cwd=ROOT)


def closed_reader(*argv: str) -> tuple[int, bytes]:
    """Run a command whose standard output is a pipe nobody reads: its reading end is closed
    before the command writes anything (`| head -0`). Returns the status and standard error."""
    read, write = os.pipe()
    os.close(read)
    try:
        process = subprocess.Popen([sys.executable, "-m", "machine", *argv], stdout=write,
                                   stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, cwd=ROOT)
    finally:
        os.close(write)
    _, err = process.communicate(timeout=WAIT)
    return process.returncode, err


@pytest.mark.parametrize("argv", [
    ["check", "--json"],
    ["check"],
    ["log", "show", "--json", "SESSION"],
    ["log", "validate", "--json", str(VALID_LOG)],
    ["diagrams"],
    ["explore", "--depth", "2"],
    ["run", str(EXAMPLES / "tool-call.json")],
], ids=lambda argv: " ".join(argv[:2]))
def test_RT27_a_closed_pipe_ends_a_command_quietly(tmp_path: Path, argv: list[str]) -> None:
    if "SESSION" in argv:
        with JsonlStore(tmp_path) as store:
            store_events(store, "s", sample_session())
        argv = [str(tmp_path / "s.jsonl") if a == "SESSION" else a for a in argv]
    status, err = closed_reader(*argv)
    assert err == b"", err.decode(errors="replace")
    assert status in (0, EXIT_SIGPIPE)


def test_RT27_a_pipe_closed_midway_is_quiet_too() -> None:
    """`turnstile check --json | head -1`: the reader goes away after one line."""
    process = subprocess.Popen([sys.executable, "-m", "machine", "check", "--json"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               stdin=subprocess.DEVNULL, cwd=ROOT)
    assert process.stdout is not None and process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()
    err = process.stderr.read()
    status = process.wait(timeout=WAIT)
    assert json.loads(first)["status"] == "passed"
    assert err == b"" and status in (0, EXIT_SIGPIPE)


def test_RT27_log_show_json_piped_into_log_validate_dash(tmp_path: Path) -> None:
    """The issue's pipeline: `turnstile log show --json FILE | turnstile log validate -`."""
    with JsonlStore(tmp_path) as store:
        store_events(store, "s", sample_session())
    shown = turnstile("log", "show", "--json", str(tmp_path / "s.jsonl"))
    assert shown.returncode == 0 and shown.stderr == b""
    checked = turnstile("log", "validate", "-", stdin=shown.stdout)
    assert checked.stderr == b""
    assert checked.returncode == 0
    assert checked.stdout.decode().startswith("<stdin>: OK (")


def test_RT27_dash_reads_standard_input_for_every_command_that_takes_files(
        tmp_path: Path) -> None:
    log = VALID_LOG.read_bytes()
    out = turnstile("log", "validate", "--json", "-", stdin=log)
    assert out.returncode == 0 and json.loads(out.stdout)["file"] == "<stdin>"

    vector = (CORPUS / "A5-idle-steer-is-a-prompt.json").read_bytes()
    out = turnstile("check", "-", stdin=vector)
    assert (out.returncode, out.stdout) == (0, b"1 passed, 0 failed\n"), out.stderr

    recorded = turnstile("record", "-", stdin=vector)
    assert recorded.returncode == 0, recorded.stderr
    assert json.loads(recorded.stdout)["id"] == "A5-idle-steer-is-a-prompt"
    trace = turnstile("record", "--trace", "-", stdin=vector)
    verified = turnstile("verify-trace", "-", stdin=trace.stdout)
    assert verified.returncode == 0 and verified.stdout.startswith(b"<stdin>: OK ("), \
        verified.stderr

    script = turnstile("run", "-", stdin=(EXAMPLES / "tool-call.json")
                       .read_bytes())
    assert script.returncode == 0 and script.stdout.count(b"\n") > 10

    known = turnstile("check", "--known-failures", "-", str(CORPUS / "A5-idle-steer-is-a-prompt.json"),
                      stdin=b"# nothing is expected to fail\n")
    assert known.returncode == 0, known.stderr

    with JsonlStore(tmp_path) as store:
        store_events(store, "s", sample_session())
    stored = (tmp_path / "s.jsonl").read_bytes()
    show = turnstile("log", "show", "-", stdin=stored)
    assert show.returncode == 0, show.stdout
    assert show.stdout.decode().startswith("<stdin>: session s")


def test_RT27_dash_errors_name_standard_input(tmp_path: Path) -> None:
    twice = turnstile("log", "validate", "-", "-", stdin=b"")
    assert twice.returncode == 2 and b"can be given only once" in twice.stderr
    bad = turnstile("check", "-", stdin=b"{not json")
    assert bad.returncode == 3 and b"<stdin>:1: invalid JSON" in bad.stderr
    latin = turnstile("log", "validate", "-", stdin=b'{"type":"\xe9"}\n')
    assert latin.returncode == 1 and latin.stdout.startswith(b"<stdin>: not UTF-8 text")
    repair = turnstile("log", "repair", "-", stdin=b"")
    assert repair.returncode == 2 and b"writes the session back" in repair.stdout
    not_store = turnstile("log", "show", "-", stdin=VALID_LOG.read_bytes())
    assert not_store.returncode == 2 and b"log validate -" in not_store.stdout
    draft = turnstile("record", "-", stdin=b"[]")
    assert draft.returncode == 3 and draft.stderr.startswith(b"turnstile record: malformed")


def test_RT27_no_progress_and_no_carriage_return_when_not_a_terminal(tmp_path: Path) -> None:
    """Long commands on pipes: standard error carries no progress line at all."""
    long_log = tmp_path / "long.jsonl"
    long_log.write_bytes(VALID_LOG.read_bytes())
    for argv in (["explore", "--depth", "3"], ["check"], ["log", "validate", str(long_log)]):
        result = turnstile(*argv)
        assert result.returncode == 0, result.stderr
        assert b"\r" not in result.stderr + result.stdout, argv


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_RT27_progress_bar_draws_only_on_a_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    pipe = io.StringIO()
    with progress_bar("work", 10, stream=pipe) as bar:
        for _ in range(10):
            bar.advance(text="step")
    assert pipe.getvalue() == ""

    screen = _Terminal()
    with progress_bar("work", 10, stream=screen) as bar:
        for _ in range(10):
            bar.advance(text="a step")
    assert "work" in screen.getvalue()           # rich (the dev extra) drew a bar

    monkeypatch.setitem(sys.modules, "rich.progress", None)     # rich not installed
    monkeypatch.setattr(terminal, "REFRESH", 0.0)
    plain = _Terminal()
    with progress_bar("work", 4, stream=plain) as bar:
        bar.update(2, text="half")
    assert plain.getvalue().startswith("\rwork  50% half")
    assert plain.getvalue().endswith("\r" + " " * terminal.WIDTH + "\r")


def test_RT27_check_progress_counts_every_vector(monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    seen: list[tuple[float, str | None]] = []

    class Recorder:
        def __init__(self, description: str, total: float | None = None, **_: object) -> None:
            self.total, self.done = total, 0.0

        def advance(self, amount: float = 1, *, text: str | None = None) -> None:
            self.done += amount
            seen.append((self.done, text))

        def close(self) -> None:
            seen.append((-1, None))

        def __enter__(self) -> Recorder:
            return self

        def __exit__(self, *_: object) -> None:
            self.close()

    from machine.conformance import cli as conformance_cli
    monkeypatch.setattr(conformance_cli, "progress_bar", Recorder)
    assert main(["check", "--run", "A*"]) == 0
    assert seen[-1] == (-1, None)
    count = len(list(CORPUS.glob("A*.json")))
    assert [done for done, _ in seen[:-1]] == list(range(1, count + 1))
    assert capsys.readouterr().out.startswith(f"{count} passed, 0 failed, ")


def test_RT27_a_vector_read_from_stdin_keeps_its_own_id(monkeypatch: pytest.MonkeyPatch,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    data = json.loads((CORPUS / "A5-idle-steer-is-a-prompt.json").read_text(encoding="utf-8"))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(dump_vector(data).encode())))
    assert main(["check", "-v", "-"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "PASS A5-idle-steer-is-a-prompt"
