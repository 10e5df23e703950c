"""The scenario tests, collected from the corpus's definitions (``machine.conformance.corpus``).

Every scenario of scenarios.md (A-H), every cell of the re-entrancy matrix (R19, ``M<row>-<command>``),
every rule and blind-spot vector is written once, as a definition that plays a script and
reviews it (its assertions state what the spec requires); the conformance vector is generated
from the same definition (``tests/test_conformance_vectors.py`` fails when the checked-in
corpus is stale). Here each definition is one test: played through a recording core under
the agent invariants (R20.1), reviewed, and its log checked (`check_log`). The test id is the
vector id followed by its rules (their families when there are many).

To add a scenario, write it in the module of its family under ``machine/conformance/corpus/``
and run ``python -m machine.conformance.corpus`` to write its vector. A test that plays a
script no vector plays (a variant) belongs in ``tests/test_scenario_variants.py``.
"""

from __future__ import annotations

import pytest

from machine.conformance.authoring import Scenario
from machine.conformance.corpus import scenarios

DEFINITIONS = scenarios()


def _rules(item: Scenario) -> str:
    if len(item.rules) <= 5:
        return "-".join(item.rules)
    families = dict.fromkeys(rule.split(".")[0] for rule in item.rules)
    return "-".join(families)


@pytest.mark.parametrize("item", DEFINITIONS, ids=[f"{d.id}__{_rules(d)}" for d in DEFINITIONS])
def test_scenario(item: Scenario) -> None:
    item.review()


def test_every_definition_is_collected_once() -> None:
    ids = [d.id for d in DEFINITIONS]
    assert len(ids) == len(set(ids)) and len(ids) >= 256
    assert {i.split("-")[0] for i in ids if i.startswith("M")} >= {f"M{r:02d}" for r in range(1, 28)}
