"""``turnstile log validate`` of JSONL store files, and its --json and --junit reports (specs/log.md).

Store files are written by the real `JsonlStore` (S8), then cut or damaged byte-wise.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from machine.cli.main import main
from machine.events import Event
from machine.store.jsonl import JsonlStore

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = main(["log", "validate", *argv])
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def stored(tmp_path: Path, *, close: bool = True) -> Path:
    """A store session file: two complete turns, or one and an open one with close=False."""
    store = JsonlStore(tmp_path / "store", fsync=False)
    store.create("s1")
    events = [("turn/start", {"turn": 1, "trigger": {"kind": "retry"}}),
              ("turn/end", {"turn": 1, "reason": {"kind": "completed"}}),
              ("turn/start", {"turn": 2, "trigger": {"kind": "retry"}})]
    if close:
        events.append(("turn/end", {"turn": 2, "reason": {"kind": "completed"}}))
    for seq, (type_, data) in enumerate(events):
        store.append("s1", Event.from_json({"type": type_, "seq": seq, "time": seq, "data": data}))
    store.close()
    return tmp_path / "store" / "s1.jsonl"


def test_a_store_session_file_is_recognised_and_checked(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = stored(tmp_path)
    assert path.read_bytes().startswith(b'{"crc":')
    status, out, err = run(capsys, str(path))
    assert (status, err) == (0, "")
    assert out == [f"{path}: OK (store session 's1', 4 events, 2 turns)"]


def test_an_open_turn_and_a_torn_record_are_what_a_load_repairs(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = stored(tmp_path, close=False)
    torn = b'{"crc":123,"event":{"da'                  # an append cut short (S9)
    with path.open("ab") as file:
        file.write(torn)
    status, out, _ = run(capsys, str(path))
    assert status == 0
    assert out == [f"{path}: OK (store session 's1', 3 events, 2 turns, turn 2 still open (a "
                   f"load closes it), a torn final record of {len(torn)} bytes (a load cuts it))"]


def test_damage_in_a_store_file_is_invalid_with_its_position(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = stored(tmp_path)
    lines = path.read_bytes().split(b"\n")
    offset = len(lines[0]) + len(lines[1]) + 2                   # record 1 starts here
    lines[2] = lines[2].replace(b'"completed"', b'"complete!"')  # the checksum no longer holds
    path.write_bytes(b"\n".join(lines))
    status, out, _ = run(capsys, str(path))
    assert status == 1
    assert out[0].startswith(f"{path}: INVALID store session 's1': checksum-mismatch at record 1 "
                             f"at byte {offset}: stored crc ")
    status, out, _ = run(capsys, "--json", str(path))
    report = json.loads(out[0])
    assert (report["verdict"], report["layout"], report["session"], report["events"]) == \
        ("invalid", "store", "s1", 1)                         # the intact prefix
    assert report["problem"]["damage"][0]["kind"] == "checksum-mismatch"
    assert report["problem"]["damage"][0]["byteOffset"] == offset


def test_a_store_file_whose_events_break_an_invariant_is_invalid(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # a valid record (its checksum holds) whose event breaks L4: turn/end of a turn never started
    from machine.store.codec import header_uid
    from machine.store.jsonl import encode_record
    path = stored(tmp_path)
    uid = header_uid(path.read_bytes().split(b"\n", 1)[0])   # the session's identity (S30)
    assert uid is not None
    with path.open("ab") as file:
        file.write(encode_record(Event.from_json({"type": "turn/end", "seq": 4, "time": 4,
                                                  "data": {"turn": 3, "reason": {"kind": "completed"}}}),
                                 uid))
    status, out, _ = run(capsys, str(path))
    assert status == 1 and "invariant-violation at record 4" in out[0] and "[L4]" in out[0]


def test_json_reports_one_object_per_file(capsys: pytest.CaptureFixture[str],
                                          tmp_path: Path) -> None:
    good = str(EXAMPLES / "multi-turn-with-injection.jsonl")
    bad = str(EXAMPLES / "enclosure-violation.jsonl")
    torn = str(EXAMPLES / "torn-line.jsonl")
    missing = str(tmp_path / "nope.jsonl")
    status, out, err = run(capsys, "--json", good, bad, torn, missing)
    assert status == 2 and err == ""
    reports = [json.loads(line) for line in out]
    assert reports[0] == {"file": good, "verdict": "ok", "layout": "log", "events": 37,
                          "turns": 2, "openTurn": None,
                          "message": f"{good}: OK (37 events, 2 turns)"}
    assert reports[1]["verdict"] == "invalid"
    assert reports[1]["problem"] == {"line": 19, "seq": 18, "rule": "L6",
                                     "detail": "assistant/chunk is outside any open turn"}
    assert reports[2]["problem"]["line"] == 6 and reports[2]["verdict"] == "invalid"
    assert reports[3] == {"file": missing, "verdict": "unreadable",
                          "message": f"{missing}: no such file"}


def test_junit_reports_one_case_per_file(capsys: pytest.CaptureFixture[str],
                                         tmp_path: Path) -> None:
    report = tmp_path / "log.xml"
    good = str(stored(tmp_path))
    bad = str(EXAMPLES / "enclosure-violation.jsonl")
    status, out, _ = run(capsys, "--junit", str(report), good, bad, str(tmp_path / "nope"))
    assert status == 2 and len(out) == 2
    suite = ET.parse(report).getroot().find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors")) == ("3", "1", "1")
    cases = list(suite.iter("testcase"))
    assert [c.get("classname") for c in cases] == ["log.store", "log.log", "log.file"]
    failure = cases[1].find("failure")
    assert failure is not None and "[L6]" in failure.get("message", "")
    status, _, err = run(capsys, "--junit", str(tmp_path / "no" / "dir.xml"), good)
    assert status == 2 and "cannot write the JUnit report" in err
