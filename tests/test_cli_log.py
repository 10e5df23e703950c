"""``turnstile log validate`` (specs/log.md, "The log validate command")."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import pytest

from machine.cli import main as cli
from machine.cli.main import Command, build_parser, main

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def event(type_: str, seq: int, data: dict[str, Any], **extra: Any) -> str:
    return json.dumps({"type": type_, "seq": seq, "time": 1764489600000 + seq, "data": data,
                       **extra})


TS1 = event("turn/start", 0, {"turn": 1, "trigger": {"kind": "retry"}})
TE1 = event("turn/end", 1, {"turn": 1, "reason": {"kind": "completed"}})


def write(tmp_path: Path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def test_example_valid_log(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "multi-turn-with-injection.jsonl")
    status, out, err = run(capsys, "log", "validate", path)
    assert status == 0 and err == ""
    assert out == [f"{path}: OK (37 events, 2 turns)"]


def test_example_enclosure_violation(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "enclosure-violation.jsonl")
    status, out, _ = run(capsys, "log", "validate", path)
    assert status == 1
    assert out == [f"{path}: INVALID at seq 18 [L6] assistant/chunk is outside any open turn "
                   "(line 19)"]


def test_example_torn_line(capsys: pytest.CaptureFixture[str]) -> None:
    path = str(EXAMPLES / "torn-line.jsonl")
    status, out, err = run(capsys, "log", "validate", path)
    assert status == 1 and err == ""
    assert out[0].startswith(f"{path}:6: invalid JSON: ")
    assert "torn write" in out[0]


def test_invariant_violation_names_seq_rule_and_problem(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "bad.jsonl", "\n".join([
        TS1, TE1, event("step/start", 2, {"turn": 1, "step": 1})]) + "\n")
    status, out, _ = run(capsys, "log", "validate", path)
    assert status == 1
    assert out == [f"{path}: INVALID at seq 2 [L5] step/start requires an open turn (line 3)"]


def test_seq_mismatch_is_L1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "gap.jsonl", TS1 + "\n" + TE1.replace('"seq": 1', '"seq": 5') + "\n")
    status, out, _ = run(capsys, "log", "validate", path)
    assert status == 1 and "INVALID at seq 1 [L1] turn/end: expected seq 1, got 5" in out[0]


@pytest.mark.parametrize(("line", "problem"), [
    ("{not json", "invalid JSON: "),
    ("[1, 2]", "not a session event: event: must be an object"),
    ('{"type": "turn/end", "seq": 1, "time": 0}', "not a session event: event.data: is missing"),
    ('{"type": "x", "seq": -1, "time": 0, "data": {}}', "not a session event: event.seq"),
    ("", "empty line"),
])
def test_malformed_line_is_reported_with_its_line_number(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], line: str, problem: str) -> None:
    path = write(tmp_path, "malformed.jsonl", "\n".join([TS1, line, TE1]) + "\n")
    status, out, err = run(capsys, "log", "validate", path)
    assert status == 1 and err == ""
    assert len(out) == 1 and out[0].startswith(f"{path}:2: {problem}")
    assert "Traceback" not in out[0]


def test_the_first_problem_in_file_order_wins(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write(tmp_path, "both.jsonl", "\n".join([TS1, TS1.replace('"seq": 0', '"seq": 1'),
                                                    "{oops"]) + "\n")
    status, out, _ = run(capsys, "log", "validate", path)
    assert status == 1 and "INVALID at seq 1 [L4] turn/start: turn 1 is still open" in out[0]


def test_open_turn_and_empty_file_are_valid(tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    open_turn = write(tmp_path, "open.jsonl", TS1 + "\n")
    empty = write(tmp_path, "empty.jsonl", "")
    unterminated = write(tmp_path, "unterminated.jsonl", TS1 + "\n" + TE1)
    status, out, _ = run(capsys, "log", "validate", open_turn, empty, unterminated)
    assert status == 0
    assert out == [f"{open_turn}: OK (1 event, 1 turn, turn 1 still open)",
                   f"{empty}: OK (0 events, 0 turns)",
                   f"{unterminated}: OK (2 events, 1 turn)"]


def test_missing_file_is_a_clear_message_and_exit_2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = str(tmp_path / "nope.jsonl")
    status, out, err = run(capsys, "log", "validate", missing)
    assert (status, out) == (2, [])
    assert err == f"{missing}: no such file\n"           # not a verdict: on standard error
    status, out, err = run(capsys, "log", "validate", str(tmp_path))
    assert (status, out) == (2, [])
    assert err == f"{tmp_path}: is a directory, not a JSONL log\n"


def test_every_file_gets_a_verdict_and_the_worst_status_wins(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path, "good.jsonl", TS1 + "\n" + TE1 + "\n")
    bad = write(tmp_path, "bad.jsonl", TE1.replace('"seq": 1', '"seq": 0') + "\n")
    status, out, _ = run(capsys, "log", "validate", good, bad)
    assert status == 1
    assert out[0] == f"{good}: OK (2 events, 1 turn)"
    assert out[1].startswith(f"{bad}: INVALID at seq 0 [L4]")
    status, out, err = run(capsys, "log", "validate", bad, str(tmp_path / "nope"), good)
    assert status == 2 and len(out) == 2 and err == f"{tmp_path / 'nope'}: no such file\n"


def test_non_utf8_file_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "binary.jsonl"
    path.write_bytes(b"\xff\xfe\x00")
    status, out, _ = run(capsys, "log", "validate", str(path))
    assert status == 1 and out[0].startswith(f"{path}: not UTF-8 text")


@pytest.mark.parametrize("argv", [[], ["log"], ["log", "validate"], ["bogus"],
                                  ["log", "frobnicate", "x"]])
def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    status = main(argv)
    assert status == 2
    assert "usage:" in capsys.readouterr().err


def test_help_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "validate", "--help"]) == 0
    assert "FILE" in capsys.readouterr().out


def test_commands_are_dispatched_from_the_table(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def configure(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("name")

    def run_hello(args: argparse.Namespace) -> int:
        seen.append(args.name)
        return 0

    monkeypatch.setitem(cli.COMMANDS, "hello", Command("say hello", configure, run_hello))
    assert "hello" in build_parser().format_help()
    assert main(["hello", "world"]) == 0 and seen == ["world"]
