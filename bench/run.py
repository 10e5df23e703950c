"""Run every benchmark and write BENCHMARKS.md: ``python -m bench.run [--quick]`` (``make bench``).

Each item runs in its own Python process (``--item``), so one item's heap and
garbage never weigh on the next one's timings; ``--in-process`` runs them all
here instead (the smoke test does, with ``--quick``). ``--quick`` uses tiny
sizes: it checks that the harness works and its figures mean nothing.
``--before REV`` (``make bench BEFORE=REV``) adds item before-after, which measures the
commit REV and the working tree in the same run (bench/before_after.py); without it, that
item does not run.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.common import Section, load_text, machine_description

ROOT = Path(__file__).resolve().parents[1]
ITEMS = ("throughput", "runtime", "dispatch", "explore", "oracle", "stores", "memory",
         "load-memory", "snapshot", "providers", "tracing", "peers", "before-after")
#: Items that run only when asked for with their option (``--before REV``).
ON_REQUEST = ("before-after",)


def run_item(name: str, quick: bool, context: dict[str, Any], options: argparse.Namespace
             ) -> Section:
    """Run one item in this process."""
    if name == "throughput":
        from bench import throughput
        return throughput.run(quick)
    if name == "runtime":
        from bench import runtime_async
        runs = context.get("throughput", {}).get("runs", {})
        core_us = {key: value["cpu_us_per_event"] for key, value in runs.items()}
        return runtime_async.run(quick, core_us=core_us)
    if name == "dispatch":
        from bench import dispatch
        return dispatch.run(quick)
    if name == "explore":
        from bench import exploration
        return exploration.run(quick, budget=options.explore_budget)
    if name == "oracle":
        from bench import oracle
        return oracle.run(quick)
    if name == "stores":
        from bench import stores
        return stores.run(quick)
    if name == "memory":
        from bench import memory
        return memory.run(quick)
    if name == "load-memory":
        from bench import load_memory
        return load_memory.run(quick)
    if name == "snapshot":
        from bench import snapshots
        return snapshots.run(quick)
    if name == "providers":
        from bench import providers
        return providers.run(quick)
    if name == "tracing":
        from bench import tracing
        return tracing.run(quick)
    if name == "peers":
        from bench import peers
        return peers.run(quick)
    if name == "before-after":
        from bench import before_after
        return before_after.run(quick, before=options.before)
    raise ValueError(f"unknown item {name!r}; known: {', '.join(ITEMS)}")


def _section_from_json(value: dict[str, Any]) -> Section:
    tables = [(caption, list(headers), [list(row) for row in rows])
              for caption, headers, rows in value.pop("tables", [])]
    return Section(**value, tables=tables)


def run_subprocess(name: str, quick: bool, context: dict[str, Any],
                   options: argparse.Namespace) -> Section:
    """Run one item in a fresh interpreter and read its section back."""
    with tempfile.TemporaryDirectory(prefix="turnstile-bench-") as scratch:
        result = Path(scratch) / "result.json"
        given = Path(scratch) / "context.json"
        given.write_text(json.dumps(context), encoding="utf-8")
        command = [sys.executable, "-m", "bench.run", "--item", name, "--result", str(result),
                   "--context", str(given)]
        if quick:
            command.append("--quick")
        if options.explore_budget is not None:
            command += ["--explore-budget", str(options.explore_budget)]
        if options.before is not None:
            command += ["--before", options.before]
        subprocess.run(command, cwd=ROOT, check=True)
        return _section_from_json(json.loads(result.read_text(encoding="utf-8")))


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def summary(sections: dict[str, Section]) -> list[str]:
    """The headline figures (only those of the items that ran)."""
    lines = ["| figure | value |", "|---|---:|"]

    def add(label: str, value: str) -> None:
        lines.append(f"| {label} | {value} |")

    if "throughput" in sections:
        figures = sections["throughput"].figures
        runs, flat, cpu_flat = figures["runs"], figures["flatness"], figures["flatness_cpu"]
        largest = max(int(key.split("/")[1]) for key in runs)
        for workload in ("W1", "W2", "W3"):
            cell = runs[f"{workload}/{largest}"]
            add(f"core {workload}, {largest:,} turns", f"{cell['turns_per_s']:,.0f} turns/s, "
                f"{cell['events_per_s']:,.0f} events/s, {cell['us_per_event']:.1f} µs/event")
        add("flatness, turns/s largest N ÷ smallest N (need ≥ 0.8): wall / CPU time",
            ", ".join(f"{w} {flat[w]:.2f} / {cpu_flat[w]:.2f}" for w in ("W1", "W2", "W3")))
        gc_figures = figures.get("gc", {})
        if gc_figures:
            add("… with gc.freeze() after each turn (application option), CPU time",
                ", ".join(f"{w} {gc_figures[w]['flat_freeze_cpu']:.2f}"
                          for w in ("W1", "W2", "W3")))
    if "runtime" in sections:
        runs = sections["runtime"].figures["runs"]
        largest = max(int(key.split("/")[1]) for key in runs)
        add(f"asyncio runtime, {largest:,} turns", ", ".join(
            f"{w} {runs[f'{w}/{largest}']['turns_per_s']:,.0f} turns/s" for w in ("W1", "W2", "W3")))
    if "tracing" in sections:
        figures = sections["tracing"].figures
        add("tracing, runtime CPU per turn (W2) ÷ not installed", ", ".join(
            f"{label} {value['change_percent']:+.1f}%" for label, value in figures.items()
            if label != "not installed"))
    if "dispatch" in sections:
        figures = sections["dispatch"].figures
        add("compiled table ÷ plain dict, per transition",
            ", ".join(f"{name} × {value['ratio']:.1f}" for name, value in figures.items()))
    if "explore" in sections:
        figures = sections["explore"].figures
        done = [d for d, f in figures.items() if d.isdigit() and f["exhausted"]]
        if done:
            deepest = max(done, key=int)
            f = figures[deepest]
            add(f"exploration, deepest exhausted depth ({deepest})",
                f"{f['states']:,} states in {f['seconds']:.0f} s ({f['states_per_s']:,.0f} states/s)")
        pairs = figures.get("copy_vs_replay", {})
        if pairs:
            add("exploration, copying states ÷ replaying them (CPU time, same run)", ", ".join(
                f"{name} depth {int(f['depth'])} × {f['replay_s'] / f['copy_s']:.2f}"
                for name, f in pairs.items()))
        base = figures.get("against_base", {})
        if base:
            from bench.exploration import BASE
            add(f"exploration, states/s now ÷ at {BASE} (CPU time, same run)", ", ".join(
                f"{name} depth {int(f['depth'])} × "
                f"{(f['states_now'] / f['cpu_now']) / (f['states_before'] / f['cpu_before']):.2f}"
                for name, f in base.items()))
        floor = figures.get("implementation_floor", {})
        if floor:
            from bench.exploration import ISSUE_BASELINE
            add("exploration, ceiling if keys and checks cost nothing (running and copying "
                f"the implementations only) ÷ {ISSUE_BASELINE:,} states/s", ", ".join(
                    f"{name} depth {int(f['depth'])} × "
                    f"{f['states'] / (f['run_s'] + f['copy_s']) / ISSUE_BASELINE:.1f}"
                    for name, f in floor.items()))
    if "snapshot" in sections:
        figures = sections["snapshot"].figures
        size = max(figures, key=int)
        f = figures[size]
        add(f"snapshot + restore of a core with {int(size):,} queued prompts",
            f"{(f['snapshot_s'] + f['restore_s']) * 1e3:.1f} ms (replaying the sends: "
            f"{f['replay_s'] * 1e3:.0f} ms)")
    if "providers" in sections:
        figures = sections["providers"].figures.get("summary", {})
        if "openai_next_ms" in figures:
            add(f"client CPU per request through OpenAIChat at {figures['size']:,.0f} messages: "
                "next request / first of a fresh adapter", f"{figures['openai_next_ms']:.1f} ms / "
                f"{figures['openai_first_ms']:.0f} ms")
        if "pydantic_ai_over_now" in figures:
            add("… ÷ pydantic-ai's OpenAI path, same history, same run (next / first)",
                f"× {figures['pydantic_ai_over_now']:,.0f} / "
                f"× {figures['pydantic_ai_over_now_first']:,.1f}")
    if "peers" in sections:
        figures = sections["peers"].figures.get("summary", {})
        for messages in sorted({int(key.split("/")[1]) for key in figures}):
            peers = [(name, figures[f"{how}/{messages}"]) for name, how in
                     (("pydantic-ai", "pydantic-ai"), ("OpenAI Agents SDK", "agents-sdk"))
                     if f"{how}/{messages}" in figures]
            add(f"CPU per agent turn at {messages:,} messages, the peer ÷ turnstile (SDK encoding "
                "counted, running session)", ", ".join(f"{name} × {ratio:,.1f}"
                                                        for name, ratio in peers))
    if "oracle" in sections:
        figures = sections["oracle"].figures
        add(f"verify-trace, {figures['lines']:,}-event trace",
            f"{figures['verify_events_per_s']:,.0f} events/s")
        add("turnstile check", f"{figures['vectors_per_s']:,.0f} vectors/s")
    if "stores" in sections:
        figures = sections["stores"].figures
        add("JSONL appends/s (fsync at each turn / no fsync)",
            f"{figures['append/JSONL/fsync']:,.0f} / {figures['append/JSONL/no fsync']:,.0f}")
        add("SQLite appends/s (fsync at each turn / no fsync)",
            f"{figures['append/SQLite/fsync']:,.0f} / {figures['append/SQLite/no fsync']:,.0f}")
        if "append/PostgreSQL/fsync" in figures:
            add("PostgreSQL appends/s (WAL-flushed commit at each turn / no WAL wait)",
                f"{figures['append/PostgreSQL/fsync']:,.0f} / "
                f"{figures['append/PostgreSQL/no fsync']:,.0f}")
        loads = [name for name in ("JSONL", "SQLite", "PostgreSQL") if f"load/{name}" in figures]
        add(f"load + repair of the crashed ~1M-event session ({' / '.join(loads)})",
            " / ".join(f"{figures[f'load/{name}']:.1f} s" for name in loads))
    if "memory" in sections:
        figures = sections["memory"].figures
        events = [v for key, values in figures.items() if key.startswith("event/")
                  for v in values]
        add("bytes per retained durable event", f"{min(events):,.0f}–{max(events):,.0f}")
        add("bytes per queued prompt / staged context",
            f"{figures['queued'][-1]:,.0f} / {figures['staged'][-1]:,.0f}")
    if "load-memory" in sections:
        figures = sections["load-memory"].figures
        largest_run = {kind: max((key for key in figures if key.startswith(f"{kind}/")),
                                 key=lambda key: int(key.split("/")[1]), default=None)
                       for kind in ("chunks", "messages")}
        cells = [f"{kind} {figures[key]['file_bytes'] / 1e6:,.0f} MB: "
                 f"{figures[key]['ratio']:.2f}" for kind, key in largest_run.items() if key]
        add("JSONL load, resident memory growth ÷ file size", ", ".join(cells))
    if "before-after" in sections:
        from bench import before_after
        figures = sections["before-after"].figures
        add(f"before and after: CPU per unit, working tree against {figures['before']} "
            f"(same run, {figures['rounds']} rounds)", before_after.summary(figures))
    return lines


def render(sections: dict[str, Section], *, quick: bool, started: str, load_start: str,
           seconds: float) -> str:
    head = _git("rev-parse", "--short", "HEAD")
    dirty = " (with uncommitted changes)" if _git("status", "--porcelain", "--", "machine") else ""
    lines = ["# Benchmarks", "",
             "Generated by `make bench` (`python -m bench.run`); do not edit by hand. "
             "Every figure is a wall-clock measurement on the machine below unless it says "
             "otherwise; on a shared machine, compare the CPU-time columns and the load average.",
             ""]
    if quick:
        lines += ["**QUICK RUN (`--quick`): tiny sizes, to check the harness only. These figures "
                  "mean nothing.**", ""]
    lines += ["## Machine", "", "| | |", "|---|---|"]
    lines += [f"| {key} | {value} |" for key, value in machine_description()]
    lines += [f"| load average (1/5/15 min) at start | {load_start} |",
              f"| load average at end | {load_text()} |",
              f"| started | {started} |",
              f"| total run time | {seconds / 60:.1f} min |",
              f"| code | {head}{dirty} |", ""]
    lines += ["## Summary", "", *summary(sections), ""]
    for name in ITEMS:
        if name in sections:
            lines.append(sections[name].markdown())
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes (a smoke run)")
    parser.add_argument("--only", metavar="ITEMS",
                        help=f"comma-separated items to run (default all: {','.join(ITEMS)})")
    parser.add_argument("--out", metavar="FILE", default=None,
                        help="where to write the report (default BENCHMARKS.md; with "
                             "--quick, BENCHMARKS.quick.md in the temporary directory)")
    parser.add_argument("--in-process", action="store_true",
                        help="run the items in this process instead of one process each")
    parser.add_argument("--explore-budget", type=float, default=None, metavar="SECONDS",
                        help="time budget of each exploration depth (0: exhaust every depth)")
    parser.add_argument("--before", metavar="REV", default=None,
                        help="also run item before-after: the commit REV against the working "
                             "tree, in the same run (make bench BEFORE=REV)")
    parser.add_argument("--item", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--context", help=argparse.SUPPRESS)
    options = parser.parse_args(argv)

    if options.item:                       # a child process: one item, result as JSON
        given = (json.loads(Path(options.context).read_text(encoding="utf-8"))
                 if options.context else {})
        section = run_item(options.item, options.quick, given, options)
        Path(options.result).write_text(json.dumps(asdict(section)), encoding="utf-8")
        return 0

    names = (tuple(n for n in ITEMS if n not in ON_REQUEST or options.before is not None)
             if not options.only else tuple(n.strip() for n in options.only.split(",")))
    unknown = [n for n in names if n not in ITEMS]
    if unknown:
        parser.error(f"unknown item(s) {', '.join(unknown)}; known: {', '.join(ITEMS)}")
    if options.before is not None:
        from bench.before_after import BeforeAfterError, resolve_revision
        try:
            resolve_revision(options.before)
        except BeforeAfterError as error:
            parser.error(str(error))
        if "before-after" not in names:
            parser.error("--before REV is for item before-after, which --only leaves out")
    elif "before-after" in names:
        parser.error("item before-after needs --before REV (make bench BEFORE=REV)")
    out = Path(options.out) if options.out else (
        Path(tempfile.gettempdir()) / "BENCHMARKS.quick.md" if options.quick
        else ROOT / "BENCHMARKS.md")
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    load_start = load_text()
    start = time.perf_counter()
    runner: Callable[[str, bool, dict[str, Any], argparse.Namespace], Section] = (
        run_item if options.in_process else run_subprocess)
    sections: dict[str, Section] = {}
    context: dict[str, Any] = {}
    for name in names:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        section = runner(name, options.quick, context, options)
        sections[name] = section
        context[name] = section.figures
        print(f"bench: {name} done in {section.seconds:.0f} s (load {load_text()})",
              file=sys.stderr, flush=True)
    text = render(sections, quick=options.quick, started=started, load_start=load_start,
                  seconds=time.perf_counter() - start)
    out.write_text(text, encoding="utf-8")
    print(f"bench: wrote {os.path.relpath(out)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
