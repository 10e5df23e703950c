"""Item 4: bounded exhaustive exploration (`machine.checking.search.classic_explorer`): states/s and the time
to exhaust depths 4..8 with the first explorer's alphabet (followup, steer, inject, cancel, and
the answer variants it had), so the figures compare across runs.

Each depth is a separate run from scratch (as ``turnstile explore --depth D`` runs it). The
explorer makes each state by copying its parent's and applying one decision (R4.12). A
second table compares that with replaying every decision sequence from a fresh core (as
the explorer did before the core's state was explicit), in the same run, and a third runs
two searches with the explorer of `BASE` (the commit before that work, its files taken from
git) and with this one, each in a fresh process: the before and after. A depth whose run
would not fit the time budget is stopped at the budget and reported as *not exhausted*,
with the states it reached and an estimate of the time it would take (from the growth of
the previous depths) — an estimate, marked as such.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import Section
from machine.checking.search import CONFIGURATIONS, Explorer, classic_explorer

FULL_DEPTHS = (4, 5, 6, 7, 8)
QUICK_DEPTHS = (2, 3)
#: Seconds one depth may take inside ``make bench`` (``python -m bench.run --explore-budget``).
DEFAULT_BUDGET = 420.0  # depth 8 exhausts in about 3 minutes on an idle 2-core machine

HEADERS = ["depth", "states", "transitions", "seconds", "states/s", "exhausted"]


def run(quick: bool = False, budget: float | None = None,
        depths: tuple[int, ...] | None = None) -> Section:
    started = time.perf_counter()
    # The explored failures' own warnings are expected (as `turnstile explore` quiets them).
    logging.getLogger("turnstile").setLevel(logging.ERROR)
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
    comparison = _copies_against_replay(quick)
    section.tables.append((
        "Copying states against replaying them (same explorer, same run; CPU seconds):",
        ["search", "depth", "states", "replay: s", "copy: s", "replay states/s",
         "copy states/s", "copy ÷ replay"], comparison["rows"]))
    figures["copy_vs_replay"] = comparison["figures"]
    against = _against_base(quick)
    if against["rows"]:
        section.tables.append((
            f"This explorer against the one of {BASE} (before the core's state was explicit: "
            "it replayed every state from the root and walked generator frames for its key), "
            "the same searches in the same run, each in a fresh process (CPU seconds):",
            ["search", "depth", f"states ({BASE})", "states (now)", f"CPU s ({BASE})",
             "CPU s (now)", f"states/s ({BASE})", "states/s (now)", "now ÷ before"],
            against["rows"]))
    else:
        notes.append(f"The comparison with {BASE} was not run: {against['why']}.")
    figures["against_base"] = against["figures"]
    floor = _implementation_floor(quick)
    section.tables.append((
        "What the implementations' own work costs per state: the CPU time spent inside the "
        "machine's and the model's `feed` and `next_output` (running them) and `copy` (the "
        "copy each state is made from) during a search, the work an explorer that copies "
        "states must do for the states and transitions it explores, however it keys and "
        "checks them; against the whole search. The ceiling is the states/s of an explorer "
        "whose keys, checks and bookkeeping cost nothing; the issue's target, 20 × "
        f"{ISSUE_BASELINE:,} states/s, needs {1e6 / (20 * ISSUE_BASELINE):.0f} µs per state:",
        ["search", "depth", "states", "transitions", "search µs/state", "running µs/state",
         "copying µs/state", "their share", "ceiling states/s",
         f"ceiling ÷ {ISSUE_BASELINE:,}"], floor["rows"]))
    figures["implementation_floor"] = floor["figures"]
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


def _copies_against_replay(quick: bool) -> dict[str, Any]:
    """The classic search (machine only) and the idle configuration with the reference
    model compared, each exhausted once by copying states and once by replaying them."""
    def classic(copy: bool) -> Explorer:
        return classic_explorer(copy_states=copy)

    def idle_with_model(copy: bool) -> Explorer:
        return CONFIGURATIONS["idle"].explorer(copy_states=copy)

    cases: tuple[tuple[str, int, Callable[[bool], Explorer]], ...] = (
        ("classic, machine only", 3 if quick else 6, classic),
        ("idle, with the model", 2 if quick else 5, idle_with_model))
    rows: list[list[str]] = []
    figures: dict[str, dict[str, float]] = {}
    for name, depth, make in cases:
        measured: dict[bool, tuple[int, float]] = {}
        for copy in (False, True):
            started = time.process_time()
            result = make(copy).run(depth)
            if result.failure is not None:
                raise AssertionError(f"exploration found a violation: {result.failure}")
            measured[copy] = (result.states, time.process_time() - started)
        (states, replay), (copied_states, copy_s) = measured[False], measured[True]
        assert states == copied_states, "copying and replaying reach the same states"
        rows.append([name, str(depth), f"{states:,}", f"{replay:.1f}", f"{copy_s:.1f}",
                     f"{states / replay:,.0f}", f"{states / copy_s:,.0f}",
                     f"× {replay / copy_s:.2f}"])
        figures[name] = {"depth": depth, "states": states, "replay_s": replay,
                         "copy_s": copy_s}
    return {"rows": rows, "figures": figures}


#: The commit before the explorer copied states (issue 17): the "before" of the comparison.
BASE = "9cf93fe"
#: The states/s of the classic search at depth 8 when issue 17 was filed (replaying states).
ISSUE_BASELINE = 1415


def _implementation_floor(quick: bool) -> dict[str, Any]:
    """The classic search (machine only) and the idle configuration with the model, run once
    with the implementations' `feed` and `next_output` (running them) and `copy` (the copy
    each state is made from, R4.12) timed, outermost calls only. The timer's whole cost per
    call is taken off, part of which falls outside what it times, so the implementations'
    time errs low and the ceiling errs high."""
    from machine.core import AgentCore
    model_class = importlib.import_module("machine._model").ModelAgent
    spent = {"run": [0, 0], "copy": [0, 0]}     # nanoseconds inside, timed calls
    inside = [False]

    def timed(method: Callable[..., Any], account: list[int]) -> Callable[..., Any]:
        def wrapper(self: object, *args: Any) -> Any:
            if inside[0]:
                return method(self, *args)
            inside[0] = True
            start = time.perf_counter_ns()
            try:
                return method(self, *args)
            finally:
                account[0] += time.perf_counter_ns() - start
                account[1] += 1
                inside[0] = False
        return wrapper

    overhead = _timer_cost(timed)
    # (class, method name, account, the method, whether the class defines it itself)
    patched = [(owner, name, spent["copy" if name == "copy" else "run"], getattr(owner, name),
                name in owner.__dict__)
               for owner in (AgentCore, model_class) for name in ("feed", "next_output", "copy")]
    cases: tuple[tuple[str, int, Callable[[], Explorer]], ...] = (
        ("classic, machine only", 4 if quick else 6, classic_explorer),
        ("idle, with the model", 2 if quick else 4, CONFIGURATIONS["idle"].explorer))
    rows: list[list[str]] = []
    figures: dict[str, dict[str, float]] = {}
    for name, depth, make in cases:
        explorer = make()
        for account in spent.values():
            account[0] = account[1] = 0
        for owner, method_name, account, method, _own in patched:
            setattr(owner, method_name, timed(method, account))
        try:
            started = time.process_time()
            result = explorer.run(depth)
            total = time.process_time() - started
        finally:
            for owner, method_name, _account, method, own in patched:
                if own:
                    setattr(owner, method_name, method)
                else:
                    delattr(owner, method_name)
        if result.failure is not None:
            raise AssertionError(f"exploration found a violation: {result.failure}")
        seconds = {kind: max(ns / 1e9 - calls * overhead, 0.0)
                   for kind, (ns, calls) in spent.items()}
        run_us, copy_us = (seconds[kind] / result.states * 1e6 for kind in ("run", "copy"))
        floor_us = run_us + copy_us
        rows.append([name, str(depth), f"{result.states:,}", f"{result.transitions:,}",
                     f"{total / result.states * 1e6:.0f}", f"{run_us:.0f}", f"{copy_us:.0f}",
                     f"{floor_us * result.states / 1e6 / total:.0%}", f"{1e6 / floor_us:,.0f}",
                     f"× {1e6 / floor_us / ISSUE_BASELINE:.1f}"])
        figures[name] = {"depth": depth, "states": result.states, "cpu_s": total,
                         "run_s": seconds["run"], "copy_s": seconds["copy"],
                         "timed_calls": spent["run"][1] + spent["copy"][1]}
    return {"rows": rows, "figures": figures}


def _timer_cost(timed: Callable[[Callable[..., Any], list[int]], Callable[..., Any]]) -> float:
    """Seconds a timed call adds to what it times (the median of five measures)."""
    class Probe:
        def call(self) -> None:
            return None
    plain, wrapped = Probe.call, timed(Probe.call, [0, 0])
    probe, count, samples = Probe(), 20_000, []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(count):
            wrapped(probe)
        middle = time.perf_counter()
        for _ in range(count):
            plain(probe)
        samples.append(((middle - start) - (time.perf_counter() - middle)) / count)
    return sorted(samples)[2]

_MEASURE = """
import json, logging, sys, time
logging.getLogger("turnstile").setLevel(logging.ERROR)
try:
    from machine.checking.search import CONFIGURATIONS, classic_explorer
except ImportError:     # a base from before the package was laid out by role (issue 32)
    from machine.explore import CONFIGURATIONS, classic_explorer
search, depth = sys.argv[1], int(sys.argv[2])
explorer = classic_explorer() if search == "classic" else CONFIGURATIONS["idle"].explorer()
started = time.process_time()
result = explorer.run(depth)
print(json.dumps({"states": result.states, "cpu": time.process_time() - started,
                  "ok": result.failure is None}))
"""


def _against_base(quick: bool) -> dict[str, Any]:
    """The classic search and the idle configuration with the model, run by the explorer of
    `BASE` (its files taken from git into a temporary folder) and by this one, each in a
    fresh process, one after the other."""
    root = Path(__file__).resolve().parent.parent
    rows: list[list[str]] = []
    figures: dict[str, dict[str, float]] = {}
    # Why an empty working folder: `python -c` puts it first on the import path.
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as empty:
        archive = subprocess.run(["git", "-C", str(root), "archive", BASE, "machine", "model"],
                                 capture_output=True, check=False)
        if archive.returncode != 0:
            return {"rows": [], "figures": {}, "why": "git archive " + BASE + " failed: "
                    + archive.stderr.decode(errors="replace").strip()}
        subprocess.run(["tar", "-x", "-C", folder], input=archive.stdout, check=True)
        # The base imports its reference model as machine._model, as its installation maps it.
        (Path(folder) / "machine" / "_model").symlink_to(Path(folder) / "model")
        cases = (("classic, machine only", "classic", 4 if quick else 6),
                 ("idle, with the model", "idle", 2 if quick else 4))
        for name, search, depth in cases:
            measured = {}
            for label, path in (("before", folder), ("now", str(root))):
                environment = {**os.environ, "PYTHONPATH": path}
                completed = subprocess.run(
                    [sys.executable, "-c", _MEASURE, search, str(depth)], env=environment,
                    capture_output=True, text=True, check=True, cwd=empty)
                measured[label] = json.loads(completed.stdout.strip().splitlines()[-1])
                if not measured[label]["ok"]:
                    raise AssertionError(f"the {label} explorer found a violation")
            before, now = measured["before"], measured["now"]
            rows.append([name, str(depth), f"{before['states']:,}", f"{now['states']:,}",
                         f"{before['cpu']:.1f}", f"{now['cpu']:.1f}",
                         f"{before['states'] / before['cpu']:,.0f}",
                         f"{now['states'] / now['cpu']:,.0f}",
                         f"× {(now['states'] / now['cpu']) / (before['states'] / before['cpu']):.2f}"])
            figures[name] = {"depth": depth, "states_before": before["states"],
                             "states_now": now["states"], "cpu_before": before["cpu"],
                             "cpu_now": now["cpu"]}
    return {"rows": rows, "figures": figures, "why": ""}


def _estimate(previous: list[tuple[int, float]]) -> tuple[float, float] | None:
    if len(previous) < 2:
        return None
    (s1, t1), (s2, t2) = previous[-2], previous[-1]
    growth = s2 / s1
    per_state_growth = (t2 / s2) / (t1 / s1)
    states = s2 * growth
    return states, states * (t2 / s2) * per_state_growth
