"""Item 2: the three workloads of item 1 through the asyncio runtime (`machine.runtime.Agent`).

The environment is the runtime's own: hooks, a model adapter and a tool, all
answering at once (no sleeps), and a store that persists nothing. Each turn is
``agent.followup(...)`` then ``await agent.when_idle()``. The difference from
item 1 is the runtime: effect tasks, event-loop passes, listener delivery.
"""

from __future__ import annotations

import asyncio
import gc
import tempfile
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from bench.common import Section, Stats, rate
from bench.throughput import GcTimer, Run
from bench.workloads import CONFIG, TEXT_REPLY, WORKLOADS, user
from machine.events import Event
from machine.runtime import Agent, ModelCall, SessionSink, StepContext, Tool, ToolCall
from machine.store import JsonlStore

FULL_SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (10, 30)


class NullStore:
    """A session sink that keeps nothing ("no persistence")."""

    def append(self, event: Event) -> None:
        pass

    def flush(self) -> None:
        pass


class BenchModel:
    """Replies at once: W2's first step calls ``echo``; every other step says ``hello``."""

    def __init__(self, workload: str) -> None:
        self.workload = workload
        self.default_config: Mapping[str, Any] = CONFIG

    def stream(self, call: ModelCall) -> AsyncIterator[Mapping[str, Any]]:
        if self.workload == "W2" and call.step == 1:
            return _play(({"type": "tool-call", "id": f"call-{call.turn}", "name": "echo",
                           "arguments": "{}"}, {"type": "finish", "kind": "stop"}))
        return _play(TEXT_REPLY)


async def _play(chunks: tuple[Mapping[str, Any], ...]) -> AsyncIterator[Mapping[str, Any]]:
    for chunk in chunks:
        yield chunk


async def _echo(call: ToolCall) -> str:
    return "ok"


def build_agent(workload: str, sink: SessionSink | None = None) -> Agent:
    tools = [Tool("echo", _echo)] if workload == "W2" else []
    agent = Agent(BenchModel(workload), tools=tools,
                  sink=sink if sink is not None else NullStore())
    if workload == "W3":
        async def step_hook(context: StepContext) -> None:
            if context.step == 1:
                agent.inject(user(f"c{context.turn}", "context", kind="plugin"))
                if context.turn % 2:
                    agent.steer(user(f"s{context.turn}", "steer"))
        agent.hooks.step.use(step_hook)
    return agent


async def _session(workload: str, turns: int, sink: SessionSink | None = None) -> Run:
    return await _measured(build_agent(workload, sink), turns)


async def _measured(agent: Agent, turns: int) -> Run:
    async with agent:
        await agent.when_idle()             # publication (not part of a turn)
        before = len(agent.session)
        gc.collect()
        with GcTimer() as timer:
            cpu0, start = time.process_time(), time.perf_counter()
            for turn in range(1, turns + 1):
                agent.followup(user(f"u{turn}"))
                await agent.when_idle()
            seconds, cpu = time.perf_counter() - start, time.process_time() - cpu0
        durable = len(agent.session) - before
    return Run(turns, durable, seconds, cpu, timer.seconds, timer.collections[2])


def run_async(workload: str, turns: int) -> Run:
    return asyncio.run(_session(workload, turns))


def run_durable(turns: int, *, fsync: bool) -> Run:
    """W1 written through `Agent.resume` into a new `JsonlStore` session (a temporary
    directory): every event appended as a checksummed line, a flush after every turn —
    with *fsync* an ``fsync`` of the file, without it only a write to the OS."""
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-jsonl-") as root:
        store = JsonlStore(root, fsync=fsync)

        async def main() -> Run:
            agent = Agent.resume(store, "bench", BenchModel("W1"), create=True)
            return await _measured(agent, turns)
        try:
            return asyncio.run(main())
        finally:
            store.close()


HEADERS = ["workload", "N turns", "turns/s", "durable events/s", "µs/event (wall)",
           "µs/event (CPU)", "GC % of wall", "core CPU µs/event (item 1)", "runtime CPU ÷ core CPU"]


def run(quick: bool = False, core_us: dict[str, float] | None = None,
        sizes: tuple[int, ...] | None = None, reps: int | None = None) -> Section:
    """*core_us*: item 1's median CPU µs/event per ``workload/N``, for the overhead column
    (issue 16 measures the runtime's cost as CPU time per turn against the core's)."""
    sizes = sizes or (QUICK_SIZES if quick else FULL_SIZES)
    reps = reps or (1 if quick else 3)
    started = time.perf_counter()
    rows: list[list[str]] = []
    figures: dict[str, object] = {}
    ratios: dict[str, float] = {}
    for workload in WORKLOADS:
        medians: dict[int, float] = {}
        for turns in sizes:
            runs = []
            for _ in range(reps if turns < 100_000 else min(reps, 1)):
                runs.append(run_async(workload, turns))
                gc.collect()
            tps = Stats.of([rate(r.turns, r.seconds) for r in runs])
            eps = Stats.of([rate(r.durable, r.seconds) for r in runs])
            us = Stats.of([1e6 * r.seconds / r.durable for r in runs])
            cpu_us = Stats.of([1e6 * r.cpu / r.durable for r in runs])
            gc_share = Stats.of([100 * r.gc_seconds / r.seconds for r in runs])
            medians[turns] = tps.median
            base = (core_us or {}).get(f"{workload}/{turns}")
            rows.append([workload, f"{turns:,}", tps.fmt(), eps.fmt(), us.fmt(".1f"),
                         cpu_us.fmt(".1f"), gc_share.fmt(".1f"),
                         "–" if base is None else f"{base:.1f}",
                         "–" if base is None else f"× {cpu_us.median / base:.2f}"])
            figures[f"{workload}/{turns}"] = {"turns_per_s": tps.median,
                                              "events_per_s": eps.median,
                                              "us_per_event": us.median,
                                              "cpu_us_per_event": cpu_us.median,
                                              "cpu_ratio": None if base is None
                                              else cpu_us.median / base, "runs": len(runs)}
        ratios[workload] = medians[sizes[-1]] / medians[sizes[0]]
    durable_turns = sizes[0]
    durable: dict[str, object] = {}
    for label, fsync in (("W1 + JsonlStore, fsync", True), ("W1 + JsonlStore, no fsync", False)):
        runs = [run_durable(durable_turns, fsync=fsync) for _ in range(reps)]
        tps = Stats.of([rate(r.turns, r.seconds) for r in runs])
        eps = Stats.of([rate(r.durable, r.seconds) for r in runs])
        us = Stats.of([1e6 * r.seconds / r.durable for r in runs])
        cpu_us = Stats.of([1e6 * r.cpu / r.durable for r in runs])
        gc_share = Stats.of([100 * r.gc_seconds / r.seconds for r in runs])
        base = (core_us or {}).get(f"W1/{durable_turns}")
        rows.append([label, f"{durable_turns:,}", tps.fmt(), eps.fmt(), us.fmt(".1f"),
                     cpu_us.fmt(".1f"), gc_share.fmt(".1f"),
                     "–" if base is None else f"{base:.1f}",
                     "–" if base is None else f"× {cpu_us.median / base:.2f}"])
        durable[label] = {"turns_per_s": tps.median, "events_per_s": eps.median,
                          "us_per_event": us.median, "cpu_us_per_event": cpu_us.median,
                          "runs": len(runs)}
    section = Section("2. The same workloads through the asyncio runtime", HEADERS, rows)
    section.figures = {"runs": figures, "flatness": ratios, "durable": durable}
    section.notes.append(
        "`machine.runtime.Agent` with the runtime's own environment: a model adapter and "
        "hooks that answer at once, the `echo` tool (W2), inject/steer from a step hook (W3), "
        "a sink that keeps nothing. Each turn is `followup` + `await when_idle()`.")
    section.notes.append(
        "The W1 + JsonlStore rows persist the session: `Agent.resume(JsonlStore(tmp), ..., "
        "create=True)`, each event a checksummed JSONL line and a flush after every turn "
        "(with fsync: an `fsync` per turn, which dominates on most disks; without: writes to "
        "the OS only). They show what persistence costs on top of the W1 row.")
    single = [n for n in sizes if n >= 100_000]
    if single and reps > 1:
        section.notes.append(
            f"Median of {reps} runs for N < 100,000; N = 100,000 is one run per workload "
            "(to keep `make bench` within its time budget).")
    section.notes.append("Flatness (turns/s at the largest N ÷ at the smallest): " + ", ".join(
        f"{w} {ratios[w]:.2f}" for w in WORKLOADS) + ".")
    section.seconds = time.perf_counter() - started
    return section
