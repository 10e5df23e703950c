"""Fixtures shared by the test modules."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture
def restored_registries() -> Iterator[None]:
    """Restore the extension registries after a test that registers (V3, V4)."""
    from machine import vocabulary
    blocks, sources = dict(vocabulary._block_checks), dict(vocabulary._source_checks)
    yield
    vocabulary._block_checks.clear()
    vocabulary._block_checks.update(blocks)
    vocabulary._source_checks.clear()
    vocabulary._source_checks.update(sources)
    vocabulary._MAPPED.clear()
