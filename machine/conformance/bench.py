"""Benchmark of ``turnstile verify-trace`` (events per second), and of the core alone.

    .venv/bin/python -m machine.conformance.bench [--turns N] [--keep FILE]

It records one long session of this implementation (prompts, streamed
replies, tool calls, steering) as a trace, then measures, on the same file:

* ``parse``: reading the lines and ``json.loads`` alone;
* ``core``: replaying the inputs into an `AgentCore` and pulling its outputs,
  with no comparison (the floor the core sets);
* ``verify-trace``: the full check, as ``turnstile verify-trace`` runs it.

An *event* is one trace line: an input or an output.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from typing import Any

from machine.checking.scripted import Driver, ScriptedEnvironment, calls_reply, ok_result, text_reply
from machine.cli import argtypes
from machine.conformance.recorder import RecordingCore
from machine.conformance.trace import trace_lines, verify_trace
from machine.conformance.vectors import config_from_json
from machine.core import AgentCore, CoreConfig
from machine.io import input_from_json
from machine.log import SessionLog

__all__ = ["main", "write_trace"]


def write_trace(path: str, turns: int) -> int:
    """Record a session of *turns* turns as a trace at *path*; returns the number of lines."""
    core = RecordingCore(CoreConfig(tool_modes={"read": "parallel"}))
    replies: list[Any] = []
    for turn in range(turns):
        if turn % 3 == 0:
            replies.append(calls_reply((f"c{turn}a", "read", '{"path": "a"}'),
                                       (f"c{turn}b", "read", '{"path": "b"}'), text="looking"))
        replies.append(text_reply("word " * 40, pieces=20, usage={"outputTokens": 40}))
    env = ScriptedEnvironment(replies=replies)
    env.tool_results = {}
    env.handlers["tool-execute"] = lambda effect: ("resolve", ok_result("contents"))
    driver = Driver(core, env)
    for turn in range(turns):
        core.followup({"id": f"p{turn}", "role": "user", "content": [{"type": "text",
                       "text": f"prompt {turn}"}], "source": {"kind": "user"}})
        if turn % 5 == 0:
            core.inject({"id": f"c{turn}", "role": "user", "content": [{"type": "text",
                         "text": "context"}], "source": {"kind": "plugin", "plugin": "bench"}})
        driver.run()
    vector = core.vector("bench", "benchmark session", ["P1"], [])
    count = 0
    with open(path, "w", encoding="utf-8") as out:
        for line in trace_lines(vector):
            out.write(line + "\n")
            count += 1
    return count


def _timed(run: Callable[[], object]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


def _parse(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        for line in handle:
            json.loads(line)


def _core_only(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        header = json.loads(next(handle))
        core = AgentCore(config_from_json(header["config"]), log=SessionLog(clock=lambda: 0))
        for line in handle:
            step = json.loads(line)
            if "in" in step:
                core.feed(input_from_json(step))
            else:
                core.next_output()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=argtypes.positive_count, default=2000,
                        help="turns in the session (2000)")
    parser.add_argument("--keep", metavar="FILE", help="write the trace here and keep it")
    args = parser.parse_args(argv)
    path = args.keep or tempfile.mkstemp(suffix=".jsonl", prefix="turnstile-bench-")[1]
    try:
        lines = write_trace(path, args.turns)
        size = os.path.getsize(path)
        print(f"trace: {lines:,} lines ({size / 1e6:.1f} MB), {args.turns} turns")
        results = {"parse": _timed(lambda: _parse(path)),
                   "core": _timed(lambda: _core_only(path)),
                   "verify-trace": _timed(lambda: verify_trace(path))}
        report = verify_trace(path)
        assert report.ok, report.format()
        for name, seconds in results.items():
            print(f"{name:>13}: {seconds:6.2f} s  {lines / seconds:>10,.0f} events/s")
    finally:
        if not args.keep:
            os.unlink(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
