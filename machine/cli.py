"""The ``turnstile`` command line.

Subcommands are listed in `COMMANDS`; each one configures its own argparse
sub-parser and runs from the parsed arguments. To add one, write a
``configure`` and a ``run`` function and add a `Command` to `COMMANDS`.

``turnstile log validate FILE...`` replays JSONL session logs through the
session invariants (``specs/log.md``). Exit status: 0 when every file is a
valid log, 1 when some file is invalid or malformed, 2 for usage errors and
unreadable files (the worst status wins).

``turnstile log show|repair|fork TARGET`` inspect, repair and fork stored
sessions (``machine.store.cli``, ``specs/persistence.md``).

``turnstile diagrams [--write DIR | --check DIR]`` prints, writes or checks
the machines' DOT diagrams and transition tables (``machine.diagrams``):
``--check`` exits 1 naming every stale file.

``turnstile explore --depth N [--commands …] [--model]`` explores every
decision sequence up to depth N (``machine.explore``), checking the runtime
invariants and, with ``--model``, identical outputs from the reference model.

``turnstile run SCRIPT.json [--echo-inputs]`` runs a script of inputs through
the core and prints every output as one JSON line (``machine.runner``,
``specs/scripts.md``); a malformed or refused script exits 2 with a message
on stderr.

``turnstile demo [--color | --no-color]`` runs a narrated session through the
asyncio runtime (``machine.runtime.demo``), prints its log and live events as
tables, validates the log and replays the conformance corpus through the
runtime; exit status 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from machine import argtypes, diagrams, runner
from machine.conformance import cli as conformance_cli
from machine.errors import ValidationError
from machine.events import TURN_END, TURN_START, Event
from machine.log import validate_events
from machine.store import cli as store_cli

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
    **store_cli.LOG_SUBCOMMANDS,  # show, repair, fork: stored sessions (specs/persistence.md)
}


def _configure_log(parser: argparse.ArgumentParser) -> None:
    subcommands = parser.add_subparsers(dest="log_command", metavar="SUBCOMMAND", required=True)
    validate = subcommands.add_parser(
        "validate", help="check JSONL session logs against the session invariants",
        description="Replay each FILE (one session event as JSON per line) through the "
                    "session-log rules L1-L14 and print one verdict line per file.")
    validate.add_argument("files", nargs="+", metavar="FILE", help="a JSONL session log")
    store_cli.configure(subcommands)


def _run_log(args: argparse.Namespace) -> int:
    return _LOG_SUBCOMMANDS[args.log_command](args, sys.stdout)


# --------------------------------------------------------------------------
# turnstile diagrams ...
# --------------------------------------------------------------------------


def _configure_diagrams(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Generate the machines' Graphviz DOT diagrams and Markdown transition "
                          "tables from their declarations. Without options, print the DOT sources.")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--write", metavar="DIR", help="write <machine>.dot and refresh the table "
                      "in <machine>.md under DIR")
    mode.add_argument("--check", metavar="DIR", help="exit 1 naming every file under DIR that is "
                      "out of date with the code")


def _run_diagrams(args: argparse.Namespace) -> int:
    if args.check is not None:
        if not Path(args.check).is_dir():
            print(f"{args.check}: no such directory", file=sys.stderr)
            return EXIT_USAGE
        problems = diagrams.check(args.check)
        for problem in problems:
            print(problem, file=sys.stderr)
        if problems:
            print("run `make diagrams` (or `turnstile diagrams --write DIR`) to regenerate",
                  file=sys.stderr)
            return EXIT_INVALID
        print(f"{args.check}: diagrams up to date")
        return EXIT_OK
    if args.write is not None:
        try:
            changed = diagrams.write(args.write)
        except (OSError, ValueError) as error:
            print(f"{args.write}: {error}", file=sys.stderr)
            return EXIT_USAGE
        for path in changed:
            print(f"wrote {path}")
        return EXIT_OK
    sys.stdout.write("".join(diagrams.dot_sources().values()))
    return EXIT_OK


# --------------------------------------------------------------------------
# turnstile run SCRIPT.json
# --------------------------------------------------------------------------


def _configure_run(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Run a script of inputs (specs/scripts.md) through the core and print "
                          "every output as one JSON line. Exit status 2 when the script is "
                          "malformed, a 'when' pattern is never matched, an effect selector "
                          "matches nothing, or the core refuses an input.")
    parser.add_argument("script", metavar="SCRIPT.json", help="the script to run")
    parser.add_argument("--echo-inputs", action="store_true",
                        help="also print each input as it is applied, as {\"in\": ...}")


def _run_run(args: argparse.Namespace) -> int:
    out = sys.stdout
    try:
        script = runner.load_script(args.script)
        for value in runner.run_script(script, echo_inputs=args.echo_inputs):
            out.write(json.dumps(value, ensure_ascii=False, separators=(",", ":")) + "\n")
    except runner.ScriptError as error:
        out.flush()
        print(f"turnstile run: {args.script}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as error:  # a bug in turnstile: still a message, not a traceback
        out.flush()
        print(f"turnstile run: {args.script}: internal error (please report): "
              f"{type(error).__name__}: {error}", file=sys.stderr)
        return EXIT_USAGE
    return EXIT_OK


# --------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------

# --------------------------------------------------------------------------
# turnstile explore
# --------------------------------------------------------------------------


def _configure_explore(parser: argparse.ArgumentParser) -> None:
    from machine.explore import COMMANDS as EXPLORE_COMMANDS
    from machine.explore import DEFAULT_COMMANDS
    parser.add_argument("--depth", type=argtypes.count, default=6,
                        help="how many decisions (commands and effect answers) per path")
    parser.add_argument("--commands", default=",".join(DEFAULT_COMMANDS),
                        help=f"comma-separated commands to explore (known: "
                             f"{', '.join(sorted(EXPLORE_COMMANDS))}; 'all' for every one)")
    parser.add_argument("--model", action="store_true",
                        help="also run the reference model and require identical outputs")
    parser.add_argument("--seconds", type=argtypes.seconds, default=None,
                        help="stop after this many seconds (reported as a budget stop)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")


def _run_explore(args: argparse.Namespace) -> int:
    from machine.explore import COMMANDS as EXPLORE_COMMANDS
    from machine.explore import main_explore
    names = sorted(EXPLORE_COMMANDS) if args.commands == "all" else [
        c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = [n for n in names if n not in EXPLORE_COMMANDS]
    if unknown or args.depth < 0:
        problem = f"unknown command(s) {unknown}" if unknown else "--depth must be >= 0"
        print(f"turnstile explore: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return main_explore(args.depth, commands=names, with_model=args.model,
                        budget_seconds=args.seconds, quiet=args.quiet)


def _configure_demo(parser: argparse.ArgumentParser) -> None:
    colour = parser.add_mutually_exclusive_group()
    colour.add_argument("--color", dest="colour", action="store_true", default=None,
                        help="colour the tables even when piped")
    colour.add_argument("--no-color", dest="colour", action="store_false",
                        help="plain text even on a terminal")


def _run_demo(args: argparse.Namespace) -> int:
    from machine.runtime.demo import main as demo_main
    return demo_main(colour=args.colour)


COMMANDS: Final[dict[str, Command]] = {
    "log": Command(help="session log tools", configure=_configure_log, run=_run_log),
    "diagrams": Command(help="machine diagrams and transition tables",
                        configure=_configure_diagrams, run=_run_diagrams),
    "explore": Command(help="bounded exhaustive exploration of the core (invariants, model)",
                       configure=_configure_explore, run=_run_explore),
    "run": Command(help="run a JSON script of inputs through the core",
                   configure=_configure_run, run=_run_run),
    "check": Command(help="run conformance vectors here or against a port",
                     configure=conformance_cli.configure_check, run=conformance_cli.run_check),
    "adapter": Command(help="serve this implementation over the conformance adapter protocol",
                       configure=conformance_cli.configure_adapter,
                       run=conformance_cli.run_adapter),
    "verify-trace": Command(help="check a recorded trace of another implementation",
                            configure=conformance_cli.configure_verify_trace,
                            run=conformance_cli.run_verify_trace),
    "record": Command(help="record a conformance vector from a draft",
                      configure=conformance_cli.configure_record, run=conformance_cli.run_record),
    "demo": Command(help="a narrated session through the asyncio runtime, then the corpus check",
                    configure=_configure_demo, run=_run_demo),
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
