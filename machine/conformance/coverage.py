"""Which spec rules the vectors cover.

`rule_ids` reads the rule ids a spec file defines: bold ids at the start of
a line (``**R7.10 Rejected**``, ``**D3. Drains…**``, ``**R15.1–R15.3 …**``
defines R15.1, R15.2 and R15.3), plus the id of every ``## R<n>.`` section
that defines no numbered rule of its own (R18, R19). Sections marked
informative are left out. A vector covers a rule when it lists the rule or
one of its sub-rules (``R8.3.2`` covers R8.3).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final

__all__ = ["covered_by", "rule_ids"]

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
