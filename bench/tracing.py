"""Item: what OpenTelemetry tracing (specs/runtime.md RT23) costs the asyncio runtime, as CPU
time per turn of workload W2 (a tool call per turn) through `machine.runtime.Agent`:

* untraced, before ``opentelemetry`` is imported at all (tracing not installed);
* untraced, with ``machine.runtime.tracing`` and the OpenTelemetry SDK imported (installed,
  not enabled): the agent runs the same code, so the two rows differ by noise only;
* traced by `trace_agent` to the API's default tracer (enabled, no SDK configured: no-op
  spans);
* traced to the SDK with an in-memory exporter (every span recorded).

The variants run interleaved, each repetition in turn, so a machine that speeds up or slows
down during the item affects them alike.
"""

from __future__ import annotations

import asyncio
import gc
import sys
import time
from collections.abc import Callable

from bench.common import Section, Stats
from bench.runtime_async import _measured, build_agent
from bench.throughput import Run
from machine.runtime import Agent

FULL_TURNS, FULL_REPS = 3_000, 7
QUICK_TURNS, QUICK_REPS = 30, 2

#: How each variant makes its agent, by label.
Variant = Callable[[], Agent]


def _untraced() -> Agent:
    return build_agent("W2")


def _noop_traced() -> Agent:
    from opentelemetry.trace import NoOpTracerProvider

    from machine.runtime.tracing import trace_agent
    agent = build_agent("W2")
    trace_agent(agent, tracer_provider=NoOpTracerProvider())
    return agent


def _sdk_traced() -> Agent:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from machine.runtime.tracing import trace_agent
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    agent = build_agent("W2")
    trace_agent(agent, tracer_provider=provider)
    return agent


def _once(make: Variant, turns: int) -> Run:
    gc.collect()
    return asyncio.run(_measured(make(), turns))


def run(quick: bool = False) -> Section:
    started = time.perf_counter()
    turns, reps = (QUICK_TURNS, QUICK_REPS) if quick else (FULL_TURNS, FULL_REPS)
    imported_before = "opentelemetry" in sys.modules
    cpu: dict[str, list[float]] = {"not installed": [], "installed, not enabled": [],
                                   "enabled, no-op tracer (API only)": [],
                                   "enabled, SDK + in-memory exporter": []}
    # Tracing "not installed": nothing of OpenTelemetry imported yet (first, before any import).
    for _ in range(reps):
        cpu["not installed"].append(_once(_untraced, turns).cpu / turns)
    import machine.runtime.tracing  # noqa: F401 - installed: imported, never called
    variants: dict[str, Variant] = {"installed, not enabled": _untraced,
                                    "enabled, no-op tracer (API only)": _noop_traced,
                                    "enabled, SDK + in-memory exporter": _sdk_traced}
    for _ in range(reps):
        for label, make in variants.items():
            cpu[label].append(_once(make, turns).cpu / turns)
    base = Stats.of([1e6 * c for c in cpu["not installed"]])
    rows: list[list[str]] = []
    figures: dict[str, object] = {}
    for label, values in cpu.items():
        stats = Stats.of([1e6 * c for c in values])
        change = 100 * (stats.median - base.median) / base.median
        rows.append([label, f"{turns:,}", stats.fmt(".1f"),
                     "–" if label == "not installed" else f"{change:+.1f}%"])
        figures[label] = {"cpu_us_per_turn": stats.median, "change_percent": change,
                          "runs": len(values)}
    section = Section("Tracing: runtime CPU per turn with and without (RT23)",
                      ["tracing", "turns per run", "CPU µs per turn", "÷ not installed"], rows)
    section.figures = figures
    section.notes.append(
        f"Workload W2 (a tool call per turn) through the asyncio runtime, median of {reps} "
        "runs each. 'Not installed' runs first, before anything of OpenTelemetry is imported"
        + (" (it was already imported in this process: run the item on its own)"
           if imported_before else "") + "; the other three then run interleaved. An agent "
        "that is not traced registers no observer, so 'installed, not enabled' runs the same "
        "code as 'not installed': their difference is the machine's noise.")
    section.seconds = time.perf_counter() - started
    return section
