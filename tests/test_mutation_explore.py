"""Small-depth bounded exploration for mutation runs (ASSURANCE "Mutation score").

``make mutation`` sets ``TURNSTILE_MUTATION=1``; only then do these tests run.
They are the same checks as ``test_explore.py`` (R20.1 invariants and the log's
session invariants at every reachable state) at depths small enough to run once
per mutant. In the ordinary suite they are skipped: ``test_explore.py`` covers
the same ground deeper.
"""

from __future__ import annotations

import os

import pytest

from machine.explore import classic_explorer

pytestmark = pytest.mark.skipif(
    os.environ.get("TURNSTILE_MUTATION") != "1",
    reason="mutation-run only (make mutation); test_explore.py covers this deeper")

DEFAULT_DEPTH = int(os.environ.get("TURNSTILE_MUTATION_DEPTH", "5"))
ALL_COMMANDS_DEPTH = max(DEFAULT_DEPTH - 1, 1)


def test_R20_1_mutation_explore_default_alphabet() -> None:
    result = classic_explorer().run(DEFAULT_DEPTH)
    assert result.failure is None, f"{result.failure}\n{result.failure.steps if result.failure else ''}"


def test_R20_1_mutation_explore_all_commands() -> None:
    result = classic_explorer(commands=("followup", "steer", "inject", "quiet", "cancel",
                                        "cancel-keep", "dispose")).run(ALL_COMMANDS_DEPTH)
    assert result.failure is None, f"{result.failure}\n{result.failure.steps if result.failure else ''}"
