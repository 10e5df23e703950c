"""Verify a recorded trace of another implementation against this one: ``turnstile verify-trace``.

A trace is JSON lines (specs/conformance/PROTOCOL.md §Traces). A header line
``{"trace": 1, "config": {...}, "seed"?: [...]}`` starts a session; the lines
after it are steps exactly as in a vector: the inputs the other
implementation was given, ``{"in": ...}`` (with ``"raises"`` when it refused
one), interleaved with the outputs it produced, ``{"out": ...}``, and
optionally ``{"out": "none"}`` where it had nothing to give. Another header
starts another session.

`verify_trace` replays each input into a fresh `AgentCore` and compares every
observed output with the one this implementation produces at the same
point, stopping at the first divergence. It is built for long traces: an
output line that is the canonical line of the expected output (PROTOCOL.md
§Traces) matches by text, unparsed; every other line is parsed once, inputs
are applied directly, and outputs are compared as JSON values (strictly, see
`jsoncmp`), implementation-worded fields relaxed only when a strict
comparison fails.
"""

from __future__ import annotations

import gc
import io
import json
import json.scanner
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TextIO, cast

from machine.cli.terminal import STDIN, progress_bar, read_text, shown
from machine.conformance import jsoncmp
from machine.conformance.jsoncmp import same_frozen
from machine.conformance.subjects import fake_clock, raise_kind
from machine.conformance.vectors import (
    COMPLETIONS,
    INPUT_FIELDS,
    RAISE_KINDS,
    MalformedError,
    Vector,
    check_step,
    config_from_json,
    seed_events,
)
from machine.conformance.wording import loose_fields
from machine.core import AgentCore
from machine.errors import TurnstileError, ValidationError
from machine.io import Durable, Effect, Live, input_from_json
from machine.jsonvalue import Frozen, FrozenDict, compact_json
from machine.log import SessionLog

__all__ = ["TRACE_VERSION", "TraceDivergence", "TraceReport", "trace_lines", "verify_trace"]

TRACE_VERSION: Final = 1
CONTEXT_LINES: Final = 6
_ALLOWED_INPUT_KEYS: Final = {kind: required | optional | {"in", "raises", "note"}
                              for kind, (required, optional) in INPUT_FIELDS.items()}
_REQUIRED_INPUT_KEYS: Final = {kind: required for kind, (required, _) in INPUT_FIELDS.items()}
_OUT_KINDS: Final = frozenset({"event", "live", "effect", "abort", "release", "none"})


@dataclass(frozen=True, slots=True)
class TraceDivergence:
    line: int
    session_line: int
    context: tuple[tuple[int, str], ...]
    observed: str
    expected: str
    difference: str | None


@dataclass(frozen=True, slots=True)
class TraceReport:
    path: str
    lines: int
    sessions: int
    inputs: int
    outputs: int
    seconds: float
    divergence: TraceDivergence | None = None

    @property
    def ok(self) -> bool:
        return self.divergence is None

    def to_json(self) -> dict[str, Any]:
        """The report as JSON (``turnstile verify-trace --json``, PROTOCOL.md §4)."""
        out: dict[str, Any] = {"file": self.path, "verdict": "ok" if self.ok else "diverges",
                               "lines": self.lines, "sessions": self.sessions,
                               "inputs": self.inputs, "outputs": self.outputs}
        d = self.divergence
        if d is not None:
            out["divergence"] = {"line": d.line, "sessionLine": d.session_line,
                                 "observed": d.observed, "expected": d.expected,
                                 "difference": d.difference,
                                 "context": [{"line": n, "text": text} for n, text in d.context]}
        out["seconds"] = round(self.seconds, 3)
        return out

    def format(self) -> list[str]:
        if self.divergence is None:
            return [f"{self.path}: OK ({self.lines} lines, {self.sessions} session"
                    f"{'' if self.sessions == 1 else 's'}, {self.inputs} inputs, {self.outputs} "
                    f"outputs)"]
        d = self.divergence
        lines = [f"{self.path}:{d.line}: DIVERGES from turnstile (session starting at line "
                 f"{d.session_line})"]
        if d.context:
            lines.append("  context:")
            lines.extend(f"    {n}: {text}" for n, text in d.context)
        lines.append(f"  observed (trace): {d.observed}")
        lines.append(f"  expected (turnstile): {d.expected}")
        if d.difference:
            lines.append(f"  difference {d.difference}")
        return lines


class _Progress:
    """The progress display of one trace (characters read of the file's size), on *stream*
    (`machine.cli.terminal.progress_bar`: a bar on a terminal)."""

    def __init__(self, stream: TextIO, path: str, size: int) -> None:
        self.bar = progress_bar(f"{path}:", max(size, 1), stream=stream, enabled=True)
        self.start = time.perf_counter()

    def update(self, lines: int, done_bytes: int) -> None:
        rate = lines / max(time.perf_counter() - self.start, 1e-9)
        self.bar.update(done_bytes, text=f"{lines:,} lines, {rate:,.0f} lines/s")

    def finish(self) -> None:
        self.bar.close()


def _session_core(header: dict[str, Any], path: str, lineno: int) -> AgentCore:
    extra = set(header) - {"trace", "config", "seed", "implementation", "vector", "note"}
    if extra:
        raise MalformedError(path, lineno, f"/{sorted(extra)[0]}", "unknown field in a trace header")
    if header.get("trace") != TRACE_VERSION or type(header.get("trace")) is not int:
        raise MalformedError(path, lineno, "/trace", f"must be {TRACE_VERSION}")
    config = header.get("config", {})
    if not isinstance(config, dict):
        raise MalformedError(path, lineno, "/config", "must be an object (rule P11)")
    seed = header.get("seed", [])
    if not isinstance(seed, list) or not all(isinstance(e, dict) for e in seed):
        raise MalformedError(path, lineno, "/seed", "must be an array of session events")
    try:
        core_config = config_from_json(config)
    except ValidationError as error:
        raise MalformedError(path, lineno, "/config/" + error.path.replace(".", "/"),
                             error.problem) from None
    try:
        log = SessionLog(seed_events(seed), clock=fake_clock)
    except TurnstileError as error:
        raise MalformedError(path, lineno, "/seed", str(error)) from None
    return AgentCore(core_config, log=log)


def _malformed_step(path: str, lineno: int, value: Any) -> MalformedError:
    try:
        check_step(value)
    except ValueError as problem:
        field, _, text = str(problem).partition(": ")
        return MalformedError(path, lineno, field, text)
    return MalformedError(path, lineno, "", "not a trace step")  # pragma: no cover


def verify_trace(path: str | Path, *, progress: TextIO | None = None) -> TraceReport:
    """Check a trace file (``-``: standard input); raises MalformedError (file, line, field)
    for a malformed one."""
    name = shown(path)
    try:
        if str(path) == STDIN:
            text = read_text(path)
            size, handle = len(text), cast(TextIO, io.StringIO(text))
        else:
            size = os.path.getsize(path)
            handle = open(path, encoding="utf-8")  # noqa: SIM115 - closed below
    except FileNotFoundError:
        raise MalformedError(name, None, "", "no such file") from None
    except IsADirectoryError:
        raise MalformedError(name, None, "", "is a directory, not a trace") from None
    except OSError as error:
        raise MalformedError(name, None, "", f"cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise MalformedError(name, None, "", f"not UTF-8 text ({error.reason})") from None
    meter = _Progress(progress, name, size) if progress is not None else None
    try:
        with handle, _survivors_frozen():
            return _verify(name, handle, meter)
    except UnicodeDecodeError as error:
        raise MalformedError(name, None, "", f"not UTF-8 text ({error.reason})") from None
    finally:
        if meter is not None:
            meter.finish()


@contextmanager
def _survivors_frozen() -> Iterator[None]:
    """While checking, move what survives a collection of the middle generation into the
    garbage collector's permanent generation (`gc.freeze`), and give it all back at the end.

    Why: the replayed session keeps its history (tens of objects per turn) for as long as
    the trace runs, and every full collection walked all of it again: about a tenth of the
    time of a long trace. Frozen, it is never walked; young garbage is still collected as
    usual. Skipped when the collector is off or the caller has frozen objects of its own
    (the final `gc.unfreeze` would give those back too)."""
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return

    def freeze_survivors(phase: str, info: dict[str, int]) -> None:
        if phase == "stop" and info["generation"] >= 1:
            gc.freeze()

    gc.callbacks.append(freeze_survivors)
    try:
        yield
    finally:
        gc.callbacks.remove(freeze_survivors)
        gc.unfreeze()


def _verify(name: str, handle: TextIO, meter: _Progress | None) -> TraceReport:
    started = time.perf_counter()
    # The last lines as read, (number, raw line): trimmed only when a divergence is reported.
    recent: deque[tuple[int, str]] = deque(maxlen=CONTEXT_LINES)
    remember = recent.append
    core: AgentCore | None = None
    session_line = 0
    sessions = inputs = outputs = 0
    lineno = 0
    done_bytes = 0
    next_output: Callable[[], Any] | None = None
    data_json: Callable[[int], str] = _no_data
    # The constant starts of canonical lines, per event type, live type and effect kind.
    event_starts: dict[str, str] = {}
    live_starts: dict[str, str] = {}
    effect_kinds: dict[str, str] = {}
    scan, encode, join, quote = _scan_once, _encode_chunks, "".join, _quote

    def report(divergence: TraceDivergence | None) -> TraceReport:
        return TraceReport(name, lineno, sessions, inputs, outputs,
                           time.perf_counter() - started, divergence)

    def diverge(observed: str, expected: str, difference: str | None) -> TraceReport:
        context = tuple((n, text.rstrip("\n")[:200]) for n, text in recent)
        return report(TraceDivergence(lineno, session_line, context, observed, expected,
                                      difference))

    for line in handle:
        lineno += 1
        if meter is not None:
            done_bytes += len(line)
            if not lineno & 0xFFF:
                meter.update(lineno, done_bytes)
        # Why the comparisons: `'{"out":' <= line < '{"out;'` is `line.startswith('{"out":')`
        # (";" follows ":"), at half the cost of the method call.
        if next_output is not None and '{"out":' <= line < '{"out;':
            # The fast path (PROTOCOL.md §Traces, canonical lines): pull this
            # implementation's output and compare the line with its canonical text (built
            # here for events, effects and live events, by `_control_line` for the rest).
            # Equal text is the same JSON value, so the output matches; any other line
            # (another layout, a "time" or "note" field, a divergence) takes the general
            # path below with the output already pulled.
            try:
                pulled: Any = next_output()
            except Exception as crash:  # reported by the general path, with the step
                pulled = _Crashed(crash)
            else:
                cls = type(pulled)
                canonical: str | None
                if cls is Durable:
                    event = pulled.event
                    start = event_starts.get(event.type)
                    if start is None:
                        start = _remember_start(event_starts, event.type,
                                                f'{{"out":"event","type":{quote(event.type)},'
                                                f'"seq":')
                    seq = event.seq
                    op = event.surface_op
                    sources = event.source_event_seqs
                    if op is None and sources is None and not event.ignorable:
                        canonical = f'{start}{seq},"data":{data_json(seq)}}}\n'
                    else:
                        canonical = f'{start}{seq},"data":{data_json(seq)}'
                        if op is not None:
                            canonical += ',"surfaceOp":' + (quote(op) if type(op) is str
                                                            else join(encode(op, 0)))
                        if sources is not None:
                            canonical += ',"sourceEventSeqs":' + join(encode(sources, 0))
                        if event.ignorable:                     # D16
                            canonical += ',"ignorable":true'
                        canonical += "}\n"
                elif pulled is None:
                    canonical = '{"out":"none"}\n'
                elif cls is Effect:
                    data = pulled.payload._data
                    start = effect_kinds.get(pulled.kind)
                    if start is None:
                        start = _remember_start(effect_kinds, pulled.kind,
                                                ',"kind":' + quote(pulled.kind))
                    if not data:
                        canonical = f'{{"out":"effect","effect":{pulled.id}{start}}}\n'
                    elif "out" in data or "effect" in data or "kind" in data:
                        canonical = None  # a payload key repeats an envelope field
                    else:
                        canonical = (f'{{"out":"effect","effect":{pulled.id}{start},'
                                     f'{join(encode(data, 0))[1:]}\n')
                elif cls is Live:
                    event = pulled.event
                    data = event.payload._data
                    start = live_starts.get(event.type)
                    if start is None:
                        start = _remember_start(live_starts, event.type,
                                                '{"out":"live","type":' + quote(event.type))
                    if not data:
                        canonical = start + "}\n"
                    elif "out" in data:
                        canonical = None  # a payload key repeats an envelope field
                    else:
                        canonical = f'{start},{join(encode(data, 0))[1:]}\n'
                else:
                    canonical = _control_line(pulled)
                if line == canonical:
                    outputs += 1
                    remember((lineno, line))
                    continue
        else:
            pulled = _NOT_PULLED
        if not line or line.isspace():  # blank (as `not line.strip()`, without a copy)
            continue
        # `json.loads` of the line, without its pure-Python wrappers on the usual path: the
        # C scanner directly, then only the newline may follow. Anything else (leading or
        # other trailing whitespace, an error) goes through `json.loads`, as always.
        try:
            step, end = scan(line, 0)
        except StopIteration:  # not a value at the start: `json.loads` below decides
            step, end = None, 0
        except json.JSONDecodeError:
            raise MalformedError(name, lineno, "", _json_problem(line)) from None
        except RecursionError:
            raise MalformedError(name, lineno, "", "invalid JSON: nested too deeply") from None
        if end != len(line) and line[end:] != "\n":
            step = _load_line(name, lineno, line)
        if type(step) is not dict:
            raise MalformedError(name, lineno, "", "a trace line must be a JSON object")
        size = len(step)
        if size <= 3 and core is not None:
            # The usual completions, with exactly their fields and a valid effect id, are
            # applied at once; anything else (another input, "raises", "note", a missing or
            # unknown field, a bad id) takes the general path below, which reports it.
            kind = step.get("in")
            effect = step.get("effect")
            if type(effect) is int and effect >= 0:
                try:
                    if kind == "chunk":
                        if size != 3 or "chunk" not in step:
                            kind = None
                        else:
                            core.chunk(effect, step["chunk"])
                    elif kind == "resolve":
                        if size == 3 and "value" not in step:
                            kind = None
                        else:
                            core.resolve(effect, step.get("value"))
                    elif kind == "end":
                        if size != 2:
                            kind = None
                        else:
                            core.end(effect)
                    else:
                        kind = None
                except Exception as error:  # a refusal the trace does not show, or a crash
                    inputs += 1
                    failure = _input_failure(step, error, None, completion=True)
                    assert failure is not None
                    return diverge(*failure, None)
                if kind is not None:
                    inputs += 1
                    remember((lineno, line))
                    continue
        out = step.get("out")
        if out is not None:
            if core is None or next_output is None:
                raise MalformedError(name, lineno, "", 'an output before the first {"trace": 1, '
                                                       '...} header')
            if type(out) is not str or out not in _OUT_KINDS:  # (an array is not hashable)
                raise _malformed_step(name, lineno, step)
            outputs += 1
            try:
                output = next_output() if pulled is _NOT_PULLED else pulled
                if type(output) is _Crashed:
                    raise output.error
            except Exception as crash:  # a bug in turnstile, shown at the line that triggers it
                return diverge(jsoncmp.render(step, 400), _crash(crash), None)
            if out == "none":
                if output is not None:
                    return diverge('{"out":"none"} (no output now)',
                                   jsoncmp.render(_json(output), 10_000), None)
            else:
                step.pop("note", None)
                step.pop("loose", None)
                if out == "event":
                    step.pop("time", None)
                if output is None:
                    return diverge(jsoncmp.render(step, 10_000),
                                   "no output now (turnstile waits for an input)", None)
                if not _same_output(output, step):
                    expected = _json(output)
                    difference = jsoncmp.first_difference(expected, step, loose_fields(expected))
                    if difference is not None:
                        try:
                            check_step(step)
                        except ValueError:
                            raise _malformed_step(name, lineno, step) from None
                        return diverge(jsoncmp.render(step, 10_000),
                                       jsoncmp.render(expected, 10_000), str(difference))
        elif "in" in step:
            if core is None:
                raise MalformedError(name, lineno, "", 'an input before the first {"trace": 1, '
                                                       '...} header')
            kind = step["in"]
            allowed = _ALLOWED_INPUT_KEYS.get(kind) if type(kind) is str else None
            if allowed is None or not step.keys() <= allowed or \
                    not _REQUIRED_INPUT_KEYS[kind] <= step.keys():
                raise _malformed_step(name, lineno, step)
            raises = step.pop("raises", None)
            step.pop("note", None)
            if raises is not None and raises not in RAISE_KINDS:
                raise MalformedError(name, lineno, "/raises", f"must be one of {', '.join(RAISE_KINDS)}")
            completion = kind in COMPLETIONS
            if completion and (type(step["effect"]) is not int or step["effect"] < 0):
                raise MalformedError(name, lineno, "/effect", "must be a non-negative integer effect id")
            inputs += 1
            try:
                if kind == "chunk":
                    core.chunk(step["effect"], step["chunk"])
                elif kind == "end":
                    core.end(step["effect"])
                elif kind == "resolve":
                    core.resolve(step["effect"], step.get("value"))
                else:
                    core.feed(input_from_json(step))
            except Exception as error:
                failure = _input_failure(step, error, raises, completion=completion)
                if failure is not None:
                    return diverge(*failure, None)
            else:
                if raises is not None:
                    return diverge(f"{jsoncmp.render(step, 400)} refused with a {raises} error",
                                   "accepted", None)
        elif "trace" in step:
            core = _session_core(step, name, lineno)
            next_output = core.next_output
            data_json = core.log.data_json
            session_line = lineno
            sessions += 1
            recent.clear()
        else:
            raise MalformedError(name, lineno, "", 'a trace line is a header {"trace": 1, ...}, an '
                                                   'input {"in": ...} or an output {"out": ...}')
        remember((lineno, line))
    if sessions == 0:
        raise MalformedError(name, None, "", 'no {"trace": 1, ...} header: not a trace')
    return report(None)


def _input_failure(step: dict[str, Any], error: Exception, raises: str | None, *,
                   completion: bool) -> tuple[str, str] | None:
    """(observed, expected) when applying *step* raised *error*; None when the core refused it
    as the trace says (*raises*)."""
    if not isinstance(error, TurnstileError):  # a bug in turnstile, shown at its line
        return jsoncmp.render(step, 400), _crash(error)
    refused = raise_kind(error, completion=completion)
    if refused is None:  # pragma: no cover - every core error has a kind
        return jsoncmp.render(step, 400), _crash(error)
    if refused == raises:
        return None
    observed = "accepted" if raises is None else f"refused with a {raises} error"
    return f"{jsoncmp.render(step, 400)} {observed}", f"refused with a {refused} error: {error}"


def _remember_start(starts: dict[str, str], key: str, start: str) -> str:
    """Cache the start of a canonical line (a bounded number: types come from the trace)."""
    if len(starts) < 1024:
        starts[key] = start
    return start


def _no_data(seq: int) -> str:  # pragma: no cover - no output is pulled before a header
    raise AssertionError("no session")


def _same_fields(payload: FrozenDict, step: dict[str, Any]) -> bool:
    """Every field of *payload* has the same value in *step* (which has no other fields left)."""
    data: dict[str, Frozen] = payload._data  # the plain dict inside: no Mapping-ABC overhead
    missing = _MISSING
    for key, value in data.items():
        other = step.get(key, missing)
        if other is missing or not same_frozen(value, other):
            return False
    return True


def _same_output(output: Any, step: dict[str, Any]) -> bool:
    """`same(output JSON, step)` without building the output's JSON (the fast path)."""
    kind = type(output)
    if kind is Durable:
        event = output.event
        size = (4 + (event.surface_op is not None) + (event.source_event_seqs is not None)
                + event.ignorable)
        seq = step.get("seq")
        if (len(step) != size or step["out"] != "event" or step.get("type") != event.type
                or type(seq) is not int or seq != event.seq
                or not same_frozen(event.data, step.get("data"))):
            return False
        if event.surface_op is not None and not same_frozen(event.surface_op,
                                                            step.get("surfaceOp", _MISSING)):
            return False
        if event.ignorable and step.get("ignorable") is not True:        # D16
            return False
        return event.source_event_seqs is None or same_frozen(
            event.source_event_seqs, step.get("sourceEventSeqs", _MISSING))
    if kind is Live:
        event = output.event
        return (step["out"] == "live" and step.get("type") == event.type
                and len(step) == 2 + len(event.payload) and _same_fields(event.payload, step))
    if kind is Effect:
        effect_id = step.get("effect")
        return (step["out"] == "effect" and type(effect_id) is int and effect_id == output.id
                and step.get("kind") == output.kind and len(step) == 3 + len(output.payload)
                and _same_fields(output.payload, step))
    return (step["out"] == output.kind and len(step) == 1 + len(output.payload)
            and _same_fields(output.payload, step))


_MISSING: Final = object()
_NOT_PULLED: Final = object()


@dataclass(frozen=True, slots=True)
class _Crashed:
    """next_output() raised: the general path reports it at this line."""
    error: Exception


def _frozen_default(value: object) -> dict[str, Frozen]:
    """The encoder's fallback: a FrozenDict's own plain dict (as `compact_json`)."""
    if type(value) is FrozenDict:
        return value._data
    raise TypeError(f"a {type(value).__name__} is not a frozen JSON value")


_quote = json.encoder.encode_basestring   # a JSON string literal, non-ASCII kept (C)
# The C encoder of `compact_json` (no spaces, keys in order, non-ASCII kept, NaN refused),
# called directly: ``"".join(_encode_chunks(value, 0))`` is ``compact_json(value)``, and a
# payload's plain dict is encoded without the fallback call for the payload itself.
_encode_chunks: Callable[[Any, int], list[str]]
_make_encoder = getattr(json.encoder, "c_make_encoder", None)
if _make_encoder is not None:
    _encode_chunks = _make_encoder(None, _frozen_default, _quote, None, ":", ",", False, False,
                                   False)
else:  # pragma: no cover - CPython always has the C accelerator
    def _encode_chunks(value: Any, level: int) -> list[str]:
        return [compact_json(value)]


def _control_line(output: Any) -> str | None:
    """The canonical trace line of an ``abort`` or ``release`` (PROTOCOL.md §Traces), None
    when a payload key would repeat ``out``. The loop of `_verify` builds the others:
    compact JSON, the envelope fields first in their documented order, then the payload or
    data in this implementation's order, non-ASCII kept, a newline at the end."""
    data = output.payload._data
    start = '{"out":' + _quote(output.kind)
    if not data:
        return start + "}\n"
    if "out" in data:
        return None
    return f'{start},{"".join(_encode_chunks(data, 0))[1:]}\n'


# Why the ignore: typeshed types the scanner's context as a scanner; a decoder is what it reads.
_scan_once: Callable[[str, int], tuple[Any, int]] = json.scanner.make_scanner(
    json.JSONDecoder())  # type: ignore[arg-type]


def _load_line(name: str, lineno: int, line: str) -> Any:
    """`json.loads` of a line the fast scan in `_verify` left over, its errors as
    MalformedError."""
    try:
        return json.loads(line)
    except json.JSONDecodeError:
        raise MalformedError(name, lineno, "", _json_problem(line)) from None
    except RecursionError:
        raise MalformedError(name, lineno, "", "invalid JSON: nested too deeply") from None


def _crash(error: BaseException) -> str:
    return f"turnstile raised {type(error).__name__}: {error} (a bug in turnstile; please report)"


def _json_problem(line: str) -> str:
    """The JSON error of one line, its column counted on the line without its newline."""
    try:
        json.loads(line.rstrip("\r\n"))
    except json.JSONDecodeError as error:
        return f"invalid JSON: {error.msg} (column {error.colno})"
    return "invalid JSON"  # pragma: no cover - only called for a line that failed


def _json(output: Any) -> dict[str, Any]:
    result: dict[str, Any] = output.to_json(with_time=False) if isinstance(output, Durable) \
        else output.to_json()
    return result


def trace_lines(vector: Vector, *, implementation: str | None = None) -> Iterator[str]:
    """A vector as a trace: its header line, then one line per step."""
    header: dict[str, Any] = {"trace": TRACE_VERSION, "config": vector.config}
    if vector.seed:
        header["seed"] = list(vector.seed)
    header["vector"] = vector.id
    if implementation:
        header["implementation"] = implementation
    yield json.dumps(header, ensure_ascii=False, separators=(",", ":"))
    for step in vector.steps:
        yield json.dumps(step.to_json(), ensure_ascii=False, separators=(",", ":"))


def default_progress() -> TextIO | None:
    """Standard error when it is a terminal (the progress display is for people)."""
    return sys.stderr if sys.stderr.isatty() else None
