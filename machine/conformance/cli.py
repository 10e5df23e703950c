"""The conformance subcommands of ``turnstile``: check, adapter, verify-trace, record.

Exit statuses (the worst one wins):

* 0 — everything passed;
* 1 — a vector failed, or a trace diverges;
* 2 — usage: bad arguments, a path that does not exist, nothing to check;
* 3 — a malformed vector, trace or draft (the message names file, line and field);
* 4 — the port broke the adapter protocol (malformed reply, timeout, exit, handshake);
* 70 — an internal error of turnstile (a bug; the message says so).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Final, TextIO

from machine import argtypes
from machine.conformance import adapter as adapter_module
from machine.conformance.checker import (
    Outcome,
    PortFailure,
    format_outcome,
    format_summary,
    run_all,
)
from machine.conformance.port import PortSubject
from machine.conformance.recorder import record_draft
from machine.conformance.subjects import LocalSubject, Subject
from machine.conformance.trace import default_progress, trace_lines, verify_trace
from machine.conformance.vectors import (
    MalformedError,
    Vector,
    dump_vector,
    find_vectors,
    load_vector,
    parse_vector,
)

__all__ = ["DEFAULT_VECTORS", "configure_adapter", "configure_check", "configure_record",
           "configure_verify_trace", "run_adapter", "run_check", "run_record", "run_verify_trace"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_MALFORMED: Final = 3
EXIT_PORT: Final = 4
EXIT_INTERNAL: Final = 70

#: The corpus shipped with this repository.
DEFAULT_VECTORS: Final = Path(__file__).resolve().parents[2] / "specs" / "conformance" / "vectors"


def _internal(command: str, error: BaseException) -> int:
    print(f"turnstile {command}: internal error (please report): {type(error).__name__}: {error}",
          file=sys.stderr)
    return EXIT_INTERNAL


# --------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------


def configure_check(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run conformance vectors against this implementation, or with --port against another "
        "one through the adapter protocol (specs/conformance/PROTOCOL.md). Prints the first "
        "divergence of each failing vector and a summary line 'N passed, M failed'. Exit status: "
        "0 all passed, 1 some failed, 2 usage, 3 malformed vector, 4 port protocol failure.")
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="vector files or directories (default: the shipped corpus)")
    parser.add_argument("--port", metavar="COMMAND",
                        help="run the vectors against the adapter started by COMMAND")
    parser.add_argument("--timeout", type=argtypes.seconds, default=10.0, metavar="SECONDS",
                        help="how long to wait for each adapter reply (default 10; the "
                             "handshake, which includes the port's start-up, waits at "
                             "least 30)")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="also list passed and skipped vectors")


def _load(paths: list[str], err: TextIO) -> tuple[list[Vector], int]:
    status = EXIT_OK
    if not paths:
        if not DEFAULT_VECTORS.is_dir():
            print("turnstile check: no PATH given and no shipped corpus found", file=err)
            return [], EXIT_USAGE
        paths = [str(DEFAULT_VECTORS)]
    files: list[Path] = []
    for path in paths:
        if not Path(path).exists():
            print(f"turnstile check: {path}: no such file or directory", file=err)
            status = EXIT_USAGE
            continue
        files.extend(find_vectors([path]))
    vectors: list[Vector] = []
    seen: dict[str, str] = {}
    for file in files:
        try:
            vector = load_vector(file)
        except MalformedError as error:
            print(f"turnstile check: malformed vector: {error}", file=err)
            status = max(status, EXIT_MALFORMED)
            continue
        if vector.id in seen:
            print(f"turnstile check: malformed vector: {file}: /id: {vector.id!r} is also the id "
                  f"of {seen[vector.id]}", file=err)
            status = max(status, EXIT_MALFORMED)
            continue
        seen[vector.id] = str(file)
        vectors.append(vector)
    if not vectors and status == EXIT_OK:
        print("turnstile check: no vectors found", file=err)
        status = EXIT_USAGE
    return vectors, status


def check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    vectors, status = _load(list(args.paths), err)
    if not vectors:
        return status
    if args.port:
        try:
            first = PortSubject(args.port, timeout=args.timeout)
        except PortFailure as failure:
            print(f"turnstile check: port {args.port!r}: {failure}", file=err)
            return max(status, EXIT_PORT)
        info = first.info
        pending: list[Subject] = [first]

        def factory() -> Subject:
            if pending:
                return pending.pop()
            return PortSubject(args.port, timeout=args.timeout)

        def skip(vector: Vector) -> str | None:
            deviating = [tag for tag in vector.tags if tag in info.deviations]
            if deviating:
                return f"the port deviates on purpose: {', '.join(deviating)}"
            missing = sorted(vector.requires - info.capabilities)
            if missing:
                return f"the port lacks the capability {', '.join(missing)}"
            return None
        try:
            outcomes = run_all(vectors, factory, skip)
        except PortFailure as failure:   # a restart failed
            print(f"turnstile check: port {args.port!r}: {failure}", file=err)
            return max(status, EXIT_PORT)
        finally:
            for subject in pending:
                subject.close()
    else:
        outcomes = run_all(vectors, LocalSubject)
    _report(outcomes, out, verbose=args.verbose)
    if any(o.status == "error" for o in outcomes):
        status = max(status, EXIT_PORT)
    elif any(o.status == "failed" for o in outcomes):
        status = max(status, EXIT_FAILED)
    return status


def _report(outcomes: list[Outcome], out: TextIO, *, verbose: bool) -> None:
    for outcome in outcomes:
        if outcome.status in ("failed", "error"):
            out.write("\n".join(format_outcome(outcome)) + "\n\n")
        elif verbose and outcome.status == "passed":
            out.write(f"PASS {outcome.vector.id}\n")
        elif verbose:
            out.write(f"SKIP {outcome.vector.id}: {outcome.reason}\n")
    out.write(format_summary(outcomes) + "\n")
    out.flush()


def run_check(args: argparse.Namespace) -> int:
    try:
        return check(args, sys.stdout, sys.stderr)
    except Exception as error:  # a bug in turnstile: a message, never a traceback
        return _internal("check", error)


# --------------------------------------------------------------------------
# adapter
# --------------------------------------------------------------------------


def configure_adapter(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve this implementation over the adapter protocol on standard input and output "
        "(specs/conformance/PROTOCOL.md), so that `turnstile check --port \"turnstile adapter\"` "
        "runs the vectors through the protocol.")
    parser.add_argument("--deviate", action="append", default=[], metavar="TAG",
                        help="declare a deviation: vectors with this tag are skipped (repeatable)")


def run_adapter(args: argparse.Namespace) -> int:
    try:
        return adapter_module.main(args.deviate)
    except (BrokenPipeError, KeyboardInterrupt):
        return EXIT_OK
    except Exception as error:
        return _internal("adapter", error)


# --------------------------------------------------------------------------
# verify-trace
# --------------------------------------------------------------------------


def configure_verify_trace(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Check recorded traces of another implementation (inputs interleaved with its observed "
        "outputs, JSON lines; specs/conformance/PROTOCOL.md) against this implementation step by "
        "step and report the first divergence with context. Exit status: 0 every trace agrees, "
        "1 a trace diverges, 2 usage, 3 malformed trace.")
    parser.add_argument("traces", nargs="+", metavar="TRACE.jsonl", help="a recorded trace")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show progress on standard error (default: when it is a terminal)")
    mode.add_argument("--no-progress", dest="progress", action="store_false")


def verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    status = EXIT_OK
    progress = default_progress() if args.progress is None else (err if args.progress else None)
    for path in args.traces:
        if not Path(path).exists():
            print(f"turnstile verify-trace: {path}: no such file", file=err)
            status = max(status, EXIT_USAGE)
            continue
        try:
            report = verify_trace(path, progress=progress)
        except MalformedError as error:
            print(f"turnstile verify-trace: malformed trace: {error}", file=err)
            status = max(status, EXIT_MALFORMED)
            continue
        out.write("\n".join(report.format()) + "\n")
        out.flush()
        if not report.ok:
            status = max(status, EXIT_FAILED)
    return status


def run_verify_trace(args: argparse.Namespace) -> int:
    try:
        return verify(args, sys.stdout, sys.stderr)
    except Exception as error:
        return _internal("verify-trace", error)


# --------------------------------------------------------------------------
# record
# --------------------------------------------------------------------------


def configure_record(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a draft vector (its inputs, with {\"pull\": N} or {\"pull\": \"all\"} where outputs "
        "are to be recorded; see specs/conformance/README.md) through this implementation and "
        "write the complete vector, or with --trace the same run as a trace. Review every "
        "recorded output against the spec before adding a vector to a corpus.")
    parser.add_argument("draft", metavar="DRAFT.json", help="a draft (or an existing vector)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    parser.add_argument("--trace", action="store_true", help="write a trace (JSON lines)")


def record(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if not Path(args.draft).exists():
        print(f"turnstile record: {args.draft}: no such file", file=err)
        return EXIT_USAGE
    try:
        vector = record_draft(args.draft)
        text = dump_vector(vector)
        parse_vector(text, args.output or "<recorded>")
    except MalformedError as error:
        print(f"turnstile record: malformed draft: {error}", file=err)
        return EXIT_MALFORMED
    if args.trace:
        text = "\n".join(trace_lines(vector, implementation="turnstile")) + "\n"
    if args.output:
        try:
            Path(args.output).write_text(text, encoding="utf-8")
        except OSError as error:
            print(f"turnstile record: {args.output}: cannot write: {error.strerror or error}",
                  file=err)
            return EXIT_USAGE
        print(f"wrote {args.output} ({len(vector.steps)} steps)", file=err)
    else:
        out.write(text)
    return EXIT_OK


def run_record(args: argparse.Namespace) -> int:
    try:
        return record(args, sys.stdout, sys.stderr)
    except Exception as error:
        return _internal("record", error)
