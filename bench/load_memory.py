"""Item 8: memory of a JSONL session load (S31) — peak resident memory vs the file's size.

A session of *N* events of *S* characters each is written straight to a file (never held in
memory), then loaded by ``JsonlStore.load`` in a fresh interpreter, which reports its peak
resident set size (``ru_maxrss``) before and after the load. The load's cost is the growth:
what the loaded log retains (each event's compact JSON text, L1, and for surface events the
derived history's messages, L13) plus the largest transient record. Two kinds of session:
``assistant/chunk`` events inside one step (the log keeps their text once), and between-turn
``user/message`` events (kept as text and as history messages). Issue 14 measured 8 GiB for
a 1 GB session before loads streamed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import Section
from machine.events import Event
from machine.jsonvalue import FrozenDict
from machine.store.codec import new_uid
from machine.store.jsonl import encode_header, encode_record
from machine.store.types import SessionInfo

ROOT = Path(__file__).resolve().parents[1]
#: (events, characters per event) per size; the largest is the issue's 1,000 × 1 MiB.
FULL_SIZES = ((64, 1 << 20), (256, 1 << 20), (1000, 1 << 20))
QUICK_SIZES = ((8, 1 << 16),)
KINDS = ("chunks", "messages")

_CHILD = """
import json, resource, sys, time
from machine.store import JsonlStore
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start = time.perf_counter()
with JsonlStore(sys.argv[1], fsync=False) as store:
    result = store.load("big")
    events = len(result.events)
seconds = time.perf_counter() - start
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
print(json.dumps({"before_kib": before, "after_kib": after, "seconds": seconds,
                  "events": events}))
"""


def write_session(root: Path, kind: str, count: int, size: int) -> int:
    """Write the session file event by event; returns its size in bytes."""
    info = SessionInfo("big", uid=new_uid())
    path = root / "big.jsonl"
    seq = 0
    with path.open("wb") as file:
        file.write(encode_header(info))

        def put(type_: str, data: dict[str, Any], op: str | None = None) -> None:
            nonlocal seq
            file.write(encode_record(Event(type_, seq, 0, FrozenDict(data), op), info.uid))
            seq += 1

        if kind == "chunks":
            put("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
            put("step/start", {"turn": 1, "step": 1})
        for index in range(count):
            text = chr(ord("a") + index % 26) * size
            if kind == "chunks":
                put("assistant/chunk", {"turn": 1, "step": 1,
                                        "chunk": {"type": "text", "text": text}})
            else:
                put("user/message", {"id": f"m{index}", "role": "user",
                                     "content": [{"type": "text", "text": text}],
                                     "source": {"kind": "plugin", "plugin": "bench"}}, "append")
        if kind == "chunks":
            put("step/end", {"turn": 1, "step": 1})
            put("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    return path.stat().st_size


def measure(root: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(root)], env=env, check=True,
                          capture_output=True, text=True)
    figures: dict[str, Any] = json.loads(done.stdout)
    return figures


def run(quick: bool = False) -> Section:
    started = time.perf_counter()
    rows: list[list[str]] = []
    figures: dict[str, Any] = {}
    scratch = Path(tempfile.mkdtemp(prefix="turnstile-bench-load-memory-"))
    try:
        for kind in KINDS:
            for count, size in QUICK_SIZES if quick else FULL_SIZES:
                root = scratch / f"{kind}-{count}"
                root.mkdir()
                file_size = write_session(root, kind, count, size)
                result = measure(root)
                growth = (result["after_kib"] - result["before_kib"]) * 1024
                ratio = growth / file_size
                rows.append([kind, f"{count:,} × {size // 1024:,} KiB", f"{file_size / 1e6:,.0f}",
                             f"{result['before_kib'] * 1024 / 1e6:,.0f}",
                             f"{result['after_kib'] * 1024 / 1e6:,.0f}", f"{growth / 1e6:,.0f}",
                             f"{ratio:.2f}", f"{result['seconds']:.1f}"])
                figures[f"{kind}/{count}"] = {"file_bytes": file_size, "growth_bytes": growth,
                                              "ratio": ratio, "seconds": result["seconds"]}
                shutil.rmtree(root)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    section = Section("8. Memory of a session load", [
        "events", "size", "file MB", "RSS before MB", "peak RSS MB", "growth MB",
        "growth ÷ file", "load s"], rows, figures=figures)
    section.notes.append(
        "Peak resident memory of a fresh interpreter (`ru_maxrss`) before and after "
        "`JsonlStore.load` of the session: the growth is what the load cost. `chunks`: "
        "assistant/chunk events inside one step (the log keeps each event's compact text); "
        "`messages`: between-turn user/message events (the text, and the derived history's "
        "message objects, L13). Before loads streamed (S31), a 1 GB session took about 8 GiB.")
    section.seconds = time.perf_counter() - started
    return section
