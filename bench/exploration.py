"""Item 4: bounded exhaustive exploration (`machine.explore.classic_explorer`): states/s and the time
to exhaust depths 4..8 with the first explorer's alphabet (followup, steer, inject, cancel, and
the answer variants it had), so the figures compare across runs.

Each depth is a separate run from scratch (as ``turnstile explore --depth D`` runs it). The
explorer replays every decision sequence from a fresh core, so states/s falls as the
sequences get longer. A depth whose run would not fit the time budget is stopped at the
budget and reported as *not exhausted*, with the states it reached and an estimate of the
time it would take (from the growth of the previous depths) — an estimate, marked as such.
"""

from __future__ import annotations

import time

from bench.common import Section
from machine.explore import classic_explorer

FULL_DEPTHS = (4, 5, 6, 7, 8)
QUICK_DEPTHS = (2, 3)
#: Seconds one depth may take inside ``make bench`` (``python -m bench.run --explore-budget``).
DEFAULT_BUDGET = 420.0  # depth 8 exhausts in about 3 minutes on an idle 2-core machine

HEADERS = ["depth", "states", "transitions", "seconds", "states/s", "exhausted"]


def run(quick: bool = False, budget: float | None = None,
        depths: tuple[int, ...] | None = None) -> Section:
    started = time.perf_counter()
    depths = depths or (QUICK_DEPTHS if quick else FULL_DEPTHS)
    budget = budget if budget is not None else (30.0 if quick else DEFAULT_BUDGET)
    limit = budget if budget > 0 else None      # 0: no budget, exhaust every depth
    rows: list[list[str]] = []
    figures: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    previous: list[tuple[int, float]] = []      # (states, seconds) of exhausted depths
    for depth in depths:
        result = classic_explorer().run(depth, budget_seconds=limit)
        if result.failure is not None:
            raise AssertionError(f"exploration found a violation at depth {depth}: "
                                 f"{result.failure}")
        exhausted = limit is None or result.seconds <= limit
        seconds = f"{result.seconds:.1f}"
        if not exhausted:
            estimate = _estimate(previous)
            if estimate is not None:
                states, secs = estimate
                seconds = f"> {budget:.0f} (est. {secs / 60:.0f} min for ~{states:,.0f} states)"
                notes.append(
                    f"Depth {depth} was stopped at the {budget:.0f} s budget after "
                    f"{result.states:,} states. The estimate extrapolates the growth of states "
                    "and of seconds per state from the two previous depths; run "
                    f"`python -m bench.run --only explore --explore-budget 0` to exhaust it.")
        rows.append([str(depth), f"{result.states:,}", f"{result.transitions:,}", seconds,
                     f"{result.states_per_second:,.0f}", "yes" if exhausted else "no"])
        figures[str(depth)] = {"states": result.states, "seconds": result.seconds,
                          "states_per_s": result.states_per_second, "exhausted": exhausted}
        if exhausted:
            previous.append((result.states, result.seconds))
    section = Section("4. Exploration", HEADERS, rows)
    section.figures = figures
    section.notes.append(
        "`classic_explorer().run(depth)`: the first explorer's alphabet, kept so that the "
        "figures compare across runs (commands followup, steer, inject, cancel; no "
        "macro-decisions; the answer variants it had: text, call and failure for the model; "
        "runtime invariants checked at every state). Each depth is a "
        "fresh run; the time is the time to exhaust that depth.")
    section.notes.extend(notes)
    section.seconds = time.perf_counter() - started
    return section


def _estimate(previous: list[tuple[int, float]]) -> tuple[float, float] | None:
    if len(previous) < 2:
        return None
    (s1, t1), (s2, t2) = previous[-2], previous[-1]
    growth = s2 / s1
    per_state_growth = (t2 / s2) / (t1 / s1)
    states = s2 * growth
    return states, states * (t2 / s2) * per_state_growth
