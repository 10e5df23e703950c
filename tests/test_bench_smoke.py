"""Smoke test of the benchmark harness (issue #8, ``make bench``): it runs end to end with tiny
sizes and writes a report with every section. No timing is asserted: the figures of a quick
run mean nothing."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import before_after, dispatch, workloads  # noqa: E402
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
    # Without --before the before-and-after item does not run.
    assert "## 12. Before and after" not in text
    assert "before and after: CPU per unit" not in text


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


def _earlier_commit() -> str:
    """HEAD~1, or HEAD itself where the clone has no history (a shallow clone): either is a
    real commit whose files `git archive` takes."""
    def commit(rev: str) -> str | None:
        done = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", "--quiet",
                               f"{rev}^{{commit}}"], capture_output=True, text=True,
                              check=False)
        return done.stdout.strip() if done.returncode == 0 else None
    found = commit("HEAD~1") or commit("HEAD")
    if found is None:
        pytest.skip("not a git checkout: item before-after needs the repository's history")
    return found


def test_before_after_measures_an_earlier_commit_and_the_working_tree(tmp_path: Path) -> None:
    rev = _earlier_commit()
    out = tmp_path / "BENCHMARKS.md"
    # The item in its own process, as `make bench BEFORE=<rev>` runs it.
    assert bench_run.main(["--quick", "--only", "before-after", "--before", rev,
                           "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert f"## 12. Before and after: {rev} against the working tree" in text
    assert "before and after: CPU per unit, working tree against" in text
    assert "not measured" not in text
    for name in ("core W1", "core W2", "core W3", "runtime W1", "runtime W2", "runtime W3",
                 "explore classic, machine only", "explore idle, with the model"):
        assert f"| {name} |" in text, name
    assert "Load average (1/5/15 min) at the start of the item" in text


def test_before_after_imports_each_side_from_its_own_tree() -> None:
    rev = _earlier_commit()
    section = before_after.run(quick=True, before=rev)
    figures = section.figures
    assert figures["commit"] == rev and figures["rounds"] >= 3
    for side in ("before", "after"):
        tree = Path(figures["trees"][side])
        imported = figures["imports"][side]
        assert set(imported) == {"machine", "machine._model", "bench"}
        for module, location in imported.items():
            assert Path(location).is_relative_to(tree), (side, module, location)
    assert Path(figures["trees"]["after"]) == ROOT
    assert not Path(figures["trees"]["before"]).is_relative_to(ROOT)
    for name, result in figures["figures"].items():
        assert len(result["before_values"]) == len(result["after_values"]) == 3, name
        assert len(result["paired_ratios"]) == 3, name
        assert result["ratio"] > 0, name
        if name.startswith("explore"):     # both explorers count the states they reach
            assert result["before_count"] > 0 and result["after_count"] > 0


def test_before_after_needs_a_commit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        bench_run.main(["--quick", "--only", "before-after", "--out", "/dev/null"])
    assert "needs --before REV" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_run.main(["--quick", "--only", "before-after", "--before", "no-such-rev-xyz",
                        "--out", "/dev/null"])
    assert "--before no-such-rev-xyz: not a commit" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        bench_run.main(["--quick", "--only", "dispatch", "--before", "HEAD",
                        "--out", "/dev/null"])
    assert "which --only leaves out" in capsys.readouterr().err


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root


def test_before_after_finds_each_entry_point_where_the_tree_has_it(tmp_path: Path) -> None:
    # A layout with the explorer moved into a subpackage, and no bench at all.
    tree = _tree(tmp_path, {
        "machine/__init__.py": "",
        "machine/checking/__init__.py": "from machine.checking.explore import classic_explorer\n",
        "machine/checking/explore.py": "CONFIGURATIONS: dict[str, object] = {}\n"
                                       "def classic_explorer():\n    pass\n"})
    by_name = {figure.name: figure for figure in before_after.figures(quick=True)}
    assert before_after.entry_point(tree, by_name["explore classic, machine only"]) == (
        "machine.checking.explore", "")
    assert before_after.entry_point(tree, by_name["explore idle, with the model"]) == (
        "machine.checking.explore", "")
    assert before_after.entry_point(tree, by_name["core W1"]) == (
        None, "no module in bench/ defines run_sync")
    # The explorer split: its configurations in a module of their own.
    (tree / "machine" / "checking" / "explore.py").write_text(
        "def classic_explorer():\n    pass\n", encoding="utf-8")
    assert before_after.entry_point(tree, by_name["explore idle, with the model"]) == (
        None, "no module in machine/ defines CONFIGURATIONS")
    _tree(tree, {"machine/checking/configurations.py": "CONFIGURATIONS = {}\n"})
    assert before_after.entry_point(tree, by_name["explore idle, with the model"]) == (
        "machine.checking.configurations", "")


def test_before_after_reports_what_one_side_could_not_measure(tmp_path: Path) -> None:
    broken = _tree(tmp_path / "broken", {
        "machine/__init__.py": "", "bench/__init__.py": "",
        "bench/throughput.py": "def run_sync(workload, turns):\n"
                               "    raise RuntimeError('no core in this tree')\n"})
    by_name = {figure.name: figure for figure in before_after.figures(quick=True)}
    core = by_name["core W1"]
    side = before_after.Side("broken", broken, modules={core.name: "bench.throughput"})
    with tempfile.TemporaryDirectory() as empty:
        side.measure([core], empty)
    assert side.why_not == {core.name: "bench.throughput: RuntimeError: no core in this tree"}
    assert Path(side.imports["machine"]).is_relative_to(broken)
    # An explorer whose configurations lack the one measured.
    _tree(broken, {"machine/explore.py": "CONFIGURATIONS = {'busy': None}\n"})
    idle = by_name["explore idle, with the model"]
    side.modules[idle.name] = "machine.explore"
    with tempfile.TemporaryDirectory() as empty:
        side.measure([idle], empty)
    assert side.why_not[idle.name] == ("machine.explore: LookupError: machine.explore."
                                       "CONFIGURATIONS has no 'idle' (it has 'busy')")
    del side.why_not[idle.name]
    # A tree without a machine package would import the installed one: refused.
    no_machine = _tree(tmp_path / "no-machine", {"bench/__init__.py": ""})
    other = before_after.Side("no machine", no_machine, modules={core.name: "bench.throughput"})
    with tempfile.TemporaryDirectory() as empty:
        other.measure([core], empty)
    assert other.why_not[core.name].startswith("its process failed: ImportError: machine was "
                                               "imported from ")
    # The report names the side, the figure and the reason; the summary says not measured.
    after = before_after.Side("after", ROOT, modules={core.name: "bench.throughput"},
                              runs={core.name: [(0.001, 100)] * 3})
    section = before_after.report("REV", "0" * 40, [core], (side, after), rounds=3,
                                  quick=True, archived=["machine", "bench"],
                                  loads=("1.00", "2.00"))
    text = section.markdown()
    assert "| core W1 | 30 turns | µs/event | not measured | 10.0 (10.0–10.0) | – | – |" in text
    assert ("**core W1** was not measured on the before side (broken): bench.throughput: "
            "RuntimeError: no core in this tree.") in text
    assert before_after.summary(section.figures) == "core W1 not measured (load 1.00 → 2.00)"
