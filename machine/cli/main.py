"""The ``turnstile`` command line.

Subcommands are listed in `COMMANDS`; each one configures its own argparse
sub-parser and runs from the parsed arguments. To add one, write a
``configure`` and a ``run`` function and add a `Command` to `COMMANDS`.

``turnstile --version`` prints the version; ``python -m machine`` is the same
command line.

``turnstile log validate FILE... [--json] [--junit FILE]`` replays session logs
and JSONL store session files through the session invariants (``specs/log.md``,
``machine.cli.logfiles``). Exit status: 0 when every file is a valid log, 1 when some
file is invalid or malformed, 2 for usage errors and unreadable files (the worst
status wins).

``turnstile log show|repair|fork TARGET`` inspect, repair and fork stored
sessions (``machine.store.cli``, ``specs/persistence.md``).

``turnstile diagrams [--write DIR | --check DIR]`` prints, writes or checks
the DOT diagrams and tables of the machines and the loop (``machine.cli.diagrams``):
``--check`` exits 1 naming every stale file.

``turnstile explore [--config NAME|all] [--depth N] [--commands …] [--model]``
explores every decision sequence up to depth N from a configuration
(``machine.checking.search.CONFIGURATIONS``), checking the runtime invariants and, with
``--model``, identical outputs from the reference model; it reports the rule
families reached.

``turnstile run SCRIPT.json [--echo-inputs]`` runs a script of inputs through
the core and prints every output as one JSON line (``machine.cli.runner``,
``specs/scripts.md``); a malformed or refused script exits 2 with a message
on stderr.

``turnstile chat --model NAME [--base-url URL] [--provider anthropic] [--session FILE]
[--resume]`` chats with a model of an OpenAI-compatible endpoint or of Anthropic
(``machine.runtime.chat``): the input line below the streaming answer, steering, local
commands, retries shown, a JSONL session that ``--resume`` continues and shows.

Every command reads standard input for a file named ``-``, ends quietly when the reader
of its output goes away, and shows progress only on a terminal (``machine.cli.terminal``).

``turnstile demo [--color | --no-color]`` runs a narrated session through the
asyncio runtime (``machine.runtime.demo``), prints its log and live events as
tables, validates the log and replays the conformance corpus through the
runtime; exit status 1 if anything differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TextIO

from machine import __version__
from machine.cli import argtypes, diagrams, runner
from machine.cli.junit import write_junit
from machine.cli.logfiles import EXIT_INVALID, EXIT_OK, EXIT_USAGE, junit_case, validate_file
from machine.cli.terminal import check_stdin_once, progress_bar, quiet_broken_pipe, shown
from machine.conformance import cli as conformance_cli
from machine.store import cli as store_cli

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


@dataclass(frozen=True, slots=True)
class Command:
    """One top-level subcommand: how to configure its parser and how to run it."""

    help: str
    configure: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# --------------------------------------------------------------------------
# turnstile log ...
# --------------------------------------------------------------------------


def _log_validate(args: argparse.Namespace, out: TextIO) -> int:
    """Verdict lines on *out*, unreadable files on standard error (`machine.cli.logfiles`)."""
    verdicts = []
    twice = check_stdin_once(args.files)
    if twice is not None:
        print(f"turnstile log validate: {twice}", file=sys.stderr)
        return EXIT_USAGE
    for path in args.files:
        with progress_bar(f"{shown(path)}:") as bar:    # only on a terminal (RT27)
            verdict = validate_file(path, bar)
        verdicts.append(verdict)
        if args.json:
            out.write(json.dumps(verdict.to_json(), ensure_ascii=False, separators=(",", ":")) + "\n")
        elif verdict.verdict == "unreadable":
            out.flush()
            print(verdict.text, file=sys.stderr)
        else:
            print(verdict.text, file=out)
    status = max(verdict.status for verdict in verdicts)
    if args.junit is not None:
        try:
            write_junit(args.junit, "turnstile log validate", [junit_case(v) for v in verdicts])
        except OSError as error:
            print(f"turnstile log validate: {args.junit}: cannot write the JUnit report: "
                  f"{error.strerror or error}", file=sys.stderr)
            status = max(status, EXIT_USAGE)
    return status


_LOG_SUBCOMMANDS: Final[dict[str, Callable[[argparse.Namespace, TextIO], int]]] = {
    "validate": _log_validate,
    **store_cli.LOG_SUBCOMMANDS,  # show, repair, fork: stored sessions (specs/persistence.md)
}


def _configure_log(parser: argparse.ArgumentParser) -> None:
    subcommands = parser.add_subparsers(dest="log_command", metavar="SUBCOMMAND", required=True)
    validate = subcommands.add_parser(
        "validate", help="check session logs and store files against the session invariants",
        description="Replay each FILE through the session-log rules L1-L14 and print one "
                    "verdict line per file. A FILE is a session log (one session event as JSON "
                    "per line) or a session file of the JSONL store (checksummed records after "
                    "a header; recognised by its first line). Files that cannot be read are "
                    "reported on standard error. Exit status: 0 all valid, 1 some invalid, "
                    "2 usage or unreadable.")
    validate.add_argument("files", nargs="+", metavar="FILE",
                          help="a JSONL session log or a JSONL store session file ('-': standard "
                               "input)")
    validate.add_argument("--json", action="store_true",
                          help="print one JSON object per file instead of the verdict lines")
    validate.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    store_cli.configure(subcommands)


def _run_log(args: argparse.Namespace) -> int:
    return _LOG_SUBCOMMANDS[args.log_command](args, sys.stdout)


# --------------------------------------------------------------------------
# turnstile diagrams ...
# --------------------------------------------------------------------------


def _configure_diagrams(parser: argparse.ArgumentParser) -> None:
    parser.description = ("Generate the Graphviz DOT diagrams and Markdown tables of the four "
                          "machines and of the loop's graph from their declarations. Without "
                          "options, print the DOT sources.")
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
    parser.description = ("Run a script of inputs (scripts.md of the spec) through the core and print "
                          "every output as one JSON line. Exit status 2 when the script is "
                          "malformed, a 'when' pattern is never matched, an effect selector "
                          "matches nothing, or the core refuses an input.")
    parser.add_argument("script", metavar="SCRIPT.json",
                        help="the script to run ('-': standard input)")
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
        print(f"turnstile run: {shown(args.script)}: {error}", file=sys.stderr)
        return EXIT_USAGE
    except BrokenPipeError:
        raise                   # the reader went away: `main` ends quietly
    except Exception as error:  # a bug in turnstile: still a message, not a traceback
        out.flush()
        print(f"turnstile run: {shown(args.script)}: internal error (please report): "
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
    from machine.checking.alphabet import COMMANDS as EXPLORE_COMMANDS
    from machine.checking.search import CONFIGURATIONS
    parser.add_argument("--config", default="idle", choices=[*CONFIGURATIONS, "all"],
                        help="where to start: " + "; ".join(
                            f"{c.name}: {c.description}" for c in CONFIGURATIONS.values()))
    parser.add_argument("--depth", type=argtypes.count, default=None,
                        help="how many decisions (commands, effect answers, macro-decisions) "
                             "per path (default: the configuration's CI depth)")
    parser.add_argument("--commands", default=None,
                        help=f"comma-separated commands to explore (known: "
                             f"{', '.join(sorted(EXPLORE_COMMANDS))}; 'all' for every one; "
                             "default: the configuration's)")
    parser.add_argument("--model", action="store_true",
                        help="also run the reference model and require identical outputs")
    parser.add_argument("--seconds", type=argtypes.seconds, default=None,
                        help="stop after this many seconds (reported as a budget stop)")
    parser.add_argument("--quiet", action="store_true", help="no progress display")
    parser.add_argument("--json", action="store_true",
                        help="print the result as one JSON object (states, transitions, "
                             "violation with its reproducing steps)")


def _run_explore(args: argparse.Namespace) -> int:
    from machine.checking.alphabet import COMMANDS as EXPLORE_COMMANDS
    from machine.cli.explore import main_explore
    names: list[str] | None = None
    if args.commands is not None:
        names = sorted(EXPLORE_COMMANDS) if args.commands == "all" else [
            c.strip() for c in args.commands.split(",") if c.strip()]
    unknown = [n for n in names or () if n not in EXPLORE_COMMANDS]
    if unknown or (args.depth is not None and args.depth < 0):
        problem = f"unknown command(s) {unknown}" if unknown else "--depth must be >= 0"
        print(f"turnstile explore: {problem}", file=sys.stderr)
        return EXIT_USAGE
    return main_explore(args.depth, configuration=args.config, commands=names,
                        with_model=args.model, budget_seconds=args.seconds, quiet=args.quiet,
                        as_json=args.json)


def _configure_demo(parser: argparse.ArgumentParser) -> None:
    colour = parser.add_mutually_exclusive_group()
    colour.add_argument("--color", dest="colour", action="store_true", default=None,
                        help="colour the tables even when piped")
    colour.add_argument("--no-color", dest="colour", action="store_false",
                        help="plain text even on a terminal")


def _run_demo(args: argparse.Namespace) -> int:
    from machine.runtime.demo import main as demo_main
    return demo_main(colour=args.colour)


def _configure_chat(parser: argparse.ArgumentParser) -> None:
    from machine.runtime.chat import configure
    configure(parser)


def _run_chat(args: argparse.Namespace) -> int:
    from machine.runtime.chat import main as chat_main
    return chat_main(args)


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
    "chat": Command(help="chat with a model of an OpenAI-compatible endpoint or Anthropic "
                         "(the runtime's worked example)", configure=_configure_chat,
                    run=_run_chat),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnstile", description="The turnstile agent-loop core: tools and checks.")
    parser.add_argument("--version", action="version",
                        version=f"turnstile {__version__} (distribution turnstile-agent)")
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
    try:
        status = COMMANDS[args.command].run(args)
        sys.stdout.flush()      # a reader gone before the last write is seen here, not at exit
    except BrokenPipeError:     # e.g. `turnstile check --json | head`: end quietly (RT27)
        return quiet_broken_pipe()
    return status


if __name__ == "__main__":
    sys.exit(main())
