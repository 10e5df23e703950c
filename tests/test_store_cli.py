"""``turnstile log show|repair|fork`` (specs/persistence.md S22)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from machine.cli.main import main
from machine.events import Event
from machine.store import JsonlStore, SessionInfo, SqliteStore
from machine.store.testing import sample_session, store_events

EVENTS = sample_session()  # turn 3 open: a load appends 4 closers


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str]]:
    status = main(list(argv))
    return status, capsys.readouterr().out.splitlines()


@pytest.fixture
def jsonl(tmp_path: Path) -> Path:
    with JsonlStore(tmp_path) as store:
        store.create("s", cwd="/repo")
        store_events(store, "s", EVENTS, create=False)
    return tmp_path / "s.jsonl"


@pytest.fixture
def sqlite(tmp_path: Path) -> Path:
    path = tmp_path / "sessions.db"
    with SqliteStore(path) as store:
        store_events(store, "s", EVENTS)
    return path


def test_show_prints_header_events_and_the_repair_a_load_would_make(
        jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    before = jsonl.read_bytes()
    status, out = run(capsys, "log", "show", str(jsonl))
    assert status == 0
    assert out[0] == f"{jsonl}: session s, cwd /repo"
    assert out[1] == "    0 user/message       [plugin] 'ctx'"
    assert out[2] == "    1 turn/start         turn 1 (message)"
    assert len(out) == 1 + len(EVENTS) + 2
    assert out[-2] == f"{len(EVENTS)} intact events of {len(EVENTS)} stored, 3 turns"
    assert out[-1].startswith("a load would append 4 closers: tool/result c2 TOOL_OUTCOME_UNKNOWN, "
                              "tool/result c3 TOOL_NOT_STARTED, step/end step 3.1, "
                              "turn/end turn 3 interrupted")
    assert jsonl.read_bytes() == before  # read-only


def test_show_json_prints_a_plain_event_log_that_validate_accepts(
        jsonl: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "log", "show", "--json", str(jsonl))
    assert status == 0
    assert [Event.from_json(json.loads(line)) for line in out] == EVENTS
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(out) + "\n", encoding="utf-8")
    status, out = run(capsys, "log", "validate", str(plain))
    assert status == 0 and out == [f"{plain}: OK ({len(EVENTS)} events, 3 turns, turn 3 still open)"]


def test_show_reports_damage_with_positions(jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = jsonl.read_bytes().splitlines(keepends=True)
    offset = sum(len(line) for line in lines[:6])
    lines[6] = b"garbage\n"  # record 5
    jsonl.write_bytes(b"".join(lines))
    status, out = run(capsys, "log", "show", str(jsonl))
    assert status == 1
    assert f"{jsonl}: DAMAGED (1 problem)" in out
    assert f"  undecodable at record 5 at byte {offset}: not a {{crc, event}} record" in out
    assert out[-1].startswith("a strict load fails; `turnstile log repair --salvage` keeps")


def test_show_sqlite_and_directory_targets(jsonl: Path, sqlite: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "log", "show", str(sqlite), "--session", "s")
    assert status == 0 and out[0] == f"{sqlite}#s: session s"
    status, out = run(capsys, "log", "show", str(jsonl.parent), "--session", "s")
    assert status == 0 and out[0].endswith("session s, cwd /repo")


@pytest.mark.parametrize("argv", [
    ["{db}"], ["{dir}"], ["{missing}"], ["{other}"], ["{jsonl}", "--session", "t"],
    ["{dir}", "--session", "nope"], ["{db}", "--session", "nope"],
], ids=["db-no-session", "dir-no-session", "missing", "not-a-store", "mismatch", "unknown",
        "unknown-sqlite"])
def test_usage_errors_exit_2(jsonl: Path, sqlite: Path, tmp_path: Path, argv: list[str],
                             capsys: pytest.CaptureFixture[str]) -> None:
    other = tmp_path / "notes.txt"
    other.write_text("hello", encoding="utf-8")
    names = {"db": sqlite, "dir": tmp_path, "missing": tmp_path / "nope.jsonl", "other": other,
             "jsonl": jsonl}
    status, out = run(capsys, "log", "show", *[a.format(**names) for a in argv])
    assert status == 2 and len(out) == 1


def test_show_refuses_a_sqlite_file_that_is_not_a_store(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    path = tmp_path / "other.db"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE t (x)")
    db.commit()
    db.close()
    status, out = run(capsys, "log", "show", str(path), "--session", "s")
    assert status == 2 and "not a session database" in out[0]
    db = sqlite3.connect(path)
    tables = db.execute("SELECT name FROM sqlite_master").fetchall()
    db.close()
    assert tables == [("t",)]  # nothing was created


def test_repair_closes_the_open_turn_once(jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with jsonl.open("ab") as file:
        file.write(b'{"crc":1,"event":{"da')  # a torn record as well
    status, out = run(capsys, "log", "repair", str(jsonl))
    assert status == 0
    assert out == [f"{jsonl}: REPAIRED: cut off a torn final record (21 bytes); appended 4 "
                   "closers: tool/result c2 TOOL_OUTCOME_UNKNOWN, tool/result c3 TOOL_NOT_STARTED, "
                   "step/end step 3.1, turn/end turn 3 interrupted"]
    status, out = run(capsys, "log", "repair", str(jsonl))
    assert status == 0 and out == [f"{jsonl}: OK (nothing to repair, {len(EVENTS) + 4} events)"]


def test_repair_of_a_damaged_session_fails_unless_salvaging(
        jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    lines = jsonl.read_bytes().splitlines(keepends=True)
    lines[10] = lines[10].replace(b'"inj"', b'"inJ"')
    jsonl.write_bytes(b"".join(lines))
    before = jsonl.read_bytes()
    status, out = run(capsys, "log", "repair", str(jsonl))
    assert status == 1 and out[0] == f"{jsonl}: DAMAGED (1 problem)"
    assert out[1].startswith("  checksum-mismatch at record 9 at byte ")
    assert jsonl.read_bytes() == before
    status, out = run(capsys, "log", "repair", "--salvage", str(jsonl))
    assert status == 0
    assert out[2] == (f"{jsonl}: SALVAGED: kept 9 events; the damaged original is kept at "
                      f"{jsonl}.damaged-1")
    assert Path(f"{jsonl}.damaged-1").read_bytes() == before
    status, out = run(capsys, "log", "repair", str(jsonl))
    assert status == 0 and out[0].startswith(f"{jsonl}: OK")


def test_fork_repairs_the_source_then_forks(jsonl: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "log", "fork", str(jsonl), "--at", "15", "--child", "kid")
    assert status == 0
    assert out == [f"{jsonl}: repaired before forking (4 closers appended)",
                   f"{jsonl}: forked 16 events into session kid ({jsonl.parent / 'kid.jsonl'})"]
    with JsonlStore(jsonl.parent) as store:
        result = store.load("kid")
        assert result.info == SessionInfo("kid", parent="s", seed_length=16, cwd="/repo")
        assert list(result.events) == EVENTS[:16]


def test_fork_refusals_exit_1(jsonl: Path, sqlite: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "log", "fork", str(jsonl), "--at", "19")
    assert status == 1 and out[-1].endswith("[OPEN_TURN]")
    status, out = run(capsys, "log", "fork", str(jsonl), "--child", "s")
    assert status == 1 and out[-1].endswith("[SESSION_EXISTS]")
    status, out = run(capsys, "log", "fork", str(jsonl), "--at", "999")
    assert status == 1 and "boundary" in out[-1]
    status, out = run(capsys, "log", "fork", str(sqlite), "--session", "s", "--child", "k")
    assert status == 0 and out[-1] == f"{sqlite}#s: forked {len(EVENTS) + 4} events into session k (k)"


def test_log_help_lists_the_store_subcommands(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["log", "--help"])
    out = capsys.readouterr().out
    assert status == 0
    for name in ("validate", "show", "repair", "fork"):
        assert name in out


def test_S22_a_postgresql_url_is_a_target(postgres_store: Any, postgres: Any, pg_schema: str,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    with postgres_store() as store:
        store_events(store, "s", EVENTS)
    url = postgres.url
    name = f"{postgres_store(create=False).where}#s"
    status, out = run(capsys, "log", "show", url, "--session", "s", "--schema", pg_schema)
    assert status == 0 and out[0] == f"{name}: session s"
    assert out[-1].startswith("a load would append 4 closers")
    status, out = run(capsys, "log", "repair", url, "--session", "s", "--schema", pg_schema)
    assert status == 0 and out[0].startswith(f"{name}: REPAIRED: appended 4 closers")
    status, out = run(capsys, "log", "fork", url, "--session", "s", "--schema", pg_schema,
                      "--at", "15", "--child", "kid")
    assert status == 0 and out[-1] == f"{name}: forked 16 events into session kid (kid)"
    with postgres_store() as store:
        assert store.info("kid") == SessionInfo("kid", parent="s", seed_length=16)
        store.load("s")  # held: a repair elsewhere is refused, with the holder named
        status, out = run(capsys, "log", "repair", url, "--session", "s", "--schema", pg_schema)
        assert status == 1 and out[-1].endswith("[SESSION_LOCKED]")


@pytest.mark.parametrize("argv", [
    ["postgresql://u:hunter2@/db?host=/nonexistent", "--session", "s"],
    ["postgresql://u:hunter2@/db?host=/nonexistent"],
    ["postgresql://u:hunter2@/db?host=/nonexistent", "--session", "s", "--schema", "Bad"],
    ["{db}", "--session", "s", "--schema", "x"],
], ids=["unreachable", "no-session", "bad-schema", "schema-for-sqlite"])
def test_S22_postgresql_target_errors_exit_2_without_the_password(
        sqlite: Path, argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, out = run(capsys, "log", "show", *[a.format(db=sqlite) for a in argv])
    assert status == 2 and len(out) == 1
    assert "hunter2" not in out[0]


def test_S22_V23_show_json_of_a_stored_lone_surrogate_reports_damage_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 14.5: a lone surrogate stored by an earlier release crashed `log show --json`
    (a traceback, and an empty export that validated as 'OK (0 events)'). A record holding
    one is undecodable damage now: the intact events before it are exported, exit 1."""
    import zlib

    from machine.store.codec import canonical
    events = sample_session(open_tail=False)
    fields = {"version": 1, "kind": "header", "session": "old"}
    lines = [canonical({**fields, "crc": zlib.crc32(canonical(fields))})]
    for event in events[:2]:
        raw = canonical(event.to_json())
        lines.append(b'{"crc":%d,"event":%s}' % (zlib.crc32(raw), raw))
    bad = json.loads(canonical(events[2].to_json()))        # the user/message of turn 1
    bad["data"]["content"] = [{"type": "text", "text": "\ud800"}]
    raw = json.dumps(bad, sort_keys=True, separators=(",", ":")).encode("ascii")
    assert b"\\ud800" in raw
    lines.append(b'{"crc":%d,"event":%s}' % (zlib.crc32(raw), raw))
    path = tmp_path / "old.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    status, out = run(capsys, "log", "show", str(path), "--json")
    assert status == 1 and len(out) == 2
    exported = tmp_path / "exported.jsonl"
    exported.write_text("\n".join(out) + "\n", encoding="utf-8")
    status, verdict = run(capsys, "log", "validate", str(exported))
    assert status == 0 and verdict == [f"{exported}: OK (2 events, 1 turn, turn 1 still open)"]
    status, shown = run(capsys, "log", "show", str(path))
    assert status == 1
    assert any("undecodable at record 2" in line and "lone surrogate" in line for line in shown)
    assert any("format version 1" in line for line in shown)


def test_S22_fork_refuses_a_negative_boundary_as_usage(jsonl: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["log", "fork", str(jsonl), "--at", "-1"]) == 2
    assert "argument --at: '-1': must be 0 or more" in capsys.readouterr().err


def test_S32_show_on_an_unreadable_session_names_the_cause(
        jsonl: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import os

    def denied(self: Path, *_args: object, **_kwargs: object) -> object:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))

    monkeypatch.setattr(Path, "open", denied)
    status, out = run(capsys, "log", "show", str(jsonl))
    assert status == 2 and "Permission denied" in out[-1]
    monkeypatch.undo()
    real_open = Path.open

    opened = [0]

    def denied_for_the_store(self: Path, *args: object, **kwargs: object) -> object:
        # The command reads the target's first bytes (is it SQLite?), then the store reads
        # the session: only the store is denied.
        if self.name == "s.jsonl":
            opened[0] += 1
            if opened[0] > 1:
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return real_open(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", denied_for_the_store)
    status, out = run(capsys, "log", "show", str(jsonl))
    assert status == 1
    assert out[-1].endswith("Permission denied [STORE_READ_FAILED]"), out
