"""Item 7: memory — bytes per retained durable event, and the core's state size with many
queued prompts and staged outbox items (which must grow linearly).

Sizes are ``tracemalloc`` deltas after a full collection: everything the core
keeps alive (the events, their frozen data, the derived history, the queued
or staged messages), nothing that was only transient. Each measurement runs
at three sizes; a linear cost shows as a constant number of bytes per item.
"""

from __future__ import annotations

import gc
import time
import tracemalloc
from collections.abc import Callable

from bench.common import Section
from bench.workloads import WORKLOADS, LeanDriver, new_core, user
from machine.core import AgentCore
from machine.io import STEP_HOOK, Effect


def _retained(build: Callable[[], tuple[object, int]]) -> tuple[int, int, float]:
    """(bytes retained by what *build* returns, its item count, seconds *build* took)."""
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        start = time.perf_counter()
        keep, items = build()
        seconds = time.perf_counter() - start
        gc.collect()
        after = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    del keep
    return after - before, items, seconds


def durable_events(workload: str, turns: int) -> tuple[int, int, float]:
    """Bytes retained per durable event by a core after *turns* turns (the core built before)."""
    driver = LeanDriver(workload)
    driver.drain()
    driver.run(2)                 # the first request/header and lazy state, outside the delta
    start = driver.durable

    def build() -> tuple[object, int]:
        driver.run(turns)
        return driver, driver.durable - start
    return _retained(build)


def queued_prompts(count: int) -> tuple[int, int, float]:
    """An idle core with *count* queued prompts (the wake tick left unanswered)."""
    core = new_core()
    _pull_all(core)

    def build() -> tuple[object, int]:
        for index in range(count):
            core.followup(user(f"q{index}", f"prompt {index}"))
            _pull_all(core)
        assert core.pending_queued == count
        return core, count
    return _retained(build)


def staged_items(count: int) -> tuple[int, int, float]:
    """A core held at step 1's hook (window open) with *count* staged contexts."""
    core = new_core()
    driver = LeanDriver("W1", core)
    held: list[Effect] = []
    core.followup(user("u1"))
    while not held:
        output = core.next_output()
        if output is None:
            effect = driver._pending.popleft()
            if effect.kind == STEP_HOOK:
                held.append(effect)
            else:
                driver._answer(effect)
        elif isinstance(output, Effect):
            driver._pending.append(output)
    _pull_all(core)

    def build() -> tuple[object, int]:
        for index in range(count):
            core.inject(user(f"x{index}", f"context {index}", kind="plugin"))
            _pull_all(core)
        assert core.pending_context == count
        return core, count
    return _retained(build)


def _pull_all(core: AgentCore) -> None:
    while core.next_output() is not None:
        pass


HEADERS = ["what", "items", "bytes retained", "bytes/item", "µs/item (under tracemalloc)"]


def run(quick: bool = False) -> Section:
    started = time.perf_counter()
    scale = 100 if quick else 1
    rows: list[list[str]] = []
    figures: dict[str, list[float]] = {}

    def add(label: str, key: str, result: tuple[int, int, float]) -> None:
        size, items, seconds = result
        rows.append([label, f"{items:,}", f"{size:,}", f"{size / items:,.0f}",
                     f"{1e6 * seconds / items:.1f}"])
        figures.setdefault(key, []).append(size / items)

    for workload in WORKLOADS:
        for turns in (500, 2_000, 8_000):
            n = max(2, turns // scale)
            add(f"durable events, {workload} ({n:,} turns)", f"event/{workload}",
                durable_events(workload, n))
    for count in (25_000, 50_000, 100_000):
        add("queued prompts (inbox)", "queued", queued_prompts(max(2, count // scale)))
    for count in (2_500, 5_000, 10_000):
        add("staged contexts (outbox)", "staged", staged_items(max(2, count // scale)))
    section = Section("7. Memory", HEADERS, rows)
    section.figures = figures
    spread = {key: max(v) / min(v) for key, v in figures.items()}
    section.notes.append(
        "Bytes are `tracemalloc` deltas after a full collection: everything the core keeps "
        "alive. A durable event's bytes include its compact record in the session log (its "
        "data as exact JSON text, specs/log.md L1) and, for message events, the derived "
        "history's `Message` — the session log is in memory.")
    section.notes.append(
        "Linearity: the largest ÷ smallest bytes/item across the three sizes is "
        + ", ".join(f"{key} {value:.2f}" for key, value in spread.items())
        + " (1.00 is perfectly linear). The queued prompts and staged contexts each carry a "
        "distinct text ('prompt N' / 'context N'); the held turn's own state is outside the delta.")
    section.seconds = time.perf_counter() - started
    return section
