"""Smoke test of the benchmark harness (issue #8, ``make bench``): it runs end to end with tiny
sizes and writes a report with every section. No timing is asserted: the figures of a quick
run mean nothing."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import dispatch, workloads  # noqa: E402
from bench import run as bench_run  # noqa: E402

SECTIONS = ("## Machine", "## Summary", "## 1. Core throughput", "## 2. The same workloads",
            "## 3. Per-transition dispatch cost", "## 4. Exploration", "## 5. Oracle speed",
            "## 6. Session stores", "## 7. Memory", "## 8. Memory of a session load",
            "## 10. Provider requests", "## 11. A turn beside the peers")


def test_a_quick_run_writes_every_section(tmp_path: Path) -> None:
    from machine.core import AgentCore
    timed = ("feed", "next_output", "copy")
    methods = {name: getattr(AgentCore, name) for name in timed}
    own = set(vars(AgentCore))
    out = tmp_path / "BENCHMARKS.md"
    assert bench_run.main(["--quick", "--in-process", "--out", str(out)]) == 0
    # The floor table times the implementations' methods, and puts them back.
    assert {name: getattr(AgentCore, name) for name in timed} == methods
    assert set(vars(AgentCore)) == own
    text = out.read_text(encoding="utf-8")
    for title in SECTIONS:
        assert title in text, title
    assert "QUICK RUN" in text
    assert "Python" in text and "load average" in text
    # The exploration compares itself with the explorer before issue 17, or says why not.
    assert "before the core's state was explicit" in text or "was not run" in text
    assert "What the implementations' own work costs per state" in text
    assert "ceiling if keys and checks cost nothing" in text
    # Provider requests: through each adapter, and against the adapters before issue 27
    assert "| OpenAIChat |" in text and "| AnthropicMessages at 1d2aea6 |" in text
    # A whole turn: turnstile's own agent always, each peer's or the reason it was not run
    assert "| turnstile Agent + OpenAIChat |" in text
    for peer in ("pydantic-ai Agent + OpenAIChatModel",
                 "OpenAI Agents SDK + OpenAIChatCompletionsModel"):
        assert f"{peer}: " in text or f"| {peer} | —" not in text, peer


def test_an_item_runs_in_its_own_process(tmp_path: Path) -> None:
    out = tmp_path / "dispatch.md"
    assert bench_run.main(["--quick", "--only", "dispatch", "--out", str(out)]) == 0
    assert "## 3. Per-transition dispatch cost" in out.read_text(encoding="utf-8")


def test_each_dispatch_walk_is_closed_and_fires_every_declared_row() -> None:
    for module, walk in dispatch.WALKS.values():
        dispatch.check_walk(module, walk)


def test_the_lean_driver_counts_every_durable_event_of_each_workload() -> None:
    for workload in workloads.WORKLOADS:
        driver = workloads.LeanDriver(workload)
        driver.run(3)
        assert driver.turns == 3
        assert driver.durable == len(driver.core.log) > 0
        assert driver.core.is_quiescent
