"""Which spec rules the vectors cover, and under which configurations.

`rule_ids` reads the rule ids a spec file defines: bold ids at the start of
a line (``**R7.10 Rejected**``, ``**D3. Drains…**``, ``**R15.1–R15.3 …**``
defines R15.1, R15.2 and R15.3), plus the id of every ``## R<n>.`` section
that defines no numbered rule of its own (R18, R19). Sections marked
informative are left out. A vector covers a rule when it lists the rule or
one of its sub-rules (``R8.3.2`` covers R8.3).

A rule covered only under one configuration is covered blind to the others:
`configuration_of` classifies a vector along each dimension of `DIMENSIONS`
(the log it starts from, publication, the session start, and the tool
configuration it actually exercises: no tools, exclusive calls, parallel pools
within their limit, a pool larger than ``maxParallelToolCalls``), and
`pair_coverage` gives, for each (rule, dimension, class), the vectors that
cover that rule under that class.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Final

__all__ = ["DIMENSIONS", "configuration_of", "covered_by", "pair_coverage", "rule_ids"]

_BOLD: Final = re.compile(
    r"^(?:[*-]\s+)?\*\*((?:R\d+(?:\.\d+)+|[DPLVE]\d+))(?:\s*[–-]\s*(R\d+(?:\.\d+)+))?[.\s*]")
_SECTION: Final = re.compile(r"^##\s+(R\d+)\.\s+(.*)$")


def _expand(first: str, last: str | None) -> list[str]:
    if last is None:
        return [first]
    head, _, start = first.rpartition(".")
    head_last, _, end = last.rpartition(".")
    if head != head_last or not start.isdigit() or not end.isdigit() or int(end) < int(start):
        return [first, last]
    return [f"{head}.{n}" for n in range(int(start), int(end) + 1)]


def rule_ids(text: str, *, prefixes: tuple[str, ...] = ("R", "D")) -> list[str]:
    """The rule ids *text* defines, in document order, without informative sections."""
    ids: list[str] = []
    section: str | None = None
    section_has_items = True
    informative = False
    for line in text.splitlines():
        heading = _SECTION.match(line)
        if heading or line.startswith("## "):
            if section is not None and not section_has_items and not informative:
                ids.append(section)
            section = heading.group(1) if heading else None
            section_has_items = False
            informative = heading is not None and "informative" in heading.group(2).lower()
            continue
        match = _BOLD.match(line)
        if match is None:
            continue
        section_has_items = True
        if informative:
            continue
        for rule in _expand(match.group(1), match.group(2)):
            if rule.startswith(prefixes) and rule not in ids:
                ids.append(rule)
    if section is not None and not section_has_items and not informative:
        ids.append(section)
    return ids


def covered_by(rules: Iterable[str], vectors: Mapping[str, Iterable[str]]) -> dict[str, list[str]]:
    """For each rule id: the vectors that cover it (a listed rule covers itself and its parents)."""
    wanted = list(rules)
    coverage: dict[str, list[str]] = {rule: [] for rule in wanted}
    for vector_id, listed in vectors.items():
        for item in listed:
            parts = item.split(".")
            for n in range(len(parts), 0, -1):
                candidate = ".".join(parts[:n])
                if candidate in coverage and vector_id not in coverage[candidate]:
                    coverage[candidate].append(vector_id)
    return coverage


#: Configuration dimensions and their classes (`configuration_of`).
DIMENSIONS: Final[dict[str, tuple[str, ...]]] = {
    "log": ("fresh", "seeded"),
    "publish": ("published", "unpublished"),
    "start": ("startup", "resume"),
    "tools": ("no tools", "exclusive", "parallel within the limit", "pool over the limit"),
}


def configuration_of(config: Mapping[str, Any], seed: Iterable[object],
                     outputs: Iterable[Mapping[str, Any]]) -> dict[str, str]:
    """The class of a vector in each dimension of `DIMENSIONS`, from its configuration (P11),
    its seed and its output steps (the tool classes count what its batches exercise)."""
    modes = config.get("toolModes") or {}
    limit = config.get("maxParallelToolCalls", 10)
    tools = "no tools"
    rank = DIMENSIONS["tools"].index
    for output in outputs:
        if output.get("out") != "event" or output.get("type") != "assistant/message":
            continue
        message = output.get("data", {}).get("message", {})
        names = [b.get("name") for b in message.get("content", [])
                 if isinstance(b, Mapping) and b.get("type") == "tool-call"]
        run = longest = 0
        for name in names:
            run = run + 1 if modes.get(name) == "parallel" else 0
            longest = max(longest, run)
        found = ("no tools" if not names else "exclusive" if longest == 0
                 else "pool over the limit" if longest > limit else "parallel within the limit")
        if rank(found) > rank(tools):
            tools = found
    return {"log": "seeded" if list(seed) else "fresh",
            "publish": "unpublished" if config.get("publish") is False else "published",
            "start": "resume" if config.get("sessionStart") == "resume" else "startup",
            "tools": tools}


def pair_coverage(rules: Iterable[str], vectors: Mapping[str, tuple[Iterable[str], Mapping[str, str]]]
                  ) -> dict[tuple[str, str, str], list[str]]:
    """For each (rule, dimension, class): the vectors covering the rule under that class.
    *vectors* maps a vector id to (the rules it lists, its `configuration_of`)."""
    wanted = list(rules)
    by_rule = covered_by(wanted, {vector_id: listed for vector_id, (listed, _) in vectors.items()})
    pairs: dict[tuple[str, str, str], list[str]] = {
        (rule, dimension, cls): [] for rule in wanted
        for dimension, classes in DIMENSIONS.items() for cls in classes}
    for rule, covering in by_rule.items():
        for vector_id in covering:
            for dimension, cls in vectors[vector_id][1].items():
                pairs[(rule, dimension, cls)].append(vector_id)
    return pairs
