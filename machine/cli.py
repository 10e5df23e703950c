"""The ``turnstile`` command line.

Subcommands are listed in `COMMANDS`; each one configures its own argparse
sub-parser and runs from the parsed arguments. To add one, write a
``configure`` and a ``run`` function and add a `Command` to `COMMANDS`.

``turnstile log validate FILE...`` replays JSONL session logs through the
session invariants (``specs/log.md``). Exit status: 0 when every file is a
valid log, 1 when some file is invalid or malformed, 2 for usage errors and
unreadable files (the worst status wins).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from machine.errors import ValidationError
from machine.events import TURN_END, TURN_START, Event
from machine.log import validate_events

__all__ = ["COMMANDS", "Command", "build_parser", "main"]

EXIT_OK: Final = 0
EXIT_INVALID: Final = 1
EXIT_USAGE: Final = 2


@dataclass(frozen=True, slots=True)
class Command:
    """One top-level subcommand: how to configure its parser and how to run it."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --------------------------------------------------------------------------
# turnstile log ...
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FileVerdict:
    """The outcome of validating one file: the line to print and the exit status."""

    line: str
    status: int


def _read_log(path: str) -> _FileVerdict:
    """Decode and replay one JSONL log, stopping at the first problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return _FileVerdict(f"{path}: no such file", EXIT_USAGE)
    except IsADirectoryError:
        return _FileVerdict(f"{path}: is a directory, not a JSONL log", EXIT_USAGE)
    except UnicodeDecodeError as error:
        return _FileVerdict(f"{path}: not UTF-8 text ({error.reason} at byte {error.start})",
                            EXIT_INVALID)
    except OSError as error:
        return _FileVerdict(f"{path}: cannot read: {error.strerror or error}", EXIT_USAGE)
    lines = text.split("\n")
    terminated = lines[-1] == ""
    if terminated:
        lines.pop()  # the newline that ends the last record
    malformed: list[str] = []
    turns: list[str] = []  # the turn/start and turn/end types, for the summary

    def decoded() -> Iterator[Event]:
        for number, line in enumerate(lines, start=1):
            event_or_problem = _decode_line(line)
            if isinstance(event_or_problem, str):
                torn = " (the final line has no newline: a torn write?)" \
                    if number == len(lines) and not terminated else ""
                malformed.append(f"{path}:{number}: {event_or_problem}{torn}")
                return
            if event_or_problem.type in (TURN_START, TURN_END):
                turns.append(event_or_problem.type)
            yield event_or_problem

    # validate_events stops at the first violation, so a malformed line after
    # it is never decoded: the first problem in file order is reported.
    violation = validate_events(decoded())
    if violation is not None:
        return _FileVerdict(f"{path}: INVALID at {violation} (line {violation.seq + 1})",
                            EXIT_INVALID)
    if malformed:
        return _FileVerdict(malformed[0], EXIT_INVALID)
    count = turns.count(TURN_START)
    summary = (f"{len(lines)} event{'' if len(lines) == 1 else 's'}, "
               f"{count} turn{'' if count == 1 else 's'}")
    if turns and turns[-1] == TURN_START:
        summary += f", turn {count} still open"
    return _FileVerdict(f"{path}: OK ({summary})", EXIT_OK)


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


def _log_validate(args: argparse.Namespace, out: TextIO) -> int:
    status = EXIT_OK
    for path in args.files:
        verdict = _read_log(path)
        print(verdict.line, file=out)
        status = max(status, verdict.status)
    return status


_LOG_SUBCOMMANDS: Final[dict[str, Callable[[argparse.Namespace, TextIO], int]]] = {
    "validate": _log_validate,
}


def _configure_log(parser: argparse.ArgumentParser) -> None:
    subcommands = parser.add_subparsers(dest="log_command", metavar="SUBCOMMAND", required=True)
    validate = subcommands.add_parser(
        "validate", help="check JSONL session logs against the session invariants",
        description="Replay each FILE (one session event as JSON per line) through the "
                    "session-log rules L1-L14 and print one verdict line per file.")
    validate.add_argument("files", nargs="+", metavar="FILE", help="a JSONL session log")


def _run_log(args: argparse.Namespace) -> int:
    return _LOG_SUBCOMMANDS[args.log_command](args, sys.stdout)


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

COMMANDS: Final[dict[str, Command]] = {
    "log": Command(help="session log tools", configure=_configure_log, run=_run_log),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnstile", description="The turnstile agent-loop core: tools and checks.")
    subcommands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        command.configure(subcommands.add_parser(name, help=command.help,
                                                 description=command.help))
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit status (2 for usage errors)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits on usage errors and --help
        return exit_.code if isinstance(exit_.code, int) else EXIT_USAGE
    return COMMANDS[args.command].run(args)


if __name__ == "__main__":
    sys.exit(main())
