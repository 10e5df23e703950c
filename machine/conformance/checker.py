"""Run vectors against an implementation and report the first divergence.

`run_vector` applies a vector's steps to a `Subject` in order: an input step
is fed (and must be accepted, or refused the way the step says), an output
step is compared with the next pulled output (strictly, except for the
step's loose fields), ``{"out": "none"}`` requires that nothing is pulled.
The first step that does not hold is the *divergence*; `format_outcome`
renders it with the inputs up to that point, the expected and the actual
output, and the rules the vector covers; `outcome_json` gives the same as one
JSON object (``turnstile check --json``).

Statuses: ``passed``, ``failed`` (a divergence), ``error`` (the port broke the
adapter protocol), ``skipped`` (a declared deviation or a missing capability),
and for vectors listed in a known-failures file (`machine.conformance.selection`)
``known-failure`` (it does not pass, as expected) and ``fixed`` (it passes now:
the list is out of date).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from machine.conformance import jsoncmp
from machine.conformance.subjects import Subject
from machine.conformance.vectors import Step, Vector

__all__ = ["STATUSES", "Divergence", "LateInputFailure", "Outcome", "PortFailure", "Status",
           "format_outcome", "format_summary", "outcome_json", "run_all", "run_vector"]

SHOWN_INPUTS: Final = 25
NONE: Final = {"out": "none"}


class PortFailure(Exception):
    """The port broke the adapter protocol (bad reply, timeout, exit); it must be restarted."""


class LateInputFailure(Exception):
    """The port reported (``input-failed``, PROTOCOL.md §3) that an input it had accepted at
    its first output failed afterwards: a divergence of the vector at that input."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


Status = Literal["passed", "failed", "error", "skipped", "known-failure", "fixed"]
#: Every status, in the order of the summary line.
STATUSES: Final[tuple[Status, ...]] = ("passed", "failed", "error", "skipped", "known-failure",
                                       "fixed")


@dataclass(frozen=True, slots=True)
class Divergence:
    index: int                       # the step that did not hold (0-based)
    expected: str                    # what the vector says, rendered
    actual: str                      # what the implementation did, rendered
    difference: str | None = None    # where two outputs differ
    #: the expected and the actual output as JSON values, when the step is an output step
    #: and the implementation gave one (None stands for "no output")
    expected_output: dict[str, Any] | None = None
    actual_output: dict[str, Any] | None = None
    pointer: str | None = None       # where inside them, a JSON Pointer


@dataclass(slots=True)
class Outcome:
    vector: Vector
    status: Status
    divergence: Divergence | None = None
    reason: str | None = None        # skip reason, or the port failure
    index: int | None = None         # for a port failure: the step being run
    steps_run: int = 0
    notes: list[str] = field(default_factory=list)
    restart: bool = False            # the subject's replies are out of step: start a new one
    seconds: float = 0.0             # how long the vector took (reports only; never asserted)
    #: for a vector in the known-failures file: what it said (its comment), and the status
    #: the run itself gave (``failed`` or ``error`` for a known failure, ``passed`` if fixed)
    known: str | None = None
    ran: Status | None = None


def _expect_raise(step: Step) -> str:
    return "accepted" if step.raises is None else f"refused with a {step.raises} error"


def run_vector(vector: Vector, subject: Subject) -> Outcome:
    """Run one vector; a `PortFailure` is turned into an ``error`` outcome."""
    steps = vector.steps
    index = 0
    last_input = 0
    try:
        subject.start(vector.id, vector.config, vector.seed)
        count = len(steps)
        while index < count:
            step = steps[index]
            if step.kind == "in":
                last_input = index
                refused = subject.feed(step.value)
                got = None if refused is None else refused[0]
                if got != step.raises:
                    actual = "accepted" if refused is None else \
                        f"refused with a {refused[0]} error: {refused[1]}"
                    return Outcome(vector, "failed", Divergence(index, _expect_raise(step), actual),
                                   steps_run=index)
                index += 1
                continue
            run_end = index
            while run_end < count and steps[run_end].kind == "out":
                run_end += 1
            pulled = subject.pull(run_end - index)
            for offset in range(run_end - index):
                expected_step = steps[index + offset]
                output = pulled[offset] if offset < len(pulled) else None
                divergence = _compare(index + offset, expected_step, output)
                if divergence is not None:
                    return Outcome(vector, "failed", divergence, steps_run=index + offset)
                if output is None:
                    break
            index = run_end
    except LateInputFailure as late:
        return Outcome(vector, "failed", Divergence(
            last_input, "accepted", f"accepted at its first output, then failed with a "
            f"{late.kind} error: {late.message}"), steps_run=last_input, restart=True)
    except PortFailure as failure:
        return Outcome(vector, "error", reason=str(failure), index=index, steps_run=index)
    except Exception as crash:  # the implementation itself broke: a failure of this vector
        step = steps[min(index, len(steps) - 1)]
        expected = _expect_raise(step) if step.kind == "in" else jsoncmp.render(step.value, 10_000)
        return Outcome(vector, "failed", Divergence(
            index, expected, f"the implementation raised {type(crash).__name__}: {crash}"),
            steps_run=index)
    return Outcome(vector, "passed", steps_run=len(steps))


def _compare(index: int, step: Step, actual: dict[str, Any] | None) -> Divergence | None:
    expected = step.value
    if expected.get("out") == "none":
        if actual is None:
            return None
        return Divergence(index, "no output now (the implementation waits for an input)",
                          jsoncmp.render(actual, 10_000), expected_output=dict(NONE),
                          actual_output=actual)
    if actual is None:
        return Divergence(index, jsoncmp.render(expected, 10_000),
                          "no output (the implementation waits for an input)",
                          expected_output=expected, actual_output=dict(NONE))
    if actual.get("out") == "event" and "time" in actual:
        actual = {k: v for k, v in actual.items() if k != "time"}
    if not step.loose and jsoncmp.same(expected, actual):
        return None
    difference = jsoncmp.first_difference(expected, actual, step.loose)
    if difference is None:
        return None
    return Divergence(index, jsoncmp.render(expected, 10_000), jsoncmp.render(actual, 10_000),
                      str(difference), expected, actual, jsoncmp.pointer(difference.path))


# --------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------


def _where(vector: Vector, index: int) -> str:
    line = vector.line(index)
    return f"step {index + 1}" + (f" (line {line})" if line else "")


def _short(value: dict[str, Any], limit: int = 160) -> str:
    return jsoncmp.render(value, limit)


def format_outcome(outcome: Outcome) -> list[str]:
    """The report lines of one failed or errored outcome (empty for the others)."""
    vector = outcome.vector
    ran = outcome.ran or outcome.status
    if ran not in ("failed", "error"):
        return []
    head = {"failed": "FAIL", "error": "ERROR"}[ran]
    if outcome.status == "known-failure":
        head = f"KNOWN {head}"
    lines = [f"{head} {vector.id} ({vector.path})",
             f"  title: {vector.title}",
             f"  rules: {', '.join(vector.rules)}"]
    if outcome.known:
        lines.append(f"  known failure: {outcome.known}")
    if ran == "error":
        where = _where(vector, outcome.index) if outcome.index is not None \
            and outcome.index < len(vector.steps) else "the start"
        lines.append(f"  port failure at {where}: {outcome.reason}")
        return lines
    divergence = outcome.divergence
    assert divergence is not None
    step = vector.steps[divergence.index]
    what = "input" if step.kind == "in" else "output"
    lines.append(f"  first divergence at {_where(vector, divergence.index)}, an {what} step")
    lines.extend(_inputs_so_far(vector, divergence.index))
    if step.kind == "out":
        last = _last_output(vector, divergence.index)
        if last is not None:
            lines.append(f"  last matching output, {_where(vector, last)}: "
                         f"{_short(vector.steps[last].value)}")
    else:
        lines.append(f"  input: {_short(step.value, 400)}")
    lines.append(f"  expected: {divergence.expected}")
    lines.append(f"  actual:   {divergence.actual}")
    if divergence.difference is not None:
        lines.append(f"  difference {divergence.difference}")
    return lines


def _inputs_so_far(vector: Vector, index: int) -> list[str]:
    inputs = [i for i in range(index) if vector.steps[i].kind == "in"]
    if not inputs:
        return ["  inputs up to that point: none"]
    lines = ["  inputs up to that point:"]
    if len(inputs) > SHOWN_INPUTS:
        lines.append(f"    ({len(inputs) - SHOWN_INPUTS} earlier inputs not shown)")
        inputs = inputs[-SHOWN_INPUTS:]
    for i in inputs:
        step = vector.steps[i]
        suffix = f"  -> refused ({step.raises})" if step.raises else ""
        lines.append(f"    {_where(vector, i)}: {_short(step.value)}{suffix}")
    return lines


def _last_output(vector: Vector, index: int) -> int | None:
    for i in range(index - 1, -1, -1):
        step = vector.steps[i]
        if step.kind == "out" and step.value.get("out") != "none":
            return i
    return None


_SUMMARY_WORDS: Final[dict[Status, tuple[str, str]]] = {
    "passed": ("passed", "passed"), "failed": ("failed", "failed"),
    "error": ("port error", "port errors"), "skipped": ("skipped", "skipped"),
    "known-failure": ("known failure", "known failures"),
    "fixed": ("known failure now passes", "known failures now pass"),
}


def format_summary(outcomes: Sequence[Outcome], *, not_selected: int = 0) -> str:
    """``N passed, M failed`` and, when there are any, the other counts in `STATUSES` order.

    A port error (ERROR, the adapter protocol broken) is counted apart from a failure;
    *not_selected* counts the vectors that ``--run``/``--skip``/``--tag``/``--rule`` left out.
    """
    counts = {status: sum(o.status == status for o in outcomes) for status in STATUSES}
    parts = [f"{counts['passed']} passed", f"{counts['failed']} failed"]
    for status in STATUSES[2:]:
        if counts[status]:
            one, many = _SUMMARY_WORDS[status]
            parts.append(f"{counts[status]} {one if counts[status] == 1 else many}")
    if not_selected:
        parts.append(f"{not_selected} not selected")
    return ", ".join(parts)


def outcome_json(outcome: Outcome) -> dict[str, Any]:
    """One vector's result as JSON (``turnstile check --json``, PROTOCOL.md §6)."""
    vector = outcome.vector
    out: dict[str, Any] = {"vector": vector.id, "status": outcome.status, "path": vector.path,
                           "rules": list(vector.rules), "tags": list(vector.tags)}
    if outcome.known is not None:
        out["known"] = outcome.known
    if outcome.ran is not None and outcome.ran != outcome.status:
        out["ran"] = outcome.ran
    if outcome.reason is not None and (outcome.ran or outcome.status) == "skipped":
        out["reason"] = outcome.reason
    ran = outcome.ran or outcome.status
    if ran == "error":
        index = outcome.index if outcome.index is not None and outcome.index < len(vector.steps) \
            else None
        out["portFailure"] = {"step": None if index is None else index + 1,
                              "line": None if index is None else vector.line(index) or None,
                              "message": outcome.reason}
    divergence = outcome.divergence
    if divergence is not None:
        step = vector.steps[divergence.index]
        first: dict[str, Any] = {"step": divergence.index + 1,
                                 "line": vector.line(divergence.index) or None,
                                 "kind": "input" if step.kind == "in" else "output"}
        if step.kind == "in":
            first["input"] = step.value
        # JSON values where there are outputs; otherwise the report's words ("accepted", …)
        first["expected"] = divergence.expected if divergence.expected_output is None \
            else divergence.expected_output
        first["actual"] = divergence.actual if divergence.actual_output is None \
            else divergence.actual_output
        if divergence.pointer is not None:
            first["pointer"] = divergence.pointer
        if divergence.difference is not None:
            first["difference"] = divergence.difference
        out["divergence"] = first
    out["steps"] = len(vector.steps)
    out["seconds"] = round(outcome.seconds, 6)
    return out


def run_all(vectors: Iterable[Vector], subject_factory: Callable[[], Subject],
            skip: Callable[[Vector], str | None] | None = None,
            done: Callable[[Outcome], None] | None = None) -> list[Outcome]:
    """Run *vectors* in order on one subject, restarting it after a port failure; *done*
    is called with each outcome as it is known (a progress display)."""
    outcomes: list[Outcome] = []
    subject: Subject | None = None
    try:
        for vector in vectors:
            reason = skip(vector) if skip is not None else None
            if reason is not None:
                outcomes.append(Outcome(vector, "skipped", reason=reason))
                if done is not None:
                    done(outcomes[-1])
                continue
            if subject is None:
                subject = subject_factory()
            started = time.perf_counter()
            outcome = run_vector(vector, subject)
            outcome.seconds = time.perf_counter() - started
            outcomes.append(outcome)
            if done is not None:
                done(outcome)
            if outcome.status == "error" or outcome.restart:
                subject.close()
                subject = None
    finally:
        if subject is not None:
            subject.close()
    return outcomes
