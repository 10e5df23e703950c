"""The reference model cites the project's rule ids, and only them (issues 18, 32): one grep for
a rule id finds the spec, the machine, the model and the tests.

These tests check that

* every rule id the model cites is a rule of ``specs/`` (a step ``R8.3.2`` being step 2 of
  a rule that has one);
* the model cites no section of a document outside the repository (no "§");
* every R rule the machine (``machine/core/``) cites is cited by the model too, or is
  exempt below with the reason.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODEL = ROOT / "model" / "agent.py"
SPECS = ROOT / "specs"
MACHINE_CORE = ROOT / "machine" / "core"

_ID = r"[RPLVESD]\d+(?:\.\d+)*"
#: a rule id, or a range of them such as ``R7.2-R7.11`` or ``P1–P14``
CITATION = re.compile(rf"\b({_ID})(?:[–-]({_ID}))?\b")
#: the start of a rule's statement in a spec: a heading ``## R7.`` or a bold ``**R7.10 …``
#: (``**R15.1–R15.3 …`` states a range), possibly as a list item
DEFINITION = re.compile(rf"^(?:## |(?:\* )?\*\*)({_ID})(?:–({_ID}))?\b", re.MULTILINE)

#: R rules the machine cites and the model need not: each with the reason.
EXEMPT = {
    "R4.11": "the couplings of the machine's one explicit CoreState (machine.core.state, "
             "coupling_problems): a statement about how the machine holds its state; the "
             "model keeps plain flags and is compared with the machine by its outputs",
    "R4.13": "the declared graph of the machine's loop (machine.core.loop): the model's loop "
             "is straight-line code, each procedure read in the order of its rule, and is "
             "compared with the machine by its outputs",
}


def _expand(first: str, last: str | None) -> set[str]:
    """The ids a citation names: one id, or every id of a range whose ends differ only in
    their last number (``R7.2–R7.11``, ``R10.4.1–R10.4.5``, ``P1–P14``)."""
    if last is None:
        return {first}
    head_a, _, tail_a = first.rpartition(".")
    head_b, _, tail_b = last.rpartition(".")
    if not head_a:
        head_a, tail_a, head_b, tail_b = first[0], first[1:], last[0], last[1:]
        sep = ""
    else:
        sep = "."
    if head_a != head_b or int(tail_a) > int(tail_b):
        return {first, last}
    return {f"{head_a}{sep}{n}" for n in range(int(tail_a), int(tail_b) + 1)}


def _cited(text: str) -> set[str]:
    ids: set[str] = set()
    for match in CITATION.finditer(text):
        ids |= _expand(match.group(1), match.group(2))
    return ids


def _defined() -> tuple[set[str], dict[str, set[int]]]:
    """The rule ids the specs state, and for each rule the numbers of its steps (the
    numbered list items of its statement)."""
    ids: set[str] = set()
    steps: dict[str, set[int]] = {}
    for spec in sorted(SPECS.glob("*.md")):
        text = spec.read_text(encoding="utf-8")
        starts = list(DEFINITION.finditer(text))
        for index, match in enumerate(starts):
            named = _expand(match.group(1), match.group(2))
            ids |= named
            end = starts[index + 1].start() if index + 1 < len(starts) else len(text)
            numbers = {int(n) for n in re.findall(r"^\s*(\d+)\. ", text[match.end():end],
                                                  re.MULTILINE)}
            for rule in named:
                steps.setdefault(rule, set()).update(numbers)
    return ids, steps


def _exists(rule: str, ids: set[str], steps: dict[str, set[int]]) -> bool:
    if rule in ids:
        return True
    parent, _, step = rule.rpartition(".")
    return parent in ids and parent.count(".") == 1 and int(step) in steps.get(parent, set())


def test_the_model_cites_no_section_of_a_document_outside_the_repository() -> None:
    """Issue 32: the model cites rule ids of ``specs/`` only; a "§" would name a section of a
    reference a reader of the repository does not have."""
    sections = [line.strip() for line in MODEL.read_text(encoding="utf-8").splitlines()
                if "§" in line]
    assert sections == []


def _covered(rule: str, model: set[str]) -> bool:
    """A rule is cited by the model when it or one of its parts (a rule of a section, a
    step of a rule) is."""
    return rule in model or any(cited.startswith(rule + ".") for cited in model)


def test_every_rule_the_machine_cites_is_cited_by_the_model_or_exempt() -> None:
    machine: set[str] = set()
    for module in sorted(MACHINE_CORE.glob("*.py")):
        machine |= {rule for rule in _cited(module.read_text(encoding="utf-8"))
                    if rule.startswith("R")}
    assert machine, "machine/core/ cites no R rule"
    model = _cited(MODEL.read_text(encoding="utf-8"))
    missing = sorted(rule for rule in machine if not _covered(rule, model) and rule not in EXEMPT)
    assert missing == [], (
        f"rules machine/core/ cites that model/agent.py does not: {missing}; cite them where "
        "the model does what they say, or exempt them in EXEMPT with the reason")
    stale = sorted(rule for rule in EXEMPT if rule not in machine or _covered(rule, model))
    assert stale == [], f"EXEMPT lists rules the machine no longer cites or the model cites: {stale}"


def test_ranges_and_steps_are_read_as_the_rules_they_name() -> None:
    assert _expand("R7.2", "R7.4") == {"R7.2", "R7.3", "R7.4"}
    assert _expand("R10.4.1", "R10.4.3") == {"R10.4.1", "R10.4.2", "R10.4.3"}
    assert _expand("P1", "P3") == {"P1", "P2", "P3"}
    assert _cited("R16.2 steps 1-2 (R16.2.1-R16.2.2), D6, P7") == {"R16.2", "R16.2.1", "R16.2.2",
                                                                    "D6", "P7"}
    ids, steps = _defined()
    assert _exists("R8.3.4", ids, steps) and not _exists("R8.3.5", ids, steps)
    assert not _exists("R99.1", ids, steps)
