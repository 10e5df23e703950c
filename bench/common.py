"""Shared helpers: sections, repeated timing, machine description, formatting."""

from __future__ import annotations

import gc
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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
