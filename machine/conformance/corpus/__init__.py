"""The conformance corpus, authored: every scenario, matrix cell and rule vector, written once.

Each module registers its scenarios with `machine.conformance.authoring.scenario`; a
scenario plays a script through a recording core, *reviews* the recording (its assertions
state what the spec says must happen) and returns the session, from which its vector is
written. The same definitions are the scenario tests (``tests/test_scenarios.py`` plays and
reviews each one), and the checked-in corpus (``specs/conformance/vectors``) is what they
write (``tests/test_conformance_vectors.py`` fails when it is stale):

    python -m machine.conformance.corpus            # (re)write the vectors
    python -m machine.conformance.corpus --check    # exit 1 if any vector is stale
    python -m machine.conformance.corpus A1 B3      # only ids starting with these
    python -m machine.conformance.corpus.examples [--check]   # the example logs of specs/examples

Modules: `scenarios_ab`, `scenarios_cd`, `scenarios_ef`, `scenarios_gh` (scenarios A-H),
`matrix` (the re-entrancy matrix of R19, one vector per row and command), `rules` (rules the
scenarios cover only in passing), `blindspots` (configurations the rest left blind); `common`
holds what they share (the scripts' common openings, and `Variant` tables for a family of
scenarios that play one script); `build` writes them; ``original-steps.tsv`` (package data)
says where the original implementation departs, per vector tagged ``differs-from-original``.
"""

from __future__ import annotations

import importlib

from machine.conformance.authoring import REGISTRY, Scenario

__all__ = ["MODULES", "scenarios"]

#: The modules that register scenarios, in corpus order.
MODULES = ("scenarios_ab", "scenarios_cd", "scenarios_ef", "scenarios_gh", "matrix", "rules",
           "blindspots")


def scenarios() -> list[Scenario]:
    """Every registered scenario (importing the modules registers them), in corpus order."""
    for name in MODULES:
        importlib.import_module(f"{__name__}.{name}")
    return list(REGISTRY)
