"""Shared helpers: sections, repeated timing, machine description, formatting."""

from __future__ import annotations

import contextlib
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class Section:
    """One item of the report: a title, a markdown table, notes, and raw figures (for tests)."""

    title: str
    headers: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)

    def markdown(self) -> str:
        lines = [f"## {self.title}", ""]
        if self.headers:
            lines.extend(_table(self.headers, self.rows))
            lines.append("")
        for caption, headers, rows in self.tables:
            if caption:
                lines.extend([caption, ""])
            lines.extend(_table(headers, rows))
            lines.append("")
        lines.extend(f"- {note}" for note in self.notes)
        if self.notes:
            lines.append("")
        lines.append(f"_Section run time {self.seconds:.1f} s, load average at the end "
                     f"{load_text()}._")
        lines.append("")
        return "\n".join(lines)


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    out = ["| " + " | ".join(headers) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|"]
    out.extend("| " + " | ".join(row) + " |" for row in rows)
    return out


@dataclass(frozen=True)
class Stats:
    """Median, min and max of repeated measurements (of a rate or a duration)."""

    median: float
    low: float
    high: float
    samples: tuple[float, ...]

    @classmethod
    def of(cls, samples: Sequence[float]) -> Stats:
        return cls(statistics.median(samples), min(samples), max(samples), tuple(samples))

    def fmt(self, spec: str = ",.0f") -> str:
        if len(self.samples) == 1:
            return format(self.median, spec)
        return f"{self.median:{spec}} ({self.low:{spec}}–{self.high:{spec}})"


def timed(run: Callable[[], T]) -> tuple[float, T]:
    """Seconds taken by *run* (after a full collection, so earlier garbage is not charged)."""
    gc.collect()
    start = time.perf_counter()
    result = run()
    return time.perf_counter() - start, result


def load_average() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:  # pragma: no cover - not on this platform
        return None


def load_text() -> str:
    load = load_average()
    return "n/a" if load is None else " / ".join(f"{x:.2f}" for x in load)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            for line in handle:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def memory_total() -> str:
    try:
        with open("/proc/meminfo", encoding="utf-8") as handle:
            for line in handle:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def machine_description() -> list[tuple[str, str]]:
    cores = os.cpu_count() or 0
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        usable = cores
    return [
        ("CPU", cpu_model()),
        ("cores", f"{cores} logical ({usable} usable by this process)"),
        ("memory", memory_total()),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", f"{platform.python_implementation()} {sys.version.split()[0]}"),
        ("GC thresholds", str(gc.get_threshold())),
    ]


def rate(count: float, seconds: float) -> float:
    return count / seconds if seconds > 0 else float("inf")


def si(value: float) -> str:
    """A count with thousands separators."""
    return f"{value:,.0f}"


#: A server program for `local_server`: the fake server of the runtime's tests answering every
#: POST with ``choose(request)`` (a `Reply`), which the item's *setup* code defines.
_SERVING = """
import asyncio, itertools, json
from machine.runtime.adapters.fake_server import (FakeServer, anthropic_text, openai_text,
                                                   openai_tool_calls)
{setup}

class Answering(FakeServer):
    # answers every POST with choose(request); keeps no body, refuses nothing
    async def _serve(self, reader, writer):
        self._connections.add(writer)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    return
                if not await self._respond(writer, choose(request)):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError,
                asyncio.CancelledError):
            return
        finally:
            self._connections.discard(writer)
            writer.close()

async def main():
    server = await Answering(refuse=False).start()
    print(server.port, flush=True)
    await asyncio.Event().wait()

asyncio.run(main())
"""


def server_script(setup: str) -> str:
    """The program of a local fake server whose replies *setup* chooses: Python code defining
    ``choose(request) -> Reply`` (the fake server's helpers are imported)."""
    return _SERVING.replace("{setup}", setup)


@contextlib.contextmanager
def local_server(script: str, tree: Path) -> Iterator[str]:
    """Run *script* (a Python program that prints its port, then serves until killed) in
    another process with *tree* on the import path; yields its ``http://127.0.0.1:PORT``."""
    server = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": str(tree)})
    try:
        assert server.stdout is not None
        yield f"http://127.0.0.1:{int(server.stdout.readline())}"
    finally:
        server.kill()
        server.wait()


def child_figures(script: str, arguments: Sequence[str], tree: str | Path, cwd: str,
                  what: str) -> Any:
    """Run *script* with *arguments* in a fresh interpreter (*tree* on the import path, in the
    folder *cwd*) and read the JSON its last line prints; *what* names it in an error."""
    completed = subprocess.run([sys.executable, "-c", script, *arguments],
                               env={**os.environ, "PYTHONPATH": str(tree)}, capture_output=True,
                               text=True, check=False, cwd=cwd)
    if completed.returncode != 0:
        raise RuntimeError(f"{what}: {completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


def milliseconds(seconds: float) -> str:
    """*seconds* in ms, with three significant figures at most (no decimals from 100)."""
    value = seconds * 1e3
    return f"{value:,.0f}" if value >= 100 else f"{value:.1f}" if value >= 1 else f"{value:.2f}"


def paired_rows(figures: dict[str, Any], labels: Sequence[str], sizes: Sequence[int],
                keys: tuple[str, str]) -> list[list[str]]:
    """A row per label: for each size, the figures ``label/size`` holds under *keys*, in ms,
    as ``a / b`` (a dash where the label was not measured at that size)."""
    rows = []
    for label in labels:
        cells = [f"{milliseconds(figures[f'{label}/{size}'][keys[0]])} / "
                 f"{milliseconds(figures[f'{label}/{size}'][keys[1]])}"
                 if f"{label}/{size}" in figures else "—" for size in sizes]
        rows.append([label, *cells])
    return rows
