"""`tests/typed_usage.py` (checked by ``mypy --strict`` in ``make typecheck``) also runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typed_usage


def test_the_typed_usage_examples_run(tmp_path: Path) -> None:
    lines = asyncio.run(typed_usage.session(str(tmp_path)))
    assert "hi" in lines and "completed" in lines
    assert any(line.endswith("said hi") for line in lines)
    assert "turn 1 ended completed" in lines
    assert any(line.startswith("model: hello") for line in lines)


def test_RT21_RT23_the_typed_run_examples_run() -> None:
    lines = asyncio.run(typed_usage.runs())
    assert lines[0] == "hello 5 completed 2"
    assert lines[1] == "turn/start" and lines[-2] == "agent/settled"
    assert lines[-1] == "appended between turns"
