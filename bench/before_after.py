"""Item before-after (``make bench BEFORE=<rev>``, ``python -m bench.run --before REV``): an
earlier commit and the working tree measured in the same run on the same machine.

The figures: core throughput W1-W3 (CPU µs per durable event at 10,000 turns, item 1's
``run_sync``), the asyncio runtime W1-W3 (CPU µs per turn at 10,000 turns, item 2's
``run_async``) and exploration states/s (CPU time) for the classic configuration, machine
only, and for the idle configuration with the reference model, each at a fixed depth (6 and 5;
17,459 and 29,476 states at d28df36).

REV's files (``machine``, ``model``, ``bench``) are taken with ``git archive`` into a
temporary folder, and each side is measured by ITS OWN entry points: the module of that tree
that defines ``run_sync``, ``run_async``, ``classic_explorer`` or ``CONFIGURATIONS`` is found
by reading the tree (the layout may differ between REV and now), and imported in a fresh
interpreter with that tree first on ``PYTHONPATH`` (bench/before_after_child.py checks that
``machine``, ``machine._model`` and ``bench`` are that tree's, not the editable install's).
A figure one side cannot measure (no entry point, an import or run that fails) is reported
as not measured, with the reason. The sides alternate, before then after, for each figure
(one process each) in each of at least three rounds, so a drift in the machine's speed falls
on both; each cell is the median of the rounds with their range, and the ratio after ÷
before is given from the medians and, round by round, as a range.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common import Section, load_text

ROOT = Path(__file__).resolve().parents[1]
CHILD = Path(__file__).resolve().parent / "before_after_child.py"
#: What ``git archive`` takes from REV (the ones REV has).
ARCHIVED = ("machine", "model", "bench")
ROUNDS = 3
CORE_TURNS, QUICK_TURNS = 10_000, 30
CLASSIC_DEPTH, QUICK_CLASSIC_DEPTH = 6, 3
MODEL_CONFIGURATION = "idle"
MODEL_DEPTH, QUICK_MODEL_DEPTH = 5, 2

#: Loads this file under a name of its own and runs it (argv: the child file, tree, measures).
_LAUNCH = ("import importlib.util, sys\n"
           "spec = importlib.util.spec_from_file_location('turnstile_bench_side', sys.argv[1])\n"
           "module = importlib.util.module_from_spec(spec)\n"
           "spec.loader.exec_module(module)\n"
           "raise SystemExit(module.main(sys.argv[2:]))\n")


class BeforeAfterError(Exception):
    """The revision to compare with cannot be used (not a commit, no git, no archive)."""


@dataclass(frozen=True)
class Figure:
    """One measured figure: *kind* says how the child runs it, *entry* the package (folder)
    and the top-level name its entry point is looked for by (`entry_point`)."""

    name: str
    kind: str                   # core, runtime or explore
    unit: str                   # "µs/event", "µs/turn" or "states/s"
    entry: tuple[str, str]
    parameters: dict[str, Any]

    @property
    def higher_is_faster(self) -> bool:
        return self.unit == "states/s"

    def value(self, cpu_s: float, count: int) -> float:
        """The figure from a run's CPU seconds and its count (events, turns or states)."""
        return count / cpu_s if self.higher_is_faster else 1e6 * cpu_s / count


def figures(quick: bool) -> list[Figure]:
    turns = QUICK_TURNS if quick else CORE_TURNS
    listed = [Figure(f"core {w}", "core", "µs/event", ("bench", "run_sync"),
                     {"workload": w, "turns": turns}) for w in ("W1", "W2", "W3")]
    listed += [Figure(f"runtime {w}", "runtime", "µs/turn", ("bench", "run_async"),
                      {"workload": w, "turns": turns}) for w in ("W1", "W2", "W3")]
    listed.append(Figure("explore classic, machine only", "explore", "states/s",
                         ("machine", "classic_explorer"),
                         {"search": "classic",
                          "depth": QUICK_CLASSIC_DEPTH if quick else CLASSIC_DEPTH}))
    listed.append(Figure(f"explore {MODEL_CONFIGURATION}, with the model", "explore",
                         "states/s", ("machine", "CONFIGURATIONS"),
                         {"search": MODEL_CONFIGURATION,
                          "depth": QUICK_MODEL_DEPTH if quick else MODEL_DEPTH}))
    return listed


def locate(tree: Path, package: str, name: str) -> str | None:
    """The module of *tree*'s *package* that defines *name* at its top level (a function or
    an assignment), the shallowest if several do; None if none does."""
    pattern = re.compile(rf"^(def {re.escape(name)}\(|{re.escape(name)}\s*[:=])", re.MULTILINE)
    found: list[str] = []
    base = tree / package
    if not base.is_dir():
        return None
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" in path.parts or not pattern.search(path.read_text(encoding="utf-8")):
            continue
        parts = list(path.relative_to(tree).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found.append(".".join(parts))
    return min(found, key=lambda module: (module.count("."), module)) if found else None


def entry_point(tree: Path, figure: Figure) -> tuple[str | None, str]:
    """The module that holds *figure*'s entry point in *tree*, or None and why not."""
    package, name = figure.entry
    module = locate(tree, package, name)
    if module is None:
        return None, f"no module in {package}/ defines {name}"
    return module, ""


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, check=False)
    except OSError as error:
        raise BeforeAfterError(f"git cannot be run: {error}") from error


def resolve_revision(rev: str) -> str:
    """REV's full commit hash; BeforeAfterError naming REV if it is not a commit here."""
    if not rev or rev.startswith("-"):
        raise BeforeAfterError(f"--before needs a git revision, not {rev!r}")
    done = _git("rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    if done.returncode != 0:
        raise BeforeAfterError(f"--before {rev}: not a commit of the repository at {ROOT}")
    return done.stdout.decode().strip()


def extract(commit: str, folder: Path) -> list[str]:
    """REV's ``machine``, ``model`` and ``bench`` into *folder*; the ones it has."""
    listed = _git("ls-tree", "--name-only", commit)
    present = [name for name in ARCHIVED
               if name in listed.stdout.decode().split("\n")]
    if not present:
        raise BeforeAfterError(f"{commit[:12]} has none of {', '.join(ARCHIVED)}")
    archive = _git("archive", commit, *present)
    if archive.returncode != 0:
        raise BeforeAfterError(f"git archive {commit[:12]} failed: "
                               + archive.stderr.decode(errors="replace").strip())
    subprocess.run(["tar", "-x", "-C", str(folder)], input=archive.stdout, check=True)
    return present


@dataclass
class Side:
    """One side: its tree, its label, and what each figure measured there."""

    label: str
    tree: Path
    modules: dict[str, str] = field(default_factory=dict)       # figure -> module
    why_not: dict[str, str] = field(default_factory=dict)       # figure -> reason
    runs: dict[str, list[tuple[float, int]]] = field(default_factory=dict)  # (cpu s, count)
    imports: dict[str, str] = field(default_factory=dict)      # module -> file it came from

    def measure(self, group: list[Figure], folder: str) -> None:
        """Run *group*'s figures that this side can still measure, in one fresh process."""
        specs = [{"figure": f.name, "kind": f.kind, "module": self.modules[f.name],
                  **f.parameters} for f in group
                 if f.name in self.modules and f.name not in self.why_not]
        if not specs:
            return
        environment = {**os.environ, "PYTHONPATH": str(self.tree)}
        # The empty working folder: `python -c` puts it first on the import path.
        done = subprocess.run([sys.executable, "-c", _LAUNCH, str(CHILD), str(self.tree),
                               json.dumps(specs)], env=environment, cwd=folder,
                              capture_output=True, text=True, check=False)
        lines = {}
        for line in done.stdout.splitlines():
            if line.startswith("{"):
                value = json.loads(line)
                if "imports" in value:
                    self.imports.update(value["imports"])
                else:
                    lines[value["figure"]] = value
        failure = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        for spec in specs:
            name = str(spec["figure"])
            result = lines.get(name)
            if result is None:
                self.why_not[name] = f"its process failed: {failure}"
            elif "error" in result:
                self.why_not[name] = f"{self.modules[name]}: {result['error']}"
            else:
                self.runs.setdefault(name, []).append((float(result["cpu_s"]),
                                                       int(result["count"])))


def _stat(values: list[float], spec: str) -> str:
    return (f"{statistics.median(values):{spec}} ({min(values):{spec}}–{max(values):{spec}})"
            if len(values) > 1 else format(values[0], spec))


def run(quick: bool = False, before: str | None = None, rounds: int = ROUNDS) -> Section:
    if before is None:
        raise BeforeAfterError("the item before-after needs --before REV (make bench BEFORE=REV)")
    if rounds < 3:
        raise ValueError(f"rounds must be at least 3, not {rounds}")
    started = time.perf_counter()
    load_start = load_text()
    commit = resolve_revision(before)
    head = _git("rev-parse", "--short", "HEAD").stdout.decode().strip()
    dirty = _git("status", "--porcelain", "--", *ARCHIVED).stdout.strip()
    after_label = f"working tree (HEAD {head}{', with uncommitted changes' if dirty else ''})"
    listed = figures(quick)
    with tempfile.TemporaryDirectory(prefix="turnstile-before-") as archive, \
            tempfile.TemporaryDirectory(prefix="turnstile-empty-") as empty:
        present = extract(commit, Path(archive))
        sides = (Side(f"{before} ({commit[:9]})", Path(archive)), Side(after_label, ROOT))
        for side in sides:
            for figure in listed:
                module, why = entry_point(side.tree, figure)
                if module is None:
                    side.why_not[figure.name] = why
                else:
                    side.modules[figure.name] = module
        # Quick: one process a side a round (the smoke test); otherwise one a figure.
        groups = [listed] if quick else [[figure] for figure in listed]
        for _ in range(rounds):
            for group in groups:
                for side in sides:
                    side.measure(group, empty)
    section = report(before, commit, listed, sides, rounds=rounds, quick=quick,
                     archived=present, loads=(load_start, load_text()))
    section.seconds = time.perf_counter() - started
    return section


def report(before: str, commit: str, listed: list[Figure], sides: tuple[Side, Side], *,
           rounds: int, quick: bool, archived: list[str], loads: tuple[str, str]) -> Section:
    """The item's section from what each side measured."""
    load_start, load_end = loads
    before_side, after_side = sides
    rows: list[list[str]] = []
    results: dict[str, Any] = {}
    notes: list[str] = []
    for figure in listed:
        cells: list[str] = []
        values: dict[str, list[float]] = {}
        for key, side in (("before", before_side), ("after", after_side)):
            if figure.name in side.why_not:
                cells.append("not measured")
                notes.append(f"**{figure.name}** was not measured on the {key} side "
                             f"({side.label}): {side.why_not[figure.name]}.")
                continue
            values[key] = [figure.value(cpu, count) for cpu, count in side.runs[figure.name]]
            cells.append(_stat(values[key], ",.0f" if figure.higher_is_faster else ",.1f"))
        entry = {key: side.modules.get(figure.name, "–")
                 for key, side in (("before", before_side), ("after", after_side))}
        cpu = {key: statistics.median(c for c, _ in side.runs[figure.name])
               for key, side in (("before", before_side), ("after", after_side))
               if key in values}
        counts = {key: side.runs[figure.name][0][1]
                  for key, side in (("before", before_side), ("after", after_side))
                  if key in values}
        figure_result: dict[str, Any] = {"unit": figure.unit, "parameters": figure.parameters,
                                         "modules": entry, **{f"{k}_values": v
                                                              for k, v in values.items()},
                                         **{f"{k}_cpu_s": v for k, v in cpu.items()},
                                         **{f"{k}_count": v for k, v in counts.items()}}
        if len(values) == 2:
            ratio = statistics.median(values["after"]) / statistics.median(values["before"])
            paired = [a / b for a, b in zip(values["after"], values["before"], strict=True)]
            cost_change = (1 / ratio if figure.higher_is_faster else ratio) - 1
            figure_result.update(ratio=ratio, paired_ratios=paired, cpu_change=cost_change)
            cells += [f"× {ratio:.3f} ({min(paired):.3f}–{max(paired):.3f})",
                      f"{100 * cost_change:+.1f}%"]
        else:
            figure_result["why_not"] = {key: side.why_not[figure.name]
                                        for key, side in (("before", before_side),
                                                          ("after", after_side))
                                        if figure.name in side.why_not}
            cells += ["–", "–"]
        cells.append(" / ".join(f"{cpu[k]:.2f}" if k in cpu else "–"
                                for k in ("before", "after")))
        size = (f"depth {figure.parameters['depth']}" if figure.kind == "explore"
                else f"{figure.parameters['turns']:,} turns")
        if figure.kind == "explore":
            size += " (" + " / ".join(f"{counts[k]:,}" if k in counts else "–"
                                      for k in ("before", "after")) + " states)"
        modules = (entry["before"] if entry["before"] == entry["after"]
                   else f"{entry['before']} / {entry['after']}")
        rows.append([figure.name, size, figure.unit, *cells, modules])
        results[figure.name] = figure_result
    section = Section(
        f"12. Before and after: {before} against the working tree",
        ["figure", "size", "unit (CPU time)", f"before: {before}", "after: working tree",
         "after ÷ before (by round)", "CPU per unit, change", "CPU s per run before / after",
         "entry point (module)"], rows)
    section.figures = {"before": before, "commit": commit, "after": after_side.label,
                       "rounds": rounds, "load_start": load_start, "load_end": load_end,
                       "archived": archived, "figures": results,
                       "trees": {"before": str(before_side.tree), "after": str(after_side.tree)},
                       "imports": {"before": before_side.imports,
                                   "after": after_side.imports}}
    section.notes.append(
        f"Before: {before_side.label}, its {', '.join(archived)} taken with `git archive`; "
        f"after: the {after_side.label}. Each side is measured by its own entry points (the "
        "module named in the last column, found in that tree) in a fresh process with that "
        "tree first on the import path; `machine`, `machine._model` and `bench` are checked "
        "to be that tree's.")
    section.notes.append(
        f"{rounds} rounds; in each, every figure is run before then after, one process each"
        + (" (quick: one process a side a round)" if quick else "")
        + ". Cells are the median of the rounds (min–max); the ratio is the medians' and, in "
        "brackets, the range of the round-by-round ratios. All figures are CPU time "
        "(`time.process_time`): core µs per durable event, runtime µs per turn (followup "
        "and when_idle), exploration states per CPU second. *CPU per unit, change* is the "
        "CPU cost of one event, turn or state after against before: negative is faster.")
    section.notes.append(f"Load average (1/5/15 min) at the start of the item {load_start}, "
                         f"at its end {load_end}.")
    section.notes.extend(notes)
    return section


def summary(figures: dict[str, Any]) -> str:
    """The summary line: each figure's CPU change, after against before."""
    cells = []
    for name, result in figures["figures"].items():
        cells.append(f"{name} {100 * result['cpu_change']:+.1f}%" if "cpu_change" in result
                     else f"{name} not measured")
    return (", ".join(cells) + f" (load {figures['load_start']} → {figures['load_end']})")
