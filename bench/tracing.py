"""Item: what OpenTelemetry tracing (specs/runtime.md RT29) costs the asyncio runtime, as CPU
time per turn of workload W2 (a tool call per turn) through `machine.runtime.Agent`:

* untraced, before ``opentelemetry`` is imported at all (tracing not installed);
* untraced, with ``machine.runtime.tracing`` and the OpenTelemetry SDK imported (installed,
  not enabled): the agent runs the same code, so the two rows differ by noise only;
* traced by `trace_agent` to the API's default tracer (enabled, no SDK configured: no-op
  spans);
* traced to the SDK with an in-memory exporter (every span recorded).

Each run is a fresh process, and the variants run interleaved, each repetition in turn, so
a machine that speeds up or slows down during the item affects them alike.
"""

from __future__ import annotations

import asyncio
import gc
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import Section, Stats
from bench.runtime_async import _measured, build_agent
from bench.throughput import Run
from machine.runtime import Agent

ROOT = Path(__file__).resolve().parents[1]
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


#: The variants, in the order of the report: label -> how its agent is made.
VARIANTS: dict[str, str] = {"not installed": "untraced",
                            "installed, not enabled": "imported",
                            "enabled, no-op tracer (API only)": "noop",
                            "enabled, SDK + in-memory exporter": "sdk"}
_MAKERS: dict[str, Variant] = {"untraced": _untraced, "imported": _untraced,
                               "noop": _noop_traced, "sdk": _sdk_traced}


def child(variant: str, turns: int) -> None:
    """In a fresh process: one measured session of *variant*; prints CPU seconds per turn.
    ``imported`` imports the tracing module and the SDK first and then runs untraced;
    ``untraced`` imports nothing of OpenTelemetry (asserted)."""
    if variant == "imported":
        import opentelemetry.sdk.trace  # noqa: F401 - installed, never called

        import machine.runtime.tracing  # noqa: F401
    if variant == "untraced":
        assert "opentelemetry" not in sys.modules
    gc.collect()
    run: Run = asyncio.run(_measured(_MAKERS[variant](), turns))
    print(run.cpu / turns)


def _once(variant: str, turns: int) -> float:
    done = subprocess.run([sys.executable, "-c",
                           f"from bench.tracing import child; child({variant!r}, {turns})"],
                          cwd=ROOT, capture_output=True, text=True, check=True, timeout=600)
    return float(done.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> Section:
    started = time.perf_counter()
    turns, reps = (QUICK_TURNS, QUICK_REPS) if quick else (FULL_TURNS, FULL_REPS)
    cpu: dict[str, list[float]] = {label: [] for label in VARIANTS}
    for _ in range(reps):               # interleaved: drifts of the machine hit all alike
        for label, variant in VARIANTS.items():
            cpu[label].append(_once(variant, turns))
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
    section = Section("Tracing: runtime CPU per turn with and without (RT29)",
                      ["tracing", "turns per run", "CPU µs per turn", "÷ not installed"], rows)
    section.figures = figures
    section.notes.append(
        f"Workload W2 (a tool call per turn) through the asyncio runtime, median of {reps} "
        "runs each, every run in a fresh process (CPU time of the turns only), the variants "
        "interleaved. 'Not installed' imports nothing of OpenTelemetry; 'installed, not "
        "enabled' imports `machine.runtime.tracing` and the SDK and runs untraced: an agent "
        "that is not traced registers no observer, so it runs the same code, and the "
        "difference between the two rows is the machine's noise.")
    section.seconds = time.perf_counter() - started
    return section
