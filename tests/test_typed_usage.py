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
