"""``turnstile log validate FILE...``: session logs checked against the session invariants.

A FILE is one of two layouts (specs/log.md, "The log validate command"):

* a **session log**: one session event per line in its E1 JSON form
  (``{type, seq, time, data, surfaceOp?, sourceEventSeqs?}``), as ``turnstile log
  show --json`` writes and the examples in ``specs/examples/`` are;
* a **session file of the JSONL store** (S8): a header record
  ``{"crc":…,"kind":"header",…}``, then one ``{"crc":…,"event":{…}}`` record per
  event, as `machine.store.JsonlStore` writes. It is recognised by its first line;
  checksums, seq order and the invariants are checked (S10, S11). A torn final record
  (S9) and a turn left open are not damage (a load repairs both): the verdict says so.

`validate_file` gives one `LogVerdict` per file: its line on standard output, or, for
a file that cannot be read at all (missing, a directory), a message for standard
error. Exit status: 0 every file valid, 1 some file invalid or malformed, 2 a usage
error or an unreadable file; the worst wins.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final, Literal

from machine.cli.junit import CaseStatus, JunitCase
from machine.cli.terminal import ProgressBar, read_bytes, shown
from machine.errors import ValidationError
from machine.events import TURN_END, TURN_START, Event
from machine.log import validate_events
from machine.store.errors import UnsupportedFormatError
from machine.store.jsonl import parse_jsonl
from machine.store.repair import analyse

__all__ = ["EXIT_INVALID", "EXIT_OK", "EXIT_USAGE", "LogVerdict", "junit_case", "validate_file"]

EXIT_OK: Final = 0
EXIT_INVALID: Final = 1
EXIT_USAGE: Final = 2
_STORE_HEADER: Final = b'{"crc":'

Verdict = Literal["ok", "invalid", "unreadable"]


@dataclass(frozen=True, slots=True)
class LogVerdict:
    """The outcome of validating one file."""

    path: str
    verdict: Verdict
    text: str                          # the verdict line (or the message, when unreadable)
    layout: Literal["log", "store"] | None = None
    events: int = 0
    turns: int = 0
    open_turn: int | None = None       # the turn a load would close
    torn_bytes: int = 0                # a torn final record a load would cut (store files)
    session: str | None = None         # the store session's id
    problem: dict[str, Any] | None = None  # where and what: line/seq/rule/detail
    seconds: float = 0.0

    @property
    def status(self) -> int:
        return {"ok": EXIT_OK, "invalid": EXIT_INVALID, "unreadable": EXIT_USAGE}[self.verdict]

    def to_json(self) -> dict[str, Any]:
        """The verdict as JSON (``turnstile log validate --json``)."""
        out: dict[str, Any] = {"file": self.path, "verdict": self.verdict}
        if self.layout is not None:
            out["layout"] = self.layout
        if self.session is not None:
            out["session"] = self.session
        if self.verdict != "unreadable":
            out["events"] = self.events
            out["turns"] = self.turns
            out["openTurn"] = self.open_turn
        if self.torn_bytes:
            out["tornBytes"] = self.torn_bytes
        if self.problem is not None:
            out["problem"] = self.problem
        out["message"] = self.text
        return out


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def validate_file(path: str, progress: ProgressBar | None = None) -> LogVerdict:
    """Validate one file (either layout), stopping at its first problem; ``-`` validates
    standard input (named ``<stdin>`` in the verdict). *progress* is told the lines of a
    session log checked so far (`machine.cli.terminal.progress_bar`)."""
    started = time.perf_counter()
    name = shown(path)
    try:
        data = read_bytes(path)
    except FileNotFoundError:
        return LogVerdict(name, "unreadable", f"{name}: no such file")
    except IsADirectoryError:
        return LogVerdict(name, "unreadable", f"{name}: is a directory, not a JSONL log")
    except OSError as error:
        return LogVerdict(name, "unreadable", f"{name}: cannot read: {error.strerror or error}")
    verdict = _store_file(name, data) if data.startswith(_STORE_HEADER) \
        else _log_file(name, data, progress)
    return _timed(verdict, time.perf_counter() - started)


def _timed(verdict: LogVerdict, seconds: float) -> LogVerdict:
    return LogVerdict(verdict.path, verdict.verdict, verdict.text, verdict.layout,
                      verdict.events, verdict.turns, verdict.open_turn, verdict.torn_bytes,
                      verdict.session, verdict.problem, seconds)


def _open_turn(events: list[Event]) -> tuple[int, int | None]:
    """How many turns the events start, and the one still open at the end (or None)."""
    starts = [e for e in events if e.type in (TURN_START, TURN_END)]
    count = sum(e.type == TURN_START for e in starts)
    return count, count if starts and starts[-1].type == TURN_START else None


# --------------------------------------------------------------------------
# Session logs: one event per line
# --------------------------------------------------------------------------


def _log_file(path: str, data: bytes, progress: ProgressBar | None = None) -> LogVerdict:
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        return LogVerdict(path, "invalid", f"{path}: not UTF-8 text ({error.reason} at byte "
                          f"{error.start})", "log", problem={"byte": error.start,
                                                              "detail": "not UTF-8 text"})
    lines = text.split("\n")
    terminated = lines[-1] == ""
    if terminated:
        lines.pop()  # the newline that ends the last record
    malformed: list[tuple[int, str]] = []
    events: list[Event] = []

    def decoded() -> Iterator[Event]:
        for number, line in enumerate(lines, start=1):
            if progress is not None and not number & 0xFFF:
                progress.update(number, total=len(lines))
            event_or_problem = _decode_line(line)
            if isinstance(event_or_problem, str):
                torn = " (the final line has no newline: a torn write?)" \
                    if number == len(lines) and not terminated else ""
                malformed.append((number, f"{event_or_problem}{torn}"))
                return
            events.append(event_or_problem)
            yield event_or_problem

    # validate_events stops at the first violation, so a malformed line after
    # it is never decoded: the first problem in file order is reported.
    violation = validate_events(decoded())
    turns, open_turn = _open_turn(events)
    if violation is not None:
        return LogVerdict(path, "invalid", f"{path}: INVALID at {violation} (line "
                          f"{violation.seq + 1})", "log", len(events), turns, open_turn,
                          problem={"line": violation.seq + 1, "seq": violation.seq,
                                   "rule": violation.rule, "detail": violation.message})
    if malformed:
        number, problem = malformed[0]
        return LogVerdict(path, "invalid", f"{path}:{number}: {problem}", "log", len(events),
                          turns, open_turn, problem={"line": number, "detail": problem})
    summary = f"{_plural(len(lines), 'event')}, {_plural(turns, 'turn')}"
    if open_turn is not None:
        summary += f", turn {open_turn} still open"
    return LogVerdict(path, "ok", f"{path}: OK ({summary})", "log", len(events), turns,
                      open_turn)


def _decode_line(line: str) -> Event | str:
    """The event on one line, or a description of why it is not one."""
    if not line.strip():
        return "empty line (expected one JSON event per line)"
    try:
        value = json.loads(line)
    except json.JSONDecodeError as error:
        return f"invalid JSON: {error.msg} (column {error.colno})"
    except RecursionError:
        return "invalid JSON: nested too deeply"
    try:
        return Event.from_json(value)
    except ValidationError as error:
        return f"not a session event: {error}"


# --------------------------------------------------------------------------
# Session files of the JSONL store
# --------------------------------------------------------------------------


def _store_file(path: str, data: bytes) -> LogVerdict:
    first = data.split(b"\n", 1)[0]
    try:
        header = json.loads(first)
    except (ValueError, RecursionError):
        header = None
    if not isinstance(header, dict) or header.get("kind") != "header":
        # it starts like a store record but is no header: judge it as a session log
        return _log_file(path, data)
    session = header.get("session")
    session_id = session if isinstance(session, str) else ""
    where = f"store session {session_id!r}"
    try:
        stored = parse_jsonl(data, session_id)
    except UnsupportedFormatError as error:
        return LogVerdict(path, "invalid", f"{path}: INVALID: {error}", "store",
                          session=session_id, problem={"detail": str(error)})
    log, damage = analyse(stored.records, stored.header_damage)
    events = list(log.events)
    turns, open_turn = _open_turn(events)
    if damage:
        first_damage = damage[0]
        more = f" (and {_plural(len(damage) - 1, 'more problem')})" if len(damage) > 1 else ""
        return LogVerdict(path, "invalid", f"{path}: INVALID {where}: {first_damage}{more}",
                          "store", len(events), turns, open_turn, stored.torn_bytes, session_id,
                          problem={"damage": [d.to_json() for d in damage]})
    summary = f"{where}, {_plural(len(events), 'event')}, {_plural(turns, 'turn')}"
    if open_turn is not None:
        summary += f", turn {open_turn} still open (a load closes it)"
    if stored.torn_bytes:
        summary += (f", a torn final record of {_plural(stored.torn_bytes, 'byte')} (a load "
                    "cuts it)")
    return LogVerdict(path, "ok", f"{path}: OK ({summary})", "store", len(events), turns,
                      open_turn, stored.torn_bytes, session_id)


_JUNIT: Final[dict[Verdict, CaseStatus]] = {"ok": "passed", "invalid": "failed",
                                             "unreadable": "error"}


def junit_case(verdict: LogVerdict) -> JunitCase:
    """One file's verdict as a JUnit test case."""
    return JunitCase(verdict.path, f"log.{verdict.layout or 'file'}", _JUNIT[verdict.verdict],
                     verdict.seconds, "" if verdict.verdict == "ok" else verdict.text,
                     verdict.text, verdict.path)
