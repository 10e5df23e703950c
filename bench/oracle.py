"""Item 5: the oracle's speed: ``verify-trace`` events/s on a 1,000,000-event trace, and
``turnstile check`` vectors/s.

The trace is one long session written straight to disk while this
implementation runs it (`TraceWriter`: every input and every output, one JSON
line each; an *event* is one trace line, as in `machine.conformance.bench`).
Each turn is a prompt with a 20-piece streamed reply; every third turn first
calls two parallel tools; every fifth turn injects context while idle.

Three passes over the same file separate the costs: ``json.loads`` of every
line alone; replaying the inputs into a fresh core and pulling its outputs
without comparing (the floor the core sets); and the full `verify_trace`.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from collections import deque
from pathlib import Path
from typing import Any, TextIO

from bench.common import Section, rate
from machine.conformance.checker import run_all
from machine.conformance.recorder import config_to_json, output_json
from machine.conformance.subjects import LocalSubject, fake_clock
from machine.conformance.trace import TRACE_VERSION, verify_trace
from machine.conformance.vectors import config_from_json, find_vectors, load_vector
from machine.core import AgentCore, CoreConfig
from machine.io import (
    MODEL,
    PROMPT_SUBMIT,
    REQUEST,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    Effect,
    input_from_json,
)
from machine.jsonvalue import thaw
from machine.log import SessionLog
from machine.specfiles import vectors_dir

FULL_EVENTS = 1_000_000
QUICK_EVENTS = 1_500
CONFIG = CoreConfig(request_options={"provider": "bench", "model": "bench-1"},
                    tool_modes={"read": "parallel"})
WORDS = "word " * 40


class TraceWriter:
    """Runs a session on a core and writes every input and output as a trace line."""

    def __init__(self, handle: TextIO, config: CoreConfig = CONFIG) -> None:
        self.handle = handle
        self.core = AgentCore(config, log=SessionLog(clock=fake_clock))
        self.lines = 0
        self.turns = 0
        self._dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
        self._pending: deque[Effect] = deque()
        self._line({"trace": TRACE_VERSION, "config": config_to_json(config)})

    def _line(self, value: dict[str, Any]) -> None:
        self.handle.write(self._dumps(value) + "\n")
        self.lines += 1

    def _input(self, value: dict[str, Any]) -> None:
        self._line(value)
        core, kind = self.core, value["in"]
        if kind == "chunk":
            core.chunk(value["effect"], value["chunk"])
        elif kind == "end":
            core.end(value["effect"])
        elif kind == "resolve":
            core.resolve(value["effect"], value.get("value"))
        else:
            core.feed(input_from_json(value))

    def _pull_all(self) -> None:
        while (output := self.core.next_output()) is not None:
            self._line(output_json(output))
            if isinstance(output, Effect):
                self._pending.append(output)

    def turn(self) -> None:
        self.turns += 1
        turn = self.turns
        if turn % 5 == 0:
            self._input({"in": "inject", "message": {
                "id": f"c{turn}", "role": "user", "content": [{"type": "text", "text": "context"}],
                "source": {"kind": "plugin", "plugin": "bench"}}})
        self._input({"in": "followup", "message": {
            "id": f"p{turn}", "role": "user", "content": [{"type": "text", "text": f"prompt {turn}"}],
            "source": {"kind": "user"}}})
        while True:
            self._pull_all()
            if not self._pending:
                return
            self._answer(self._pending.popleft())

    def _answer(self, effect: Effect) -> None:
        kind, effect_id = effect.kind, effect.id
        if kind == MODEL:
            if self.turns % 3 == 0 and effect.payload["step"] == 1:
                chunks: list[dict[str, Any]] = [
                    {"type": "text", "text": "looking"},
                    {"type": "tool-call", "id": f"c{self.turns}a", "name": "read",
                     "arguments": '{"path": "a"}'},
                    {"type": "tool-call", "id": f"c{self.turns}b", "name": "read",
                     "arguments": '{"path": "b"}'},
                    {"type": "finish", "kind": "stop"}]
            else:
                chunks = [{"type": "text", "text": WORDS[i * 10:(i + 1) * 10]} for i in range(20)]
                chunks.append({"type": "usage", "usage": {"outputTokens": 40}})
                chunks.append({"type": "finish", "kind": "stop"})
            for chunk in chunks:
                self._input({"in": "chunk", "effect": effect_id, "chunk": chunk})
            self._input({"in": "end", "effect": effect_id})
        elif kind == PROMPT_SUBMIT:
            self._input({"in": "resolve", "effect": effect_id, "value": {"kind": "allow"}})
        elif kind == REQUEST:
            self._input({"in": "resolve", "effect": effect_id,
                         "value": {"config": thaw(effect.payload["config"])}})
        elif kind == TOOL_EXECUTE:
            self._input({"in": "resolve", "effect": effect_id,
                         "value": {"content": [{"type": "text", "text": "contents"}]}})
        elif kind == TOOL_FINALIZE:
            self._input({"in": "resolve", "effect": effect_id,
                         "value": thaw(effect.payload["result"])})
        else:
            self._input({"in": "resolve", "effect": effect_id})


def write_trace(path: str | Path, events: int) -> tuple[int, int]:
    """Write a trace of at least *events* lines at *path*; returns (lines, turns)."""
    with open(path, "w", encoding="utf-8") as handle:
        writer = TraceWriter(handle)
        writer._pull_all()
        while writer.lines < events:
            writer.turn()
    return writer.lines, writer.turns


def parse_only(path: str | Path) -> None:
    loads = json.loads
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            loads(line)


def core_only(path: str | Path) -> None:
    """Replay the inputs into a fresh core and pull its outputs, comparing nothing."""
    loads = json.loads
    with open(path, encoding="utf-8") as handle:
        header = loads(next(handle))
        core = AgentCore(config_from_json(header["config"]), log=SessionLog(clock=fake_clock))
        next_output = core.next_output
        for line in handle:
            step = loads(line)
            kind = step.get("in")
            if kind is None:
                next_output()
            elif kind == "chunk":
                core.chunk(step["effect"], step["chunk"])
            elif kind == "end":
                core.end(step["effect"])
            elif kind == "resolve":
                core.resolve(step["effect"], step.get("value"))
            else:
                core.feed(input_from_json(step))


def check_vectors(repeats: int) -> tuple[int, int, list[float]]:
    """Run the shipped corpus *repeats* times: (vectors, steps, seconds per pass)."""
    corpus = vectors_dir()
    assert corpus is not None, "no conformance corpus"
    vectors = [load_vector(path) for path in find_vectors([corpus])]
    steps = sum(len(v.steps) for v in vectors)
    passes = []
    for _ in range(repeats):
        start = time.perf_counter()
        outcomes = run_all(vectors, LocalSubject)
        passes.append(time.perf_counter() - start)
        failed = [o.vector.id for o in outcomes if o.status != "passed"]
        if failed:
            raise AssertionError(f"turnstile check failed on {failed[:5]}")
    return len(vectors), steps, passes


HEADERS = ["measurement", "lines (events)", "seconds", "events/s"]


def run(quick: bool = False, keep: str | None = None) -> Section:
    started = time.perf_counter()
    target = QUICK_EVENTS if quick else FULL_EVENTS
    fd, path = tempfile.mkstemp(prefix="turnstile-bench-", suffix=".jsonl")
    os.close(fd)
    if keep:
        path = keep
    try:
        t0 = time.perf_counter()
        lines, turns = write_trace(path, target)
        written = time.perf_counter() - t0
        size = os.path.getsize(path)
        t0 = time.perf_counter()
        parse_only(path)
        parse = time.perf_counter() - t0
        t0 = time.perf_counter()
        core_only(path)
        core = time.perf_counter() - t0
        report = verify_trace(path)
        if not report.ok:
            raise AssertionError("\n".join(report.format()))
    finally:
        if not keep:
            os.unlink(path)
    rows = [
        ["write the trace (run + encode)", f"{lines:,}", f"{written:.1f}", f"{rate(lines, written):,.0f}"],
        ["`json.loads` of every line", f"{lines:,}", f"{parse:.1f}", f"{rate(lines, parse):,.0f}"],
        ["core replay, no comparison", f"{lines:,}", f"{core:.1f}", f"{rate(lines, core):,.0f}"],
        ["**verify-trace** (full check)", f"{report.lines:,}", f"{report.seconds:.1f}",
         f"**{rate(report.lines, report.seconds):,.0f}**"],
    ]
    vectors, steps, passes = check_vectors(1 if quick else 5)
    per = statistics.median(passes)
    section = Section("5. Oracle speed: verify-trace and check", HEADERS, rows)
    section.tables.append((
        "`turnstile check` on the shipped corpus (in process, `LocalSubject`; vector loading "
        "not timed):", ["vectors", "steps", "seconds per pass (median)", "vectors/s", "steps/s"],
        [[str(vectors), f"{steps:,}", f"{per:.2f} ({min(passes):.2f}–{max(passes):.2f})",
          f"{rate(vectors, per):,.0f}", f"{rate(steps, per):,.0f}"]]))
    section.figures = {"lines": lines, "verify_events_per_s": rate(report.lines, report.seconds),
                       "core_events_per_s": rate(lines, core),
                       "parse_events_per_s": rate(lines, parse),
                       "vectors_per_s": rate(vectors, per)}
    section.notes.append(
        f"One session of {turns:,} turns, {report.inputs:,} inputs and {report.outputs:,} "
        f"outputs, {size / 1e6:.0f} MB. The trace is written by this implementation "
        "(`bench/oracle.py`, `TraceWriter`) and verified against a fresh core.")
    section.seconds = time.perf_counter() - started
    return section
