"""The conformance subcommands of ``turnstile``: check, adapter, verify-trace, record.

Exit statuses (the worst one wins):

* 0 — everything passed (skipped vectors and known failures allowed);
* 1 — a vector failed, a known failure passes now, or a trace diverges;
* 2 — usage: bad arguments, a path that does not exist, nothing to check;
* 3 — a malformed vector, trace or draft (the message names file, line and field);
* 4 — the port broke the adapter protocol (malformed reply, timeout, exit, handshake);
* 70 — an internal error of turnstile (a bug; the message says so).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from machine import __version__
from machine.cli import argtypes
from machine.cli.junit import CaseStatus, JunitCase, write_junit
from machine.cli.terminal import STDIN, check_stdin_once, progress_bar
from machine.conformance import adapter as adapter_module
from machine.conformance.checker import (
    STATUSES,
    Outcome,
    PortFailure,
    format_outcome,
    format_summary,
    outcome_json,
    run_all,
)
from machine.conformance.port import PortSubject
from machine.conformance.recorder import record_draft
from machine.conformance.selection import (
    KnownFailures,
    KnownFailuresError,
    Selection,
    apply_known,
    known_failures_text,
    load_known_failures,
    patterns,
)
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
from machine.specfiles import (
    CHECKOUT_SPECS,
    SHIPPED_SPECS,
    CorpusInfoError,
    conformance_dir,
    corpus_info,
    vectors_dir,
)

__all__ = ["CheckOptions", "configure_adapter", "configure_check", "configure_record",
           "configure_verify_trace", "run_adapter", "run_check", "run_record", "run_verify_trace"]

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_MALFORMED: Final = 3
EXIT_PORT: Final = 4
EXIT_INTERNAL: Final = 70

#: the handshake's default budget (``--start-timeout``): a process start is not a reply
DEFAULT_START_TIMEOUT: Final = 60.0


def _internal(command: str, error: BaseException) -> int:
    print(f"turnstile {command}: internal error (please report): {type(error).__name__}: {error}",
          file=sys.stderr)
    return EXIT_INTERNAL


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _kit_help(name: str = "PROTOCOL.md") -> str:
    """Where a document of the conformance kit is, for help texts (installed or checkout)."""
    kit = conformance_dir()
    return str(kit / name) if kit is not None else f"{name} of the conformance kit"


# --------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------


def configure_check(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run conformance vectors against this implementation, or with --port against another "
        f"one through the adapter protocol ({_kit_help()}). Prints the first divergence of each "
        "failing vector and a summary line 'N passed, M failed' (port errors, skips and known "
        "failures counted apart). Exit status: 0 all passed (skips and known failures "
        "allowed), 1 some failed or a known failure now passes, 2 usage, 3 malformed vector, "
        "4 port protocol failure.")
    parser.add_argument("paths", nargs="*", metavar="PATH",
                        help="vector files or directories ('-': one vector on standard input; "
                             "default: the shipped corpus)")
    parser.add_argument("--port", metavar="COMMAND",
                        help="run the vectors against the adapter started by COMMAND")
    parser.add_argument("--timeout", type=argtypes.seconds, default=10.0, metavar="SECONDS",
                        help="how long to wait for each adapter reply (default 10)")
    parser.add_argument("--version", action="store_true",
                        help="print the versions of turnstile and of the corpus, where the "
                             "corpus is, and exit")
    select = parser.add_argument_group(
        "selection", "Patterns are repeatable or comma-separated; a vector runs when it matches "
                     "every kind given (PROTOCOL.md §6).")
    select.add_argument("--run", action="append", default=[], metavar="GLOB",
                        help="only vectors whose id matches GLOB (e.g. 'A*', 'M1?-cancel')")
    select.add_argument("--skip", action="append", default=[], metavar="GLOB",
                        help="leave out vectors whose id matches GLOB")
    select.add_argument("--tag", action="append", default=[], metavar="GLOB",
                        help="only vectors with a tag matching GLOB (e.g. scenario, 'D*')")
    select.add_argument("--rule", action="append", default=[], metavar="RULE",
                        help="only vectors covering RULE or a rule under it (R16 matches "
                             "R16.2); globs allowed")
    known = parser.add_argument_group("known failures")
    known.add_argument("--known-failures", metavar="FILE",
                       help="vectors expected to fail, one id per line with '# why' (they do "
                            "not fail the run; one that passes does; '-': standard input)")
    known.add_argument("--write-known-failures", metavar="FILE",
                       help="write the ids of the vectors that did not pass to FILE, keeping "
                            "the reasons already in --known-failures")
    output = parser.add_argument_group("output")
    output.add_argument("--json", action="store_true",
                        help="print JSON lines instead of the text report: one object per "
                             "vector, then one summary object")
    output.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")
    output.add_argument("-v", "--verbose", action="store_true",
                        help="also list passed, skipped and known-failure vectors")
    parser.add_argument("--start-timeout", type=argtypes.seconds, default=DEFAULT_START_TIMEOUT,
                        metavar="SECONDS", help="how long to wait for a started adapter's "
                        f"handshake (default {DEFAULT_START_TIMEOUT:g})")


@dataclass(frozen=True, slots=True)
class CheckOptions:
    """The options of one ``turnstile check``; a Namespace built by hand may omit the newer ones."""

    paths: tuple[str, ...] = ()
    port: str | None = None
    timeout: float = 10.0
    verbose: bool = False
    version: bool = False
    selection: Selection = field(default_factory=Selection)
    known_failures: str | None = None
    write_known_failures: str | None = None
    json: bool = False
    junit: str | None = None
    start_timeout: float = DEFAULT_START_TIMEOUT

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> CheckOptions:
        def get(name: str, default: Any) -> Any:
            return getattr(args, name, default)
        return cls(tuple(get("paths", ())), get("port", None), get("timeout", 10.0),
                   get("verbose", False), get("version", False),
                   Selection(patterns(get("run", ())), patterns(get("skip", ())),
                             patterns(get("tag", ())), patterns(get("rule", ()))),
                   get("known_failures", None), get("write_known_failures", None),
                   get("json", False), get("junit", None),
                   get("start_timeout", DEFAULT_START_TIMEOUT))


@dataclass(frozen=True, slots=True)
class _Malformed:
    path: str
    message: str


def _load(paths: Sequence[str], err: TextIO) -> tuple[list[Vector], list[_Malformed], int]:
    status = EXIT_OK
    if not paths:
        corpus = vectors_dir()
        if corpus is None:
            print(f"turnstile check: no PATH given and no shipped corpus found (looked in "
                  f"{CHECKOUT_SPECS} and {SHIPPED_SPECS}); is the package installed whole?",
                  file=err)
            return [], [], EXIT_USAGE
        paths = [str(corpus)]
    existing: list[str] = []
    for path in paths:
        if path != STDIN and not Path(path).exists():
            print(f"turnstile check: {path}: no such file or directory", file=err)
            status = EXIT_USAGE
        else:
            existing.append(path)
    vectors: list[Vector] = []
    malformed: list[_Malformed] = []
    seen: dict[str, str] = {}
    for file in find_vectors(existing):   # a file reached twice is given once
        try:
            vector = load_vector(file)
        except MalformedError as error:
            malformed.append(_Malformed(str(file), str(error)))
            print(f"turnstile check: malformed vector: {error}", file=err)
            status = max(status, EXIT_MALFORMED)
            continue
        if vector.id in seen:
            message = f"{file}: /id: {vector.id!r} is also the id of {seen[vector.id]}"
            malformed.append(_Malformed(str(file), message))
            print(f"turnstile check: malformed vector: {message}", file=err)
            status = max(status, EXIT_MALFORMED)
            continue
        seen[vector.id] = str(file)
        vectors.append(vector)
    if not vectors and status == EXIT_OK:
        print("turnstile check: no vectors found", file=err)
        status = EXIT_USAGE
    return vectors, malformed, status


def _version(options: CheckOptions, out: TextIO, err: TextIO) -> int:
    try:
        info = corpus_info()
    except CorpusInfoError as error:
        print(f"turnstile check: {error}", file=err)
        return EXIT_USAGE
    corpus = vectors_dir()
    count = len(list(find_vectors([corpus]))) if corpus is not None else 0
    if options.json:
        out.write(_dumps({"turnstile": __version__, "corpus": info.corpus,
                          "vectorFormat": info.vector_format,
                          "adapterProtocol": info.adapter_protocol,
                          "traceFormat": info.trace_format, "vectors": count,
                          "kit": str(info.path)}) + "\n")
    else:
        out.write(f"turnstile {__version__} (distribution turnstile-agent)\n"
                  f"conformance corpus {info.corpus}: {count} vectors (vector format "
                  f"{info.vector_format}, adapter protocol {info.adapter_protocol}, trace format "
                  f"{info.trace_format})\n"
                  f"kit: {info.path} (PROTOCOL.md, README.md, vector.schema.json, vectors/)\n")
    return EXIT_OK


def check(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    options = CheckOptions.from_args(args)
    if options.version:
        return _version(options, out, err)
    twice = check_stdin_once([*options.paths, *filter(None, [options.known_failures])])
    if twice is not None:
        print(f"turnstile check: {twice}", file=err)
        return EXIT_USAGE
    known: KnownFailures | None = None
    if options.known_failures is not None:
        try:
            known = load_known_failures(options.known_failures)
        except KnownFailuresError as error:
            print(f"turnstile check: known failures: {error}", file=err)
            return EXIT_USAGE
    vectors, malformed, status = _load(options.paths, err)
    if not vectors:
        return status
    selected, not_selected = options.selection.split(vectors)
    if not selected:
        print(f"turnstile check: no vector matches the selection ({len(vectors)} loaded)",
              file=err)
        return max(status, EXIT_USAGE)
    implementation = f"turnstile {__version__}"
    # A bar on standard error when it is a terminal, nothing otherwise (RT27).
    with progress_bar("turnstile check", len(selected), stream=err) as bar:
        def done(outcome: Outcome) -> None:
            bar.advance(text=outcome.vector.id)
        if options.port:
            try:
                outcomes, implementation = _run_port(options, selected, done)
            except PortFailure as failure:   # the first handshake, or a restart, failed
                bar.close()
                print(f"turnstile check: port {options.port!r}: {failure}", file=err)
                return max(status, EXIT_PORT)
        else:
            outcomes = run_all(selected, LocalSubject, done=done)
    if known is not None:
        apply_known(outcomes, known)
        loaded = {vector.id for vector in vectors}
        stray = [vector for vector in known.entries if vector not in loaded]
        if stray:
            names = "id names" if len(stray) == 1 else "ids name"
            print(f"turnstile check: {known.path}: {len(stray)} listed {names} no vector of "
                  f"this run: {', '.join(stray)}", file=err)
    if any(o.status == "error" for o in outcomes):
        status = max(status, EXIT_PORT)
    elif any(o.status in ("failed", "fixed") for o in outcomes):
        status = max(status, EXIT_FAILED)
    if options.json:
        _report_json(outcomes, malformed, out, not_selected=not_selected,
                     implementation=implementation, default_corpus=not options.paths,
                     status=status)
    else:
        _report(outcomes, out, verbose=options.verbose, not_selected=not_selected, known=known)
    if options.junit is not None:
        status = max(status, _write_junit_report(options.junit, outcomes, malformed, err,
                                                 implementation=implementation))
    if options.write_known_failures is not None:
        status = max(status, _write_known(options.write_known_failures, outcomes, known,
                                          err, default_corpus=not options.paths))
    return status


def _run_port(options: CheckOptions, vectors: list[Vector],
              done: Callable[[Outcome], None]) -> tuple[list[Outcome], str]:
    """Run *vectors* through the port's adapter (restarted after each port failure)."""
    assert options.port is not None
    port = options.port
    first = PortSubject(port, timeout=options.timeout, start_timeout=options.start_timeout)
    info = first.info
    pending: list[Subject] = [first]

    def factory() -> Subject:
        if pending:
            return pending.pop()
        return PortSubject(port, timeout=options.timeout, start_timeout=options.start_timeout)

    def skip(vector: Vector) -> str | None:
        deviating = [tag for tag in vector.tags if tag in info.deviations]
        if deviating:
            return f"the port deviates on purpose: {', '.join(deviating)}"
        missing = sorted(vector.requires - info.capabilities)
        if missing:
            return f"the port lacks the capability {', '.join(missing)}"
        return None
    try:
        return run_all(vectors, factory, skip, done), info.implementation
    finally:
        for subject in pending:
            subject.close()


def _report(outcomes: list[Outcome], out: TextIO, *, verbose: bool, not_selected: int,
            known: KnownFailures | None) -> None:
    for outcome in outcomes:
        vector = outcome.vector
        if outcome.status in ("failed", "error"):
            out.write("\n".join(format_outcome(outcome)) + "\n\n")
        elif outcome.status == "fixed":
            assert known is not None
            out.write(f"FIXED {vector.id} ({vector.path}): a known failure that passes now; "
                      f"remove line {known.entries[vector.id].line} of {known.path}\n\n")
        elif verbose and outcome.status == "known-failure":
            out.write("\n".join(format_outcome(outcome)) + "\n\n")
        elif verbose and outcome.status == "passed":
            out.write(f"PASS {vector.id}\n")
        elif verbose:
            out.write(f"SKIP {vector.id}: {outcome.reason}\n")
    out.write(format_summary(outcomes, not_selected=not_selected) + "\n")
    out.flush()


def _report_json(outcomes: list[Outcome], malformed: list[_Malformed], out: TextIO, *,
                 not_selected: int, implementation: str, default_corpus: bool,
                 status: int) -> None:
    for problem in malformed:
        out.write(_dumps({"path": problem.path, "status": "malformed",
                          "message": problem.message}) + "\n")
    for outcome in outcomes:
        out.write(_dumps(outcome_json(outcome)) + "\n")
    counts: dict[str, int] = {s: sum(o.status == s for o in outcomes) for s in STATUSES}
    counts["malformed"] = len(malformed)
    counts["notSelected"] = not_selected
    summary: dict[str, Any] = {"summary": counts, "implementation": implementation,
                               "line": format_summary(outcomes, not_selected=not_selected)}
    if default_corpus:
        try:
            summary["corpus"] = corpus_info().corpus
        except CorpusInfoError:
            summary["corpus"] = None
    summary["exit"] = status
    out.write(_dumps(summary) + "\n")
    out.flush()


_JUNIT_STATUS: Final[dict[str, CaseStatus]] = {
    "passed": "passed", "failed": "failed", "error": "error", "skipped": "skipped",
    "known-failure": "skipped", "fixed": "failed"}


def _write_junit_report(path: str, outcomes: list[Outcome], malformed: list[_Malformed],
                        err: TextIO, *, implementation: str) -> int:
    cases = [JunitCase(problem.path, "conformance.malformed", "error",
                       message="malformed vector", text=problem.message, file=problem.path)
             for problem in malformed]
    for outcome in outcomes:
        vector = outcome.vector
        report = "\n".join(format_outcome(outcome))
        if outcome.status == "fixed":
            message = f"a known failure that passes now: remove it from the list ({outcome.known})"
        elif outcome.status == "known-failure":
            message = f"known failure: {outcome.known}"
        elif outcome.status == "skipped":
            message = outcome.reason or "skipped"
        elif outcome.divergence is not None:
            message = outcome.divergence.difference or \
                f"step {outcome.divergence.index + 1}: {outcome.divergence.actual}"[:300]
        else:
            message = outcome.reason or ""
        classname = f"conformance.{vector.tags[0] if vector.tags else 'vector'}"
        cases.append(JunitCase(vector.id, classname, _JUNIT_STATUS[outcome.status],
                               outcome.seconds, message, report, vector.path))
    try:
        write_junit(path, f"turnstile check: {implementation}", cases)
    except OSError as error:
        print(f"turnstile check: {path}: cannot write the JUnit report: "
              f"{error.strerror or error}", file=err)
        return EXIT_USAGE
    return EXIT_OK


def _write_known(path: str, outcomes: list[Outcome], known: KnownFailures | None,
                 err: TextIO, *, default_corpus: bool) -> int:
    corpus: str | None = None
    if default_corpus:
        try:
            corpus = corpus_info().corpus
        except CorpusInfoError:
            corpus = None
    text = known_failures_text(outcomes, previous=known, corpus=corpus)
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        print(f"turnstile check: {path}: cannot write: {error.strerror or error}", file=err)
        return EXIT_USAGE
    count = sum(1 for line in text.splitlines() if line and not line.startswith("#"))
    print(f"turnstile check: wrote {path} ({count} vector{'' if count == 1 else 's'} that did "
          f"not pass)", file=err)
    return EXIT_OK


def run_check(args: argparse.Namespace) -> int:
    try:
        return check(args, sys.stdout, sys.stderr)
    except BrokenPipeError:
        raise                       # the reader went away: `turnstile` ends quietly (RT27)
    except Exception as error:  # a bug in turnstile: a message, never a traceback
        return _internal("check", error)


# --------------------------------------------------------------------------
# adapter
# --------------------------------------------------------------------------


def configure_adapter(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Serve this implementation over the adapter protocol on standard input and output "
        f"({_kit_help()}), so that `turnstile check --port \"turnstile adapter\"` "
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
        f"outputs, JSON lines; {_kit_help()}) against this implementation step by "
        "step and report the first divergence with context. Exit status: 0 every trace agrees, "
        "1 a trace diverges, 2 usage, 3 malformed trace.")
    parser.add_argument("traces", nargs="+", metavar="TRACE.jsonl",
                        help="a recorded trace ('-': standard input)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--progress", dest="progress", action="store_true", default=None,
                      help="show progress on standard error (default: when it is a terminal)")
    mode.add_argument("--no-progress", dest="progress", action="store_false")
    parser.add_argument("--json", action="store_true",
                        help="print one JSON object per trace instead of the text report")
    parser.add_argument("--junit", metavar="FILE", help="also write a JUnit XML report to FILE")


def verify(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    status = EXIT_OK
    as_json = getattr(args, "json", False)
    junit: str | None = getattr(args, "junit", None)
    progress = default_progress() if args.progress is None else (err if args.progress else None)
    cases: list[JunitCase] = []
    twice = check_stdin_once(args.traces)
    if twice is not None:
        print(f"turnstile verify-trace: {twice}", file=err)
        return EXIT_USAGE
    for path in args.traces:
        if path != STDIN and not Path(path).exists():
            message = f"{path}: no such file"
            print(f"turnstile verify-trace: {message}", file=err)
            if as_json:
                out.write(_dumps({"file": path, "verdict": "unreadable", "message": message})
                          + "\n")
            cases.append(JunitCase(path, "trace", "error", message=message, file=path))
            status = max(status, EXIT_USAGE)
            continue
        try:
            report = verify_trace(path, progress=progress)
        except MalformedError as error:
            print(f"turnstile verify-trace: malformed trace: {error}", file=err)
            if as_json:
                out.write(_dumps({"file": path, "verdict": "malformed", "message": str(error),
                                  "line": error.line, "field": error.field}) + "\n")
            cases.append(JunitCase(path, "trace", "error", message="malformed trace",
                                   text=str(error), file=path))
            status = max(status, EXIT_MALFORMED)
            continue
        lines = report.format()
        out.write(_dumps(report.to_json()) + "\n" if as_json else "\n".join(lines) + "\n")
        out.flush()
        cases.append(JunitCase(path, "trace", "passed" if report.ok else "failed",
                               report.seconds, "" if report.ok else lines[0], "\n".join(lines),
                               path))
        if not report.ok:
            status = max(status, EXIT_FAILED)
    if junit is not None:
        try:
            write_junit(junit, "turnstile verify-trace", cases)
        except OSError as error:
            print(f"turnstile verify-trace: {junit}: cannot write the JUnit report: "
                  f"{error.strerror or error}", file=err)
            status = max(status, EXIT_USAGE)
    return status


def run_verify_trace(args: argparse.Namespace) -> int:
    try:
        return verify(args, sys.stdout, sys.stderr)
    except BrokenPipeError:
        raise                       # the reader went away: `turnstile` ends quietly (RT27)
    except Exception as error:
        return _internal("verify-trace", error)


# --------------------------------------------------------------------------
# record
# --------------------------------------------------------------------------


def configure_record(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run a draft vector (its inputs, with {\"pull\": N} or {\"pull\": \"all\"} where outputs "
        f"are to be recorded; see {_kit_help('README.md')}) through this implementation and "
        "write the complete vector, or with --trace the same run as a trace. Review every "
        "recorded output against the spec before adding a vector to a corpus.")
    parser.add_argument("draft", metavar="DRAFT.json",
                        help="a draft (or an existing vector; '-': standard input)")
    parser.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    parser.add_argument("--trace", action="store_true", help="write a trace (JSON lines)")


def record(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.draft != STDIN and not Path(args.draft).exists():
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
    except BrokenPipeError:
        raise                       # the reader went away: `turnstile` ends quietly (RT27)
    except Exception as error:
        return _internal("record", error)
