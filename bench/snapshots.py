"""Item 9: snapshots of a core (R4.12): `AgentCore.snapshot`, `AgentCore.restore` and
`AgentCore.copy` of a core holding N queued prompts, for N = 1,000, 10,000 and 100,000.

What is measured is the cost of the state's size: the queued prompts are the state (their
messages are shared, the inbox's items copied), the log is taken by position. O(state)
shows as a time per queued prompt that stays flat as N grows; a replay would instead
cost each of the N sends again (shown beside, for the same core).
"""

from __future__ import annotations

import time

from bench.common import Section
from machine.core import AgentCore, CoreConfig

SIZES = (1_000, 10_000, 100_000)
QUICK_SIZES = (100, 1_000)
HEADERS = ["queued prompts", "snapshot ms", "restore ms", "copy ms", "replay ms",
           "restore µs per prompt", "restore ÷ replay"]


def _core(count: int) -> AgentCore:
    """An idle core whose wake is pending, with *count* quiet prompts queued (none is
    claimed, so every one stays in the state)."""
    core = AgentCore(CoreConfig(publish=False))
    for index in range(count):
        core.send({"id": f"q{index}", "role": "user",
                   "content": [{"type": "text", "text": f"prompt {index}"}],
                   "source": {"kind": "user"}}, {"target": "next-turn", "wakeup": False})
    return core


def _best(action: object, repeat: int = 5) -> float:
    """The best of *repeat* CPU timings of *action*, in seconds."""
    assert callable(action)
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        action()
        best = min(best, time.process_time() - started)
    return best


def run(quick: bool = False) -> Section:
    started = time.perf_counter()
    rows: list[list[str]] = []
    figures: dict[str, dict[str, float]] = {}
    for count in (QUICK_SIZES if quick else SIZES):
        core = _core(count)
        snapshot = core.snapshot()
        restored = AgentCore.restore(snapshot)
        assert restored.pending_queued == count and restored.snapshot() == snapshot
        snap_s = _best(core.snapshot)
        restore_s = _best(lambda taken=snapshot: AgentCore.restore(taken))
        copy_s = _best(core.copy)
        replay_s = _best(lambda size=count: _core(size), repeat=2)
        rows.append([f"{count:,}", f"{snap_s * 1e3:.2f}", f"{restore_s * 1e3:.2f}",
                     f"{copy_s * 1e3:.2f}", f"{replay_s * 1e3:.1f}",
                     f"{restore_s / count * 1e6:.3f}", f"{restore_s / replay_s:.3f}"])
        figures[str(count)] = {"snapshot_s": snap_s, "restore_s": restore_s, "copy_s": copy_s,
                               "replay_s": replay_s}
    section = Section("9. Snapshots (R4.12)", HEADERS, rows)
    section.figures = figures
    section.notes.append(
        "A core with N quiet queued prompts (`send(..., {target: next-turn, wakeup: false})`): "
        "`snapshot()`, `AgentCore.restore(snapshot)` and `copy()` each copy the state once "
        "(the messages are shared, the inbox's list of items is copied); the log goes by "
        "position. \"replay\" builds the same core by sending the N prompts again. CPU time, "
        "best of 5 (replay: of 2).")
    section.seconds = time.perf_counter() - started
    return section
