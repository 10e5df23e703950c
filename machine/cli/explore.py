"""``turnstile explore``: explore the configurations of `machine.checking.search` and report
each one's reach, as text or as JSON (`result_json`)."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Any

from machine.checking.search import CONFIGURATIONS, ExploreResult
from machine.cli.terminal import ProgressBar, progress_bar
from machine.jsonvalue import JsonLike


def main_explore(depth: int | None = None, *, configuration: str = "idle",
                 commands: Sequence[str] | None = None, with_model: bool = False,
                 budget_seconds: float | None = None, quiet: bool = False,
                 as_json: bool = False) -> int:
    """``turnstile explore``: explore one configuration (or ``all``) and report its reach;
    returns an exit code (0 ok, 1 violation). With *as_json* the report is one JSON object
    per configuration on standard output (`result_json`)."""

    from machine.checking.reach import FAMILIES
    names = list(CONFIGURATIONS) if configuration == "all" else [configuration]
    reached: set[str] = set()
    for name in names:
        chosen = CONFIGURATIONS[name]
        run_depth = chosen.ci_depth if depth is None else depth
        options: dict[str, Any] = {} if commands is None else {"commands": tuple(commands)}
        explorer = chosen.explorer(with_model=with_model, **options)

        # A bar on standard error when it is a terminal, nothing when it is not (RT27).
        bar = progress_bar(f"{name} depth {run_depth}", enabled=False if quiet else None)

        def progress(states: int, frontier: int, seconds: float,
                     bar: ProgressBar = bar) -> None:
            bar.update(states, text=f"{states:,} states, frontier {frontier:,}, "
                                    f"{states / seconds:,.0f} states/s")

        logger = logging.getLogger("turnstile")
        level = logger.level
        logger.setLevel(logging.ERROR)  # the explored failures' own warnings are expected
        try:
            with bar:
                result = explorer.run(run_depth, progress=progress,
                                      budget_seconds=budget_seconds)
        finally:
            logger.setLevel(level)
        budget_reached = not result.exhausted
        if as_json:
            print(json.dumps(result_json(result, commands=list(explorer.commands),
                                         with_model=with_model, budget_reached=budget_reached,
                                         configuration=name), ensure_ascii=False))
        else:
            print(f"{name} depth {run_depth}: {result.states} states, {result.transitions} "
                  f"transitions in {result.seconds:.1f} s "
                  f"({result.states_per_second:,.0f} states/s)"
                  + (" [budget reached]" if budget_reached else ""))
            print(f"  rule families reached: "
                  f"{', '.join(f for f in FAMILIES if f in result.families)}")
            rows = sorted({row for row, _ in result.cells})
            print(f"  commands issued at R19 rows: {', '.join(map(str, rows))}")
        reached |= result.families
        if result.failure is not None:
            if not as_json:
                print(f"VIOLATION: {result.failure}")
                print("shortest reproducing sequence (inputs with the outputs pulled before "
                      "them):")
                for step in result.failure.steps:
                    print(" ", json.dumps(step))
            return 1
    missing = [f for f in FAMILIES if f not in reached]
    if missing and not as_json:
        print(f"rule families not reached: {', '.join(missing)}")
    if not as_json:
        print("no violation")
    return 0


def result_json(result: ExploreResult, *, commands: Sequence[str], with_model: bool,
                budget_reached: bool, configuration: str = "idle") -> dict[str, JsonLike]:
    """An exploration's result as JSON (``turnstile explore --json``)."""
    from machine.checking.reach import FAMILIES
    failure: JsonLike = None
    if result.failure is not None:
        failure = {"message": str(result.failure), "steps": list(result.failure.steps)}
    return {"configuration": configuration, "depth": result.depth, "commands": list(commands),
            "model": with_model, "states": result.states, "transitions": result.transitions,
            "seconds": round(result.seconds, 3), "budgetReached": budget_reached,
            "families": [f for f in FAMILIES if f in result.families],
            "ok": result.failure is None, "violation": failure}

