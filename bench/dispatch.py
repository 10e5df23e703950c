"""Item 3: per-transition dispatch cost of each machine.

Each machine is driven around a closed walk that fires every row of its
declaration at least once (guards given as the values the caller computes).
The same walk is timed three ways, interleaved in one run:

* **plain dict**: ``state = PLAIN[(state, trigger, guard values)]`` — one dict
  lookup per transition, the floor for any table dispatch;
* **compiled table**: ``table.step(TABLE, NAME, state, trigger, guards)``, what
  the core runs (a dict lookup plus guard evaluation and error handling);
* **declared Machine**: the ``transitions.Machine`` built by ``declared()``,
  triggered by name on a model whose guard attributes are set first.

The walk's loop overhead is in every figure alike; the empty loop is shown too.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType, SimpleNamespace
from typing import Any

from bench.common import Section
from machine.machines import inbox, lifecycle, outbox, window
from machine.machines.table import declared_machine, step

Guards = Mapping[str, bool] | None
Walk = list[tuple[str, Guards]]


def _g(**values: bool) -> dict[str, bool]:
    return values


INBOX_G = ("rest_empty", "rest_has_waking")
OUTBOX_G = ("rest_empty", "rest_has_steering")

WALKS: dict[str, tuple[ModuleType, Walk]] = {
    "window": (window, [("claim", None), ("start_run", None), ("end_run", None),
                        ("claim", None), ("reject", None), ("start_run", None),
                        ("end_run", None)]),
    "inbox": (inbox, [
        ("enqueue_quiet", None), ("enqueue_quiet", None), ("enqueue_waking", None),
        ("enqueue_quiet", None), ("enqueue_waking", None),
        ("claim", _g(rest_empty=False, rest_has_waking=True)),
        ("claim", _g(rest_empty=False, rest_has_waking=False)),
        ("discard", None), ("enqueue_waking", None),
        ("claim", _g(rest_empty=True, rest_has_waking=False)),
        ("discard", None), ("enqueue_waking", None), ("discard", None)]),
    "outbox": (outbox, [
        ("stage_context", None), ("stage_context", None),
        ("take", _g(rest_empty=False, rest_has_steering=False)),
        ("take", _g(rest_empty=True, rest_has_steering=False)),
        ("stage_steering", None), ("stage_context", None), ("stage_steering", None),
        ("take", _g(rest_empty=False, rest_has_steering=True)),
        ("take", _g(rest_empty=False, rest_has_steering=False)),
        ("stage_steering", None),
        ("take", _g(rest_empty=True, rest_has_steering=False)),
        ("clear", None), ("stage_context", None), ("clear", None),
        ("stage_steering", None), ("clear", None)]),
    "lifecycle": (lifecycle, [(t, None) for t in (  # noqa: SIM905 - a readable walk
        "request_wake wake_empty "
        "request_wake claim reject go_idle "
        "request_wake claim reject claim admit close flush claim admit "
        "begin_step close flush retry "
        "begin_step assemble close flush retry "
        "begin_step assemble request close flush retry "
        "begin_step assemble request stream close flush retry "
        "begin_step assemble request stream run_tools close flush retry "
        "begin_step assemble request stream end_step close flush retry "
        "begin_step assemble request stream run_tools end_step stop_turn close flush retry "
        "begin_step assemble request stream request_failed close flush retry "
        "begin_step assemble request stream run_tools end_step "
        "begin_step assemble request stream end_step stop_turn "
        "begin_step assemble request stream end_step stop_turn close flush go_idle").split()]),
}


def _key(guards: Guards) -> tuple[bool, ...]:
    return () if guards is None else tuple(guards.values())


def check_walk(module: ModuleType, walk: Walk) -> dict[tuple[str, str, tuple[bool, ...]], str]:
    """Walk once through the compiled table (raises if illegal); the plain dict it implies.

    Also checks that the walk is closed and fires every declared row."""
    state = module.INITIAL
    plain: dict[tuple[str, str, tuple[bool, ...]], str] = {}
    fired: set[tuple[str, str, str]] = set()
    for trigger, guards in walk:
        dest = step(module.TABLE, module.NAME, state, trigger, guards)
        plain[(state, trigger, _key(guards))] = dest
        fired.add((trigger, state, dest))
        state = dest
    if state != module.INITIAL:
        raise AssertionError(f"{module.NAME}: the walk ends in {state!r}, not the initial state")
    rows = {(r.trigger, r.source, r.dest) for r in module.ROWS}
    if rows - fired:
        raise AssertionError(f"{module.NAME}: the walk misses rows {sorted(rows - fired)}")
    return plain


def _time(run: Callable[[int], None], loops: int, repeats: int) -> float:
    """Median seconds of *repeats* timings of ``run(loops)``."""
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        run(loops)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _runners(module: ModuleType, walk: Walk) -> dict[str, Callable[[int], None]]:
    plain = check_walk(module, walk)
    keyed = [(trigger, _key(guards)) for trigger, guards in walk]
    table, name, initial = module.TABLE, module.NAME, module.INITIAL

    def empty(loops: int) -> None:
        state = initial
        for _ in range(loops):
            for _pair in keyed:
                state = state

    def plain_dict(loops: int) -> None:
        state = initial
        for _ in range(loops):
            for trigger, key in keyed:
                state = plain[(state, trigger, key)]

    def compiled(loops: int) -> None:
        state = initial
        for _ in range(loops):
            for trigger, guards in walk:
                state = step(table, name, state, trigger, guards)

    model: Any = SimpleNamespace()
    declared_machine(module.NAME, module.STATES, module.ROWS, module.INITIAL, model=model)
    set_guards = [(getattr(model, trigger), tuple((guards or {}).items()))
                  for trigger, guards in walk]

    def declared(loops: int) -> None:
        for _ in range(loops):
            for fire, guards in set_guards:
                for guard, value in guards:
                    setattr(model, guard, value)
                fire()

    return {"empty": empty, "plain": plain_dict, "table": compiled, "declared": declared}


HEADERS = ["machine", "walk (transitions)", "empty loop ns", "plain dict ns", "compiled table ns",
           "table ÷ dict", "table ÷ dict (net of loop)", "declared Machine µs", "Machine ÷ dict"]


def run(quick: bool = False) -> Section:
    started = time.perf_counter()
    target = 20_000 if quick else 400_000       # transitions per timing (table and dict)
    declared_target = 2_000 if quick else 40_000
    repeats = 3 if quick else 7
    rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    for name, (module, walk) in WALKS.items():
        runners = _runners(module, walk)
        loops = max(1, target // len(walk))
        declared_loops = max(1, declared_target // len(walk))
        per = {kind: _time(runners[kind], loops, repeats) / (loops * len(walk))
               for kind in ("empty", "plain", "table")}
        per["declared"] = (_time(runners["declared"], declared_loops, max(3, repeats // 2))
                           / (declared_loops * len(walk)))
        net_ratio = ((per["table"] - per["empty"]) / (per["plain"] - per["empty"])
                     if per["plain"] > per["empty"] else float("nan"))
        rows.append([name, str(len(walk)), f"{per['empty'] * 1e9:.0f}",
                     f"{per['plain'] * 1e9:.0f}", f"{per['table'] * 1e9:.0f}",
                     f"× {per['table'] / per['plain']:.1f}", f"× {net_ratio:.1f}",
                     f"{per['declared'] * 1e6:.1f}", f"× {per['declared'] / per['plain']:.0f}"])
        figures[name] = {**per, "ratio": per["table"] / per["plain"], "net_ratio": net_ratio}
    section = Section("3. Per-transition dispatch cost", HEADERS, rows)
    section.figures = figures
    section.notes.append(
        "Each machine runs a closed walk that fires every declared row at least once "
        "(bench/dispatch.py checks this). *plain dict* is one lookup keyed by (state, trigger, "
        "guard values); *compiled table* is `machine.machines.table.step`, the core's hot path; "
        "*declared Machine* is the `transitions.Machine` from `declared()`, triggered by name "
        "(guard attributes set on its model first). Medians of repeated timings, one process.")
    section.notes.append(
        "The *net* ratio subtracts the walk's own loop cost (the empty loop) from both sides.")
    section.seconds = time.perf_counter() - started
    return section


def walks() -> Sequence[str]:
    return tuple(WALKS)
