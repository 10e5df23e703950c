"""The rule index: each numbered rule of specs/*.md, and the test files that name it.

A test file *names* a rule in its module docstring, or in the function name or the
docstring of one of its tests. In a name, the rule id is written in upper case with its
dots as underscores (``test_R10_9_…``), and several ids may follow each other
(``test_P13_R9_6_…``); in a name with a double underscore (``test_E1_<what>__R16_2_P7``,
the scenario tests) only the part after ``__`` names rules, the part before being the
scenario's id and what it shows. In a docstring the id is written as in the specs
(``R10.9``, ``P13``; "§10.9" is the reference's numbering, not a rule id). A sub-rule
names its rule (``R20.1b`` and ``R8.3.2`` name ``R20.1`` and ``R8.3``). The scenario
tests, collected from the corpus's definitions, name the rules their definitions list
(`collected_ids`).

Each rule belongs to a *family* (`family_of`), and each family to its test files
(`family_files`): the section of specs/core.md for an R rule (``R10`` ->
``test_R10_*.py``), the spec file for the others (``P`` -> ``test_protocol.py``, …).
The index fails when a rule is named by no test file, or by none of its family, unless
the rule is listed in `UNNAMED` or `UNFILED` with the reason; a listed rule that has
since been named (or filed) fails too, so the lists only shrink.

``.venv/bin/python tests/test_rule_index.py`` prints the whole index; tests/README.md says
where a new test goes.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from fnmatch import fnmatch
from pathlib import Path

from machine.conformance.coverage import rule_ids

ROOT = Path(__file__).resolve().parent.parent
SPECS = ROOT / "specs"
TESTS = ROOT / "tests"

#: A rule id as written in a docstring: R10.9, R20.1b, R8.3.2, R18, P13, L2, V22, E4, S9,
#: RT15, D5. Not "§10.9" (the reference's numbering) nor part of a longer word or number.
_DOC_ID = re.compile(r"(?<![\w§.])(RT\d+|R\d+(?:\.\d+)*[a-z]?|W\d+(?:\.\d+)?|[PLVESD]\d+)"
                     r"(?![\w]|\.\d)")
#: "scenario E3", "scenarios D5–D7": scenario ids, not rules.
_SCENARIO_REF = re.compile(r"[Ss]cenarios? [A-H]\d+(?:[–-][A-H]?\d+)?")
#: One token of a test name that starts a rule id: R10, RT15, P13, V8, …
_NAME_ID = re.compile(r"(RT|[RPLVESDW])(\d+)")
_NAME_PART = re.compile(r"\d+[a-z]?")


def spec_rules() -> list[str]:
    """The numbered rule ids specs/*.md define, in spec order (informative sections left out)."""
    def text(name: str) -> str:
        return (SPECS / name).read_text(encoding="utf-8")
    rules = rule_ids(text("core.md"))
    rules += re.findall(r"^## (P\d+)\.", text("protocol.md"), re.M)
    for name in ("log.md", "vocabulary.md"):
        rules += rule_ids(text(name), prefixes=("L", "V", "E"))
    rules += re.findall(r"^\*\*(S\d+)\.", text("persistence.md"), re.M)
    rules += re.findall(r"^\*\*(RT\d+)\.", text("runtime.md"), re.M)
    rules += re.findall(r"^(?:\* )?\*\*(W\d+(?:\.\d+)?)[. ]", text("providers.md"), re.M)
    return list(dict.fromkeys(rules))


def ids_in_name(name: str) -> list[str]:
    """The rule ids a test function's name states (see the module docstring)."""
    head, sep, tail = name.partition("__")
    tokens = (tail if sep else head.removeprefix("test_")).split("_")
    ids: list[str] = []
    index = 0
    while index < len(tokens):
        match = _NAME_ID.fullmatch(tokens[index])
        index += 1
        if match is None:
            continue
        rule = match.group(0)
        if match.group(1) in ("R", "W"):    # R and W rules are numbered within their section
            while index < len(tokens) and _NAME_PART.fullmatch(tokens[index]):
                rule += "." + tokens[index]
                index += 1
        ids.append(rule)
    return ids


def ids_in_docstring(doc: str) -> list[str]:
    return _DOC_ID.findall(_SCENARIO_REF.sub("", doc))


def named_ids(source: str) -> set[str]:
    """The rule ids one test module names: in its docstring, and in the names and docstrings
    of its tests."""
    tree = ast.parse(source)
    ids = set(ids_in_docstring(ast.get_docstring(tree) or ""))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            ids.update(ids_in_name(node.name))
            ids.update(ids_in_docstring(ast.get_docstring(node) or ""))
    return ids


def names(rule: str, named: str) -> bool:
    """Whether naming *named* names *rule*: the rule itself, a sub-rule or a lettered part."""
    return named == rule or named.startswith(rule + ".") or (
        named.startswith(rule) and named[len(rule):].isalpha())


#: Tests about rule ids themselves: their docstrings cite ids as examples.
ABOUT_IDS = frozenset({"test_rule_index.py", "test_model_citations.py"})


def collected_ids(name: str) -> set[str]:
    """The rule ids named by the tests a module collects from data rather than writes as
    functions: tests/test_scenarios.py runs one test per definition of the scenario corpus
    (`machine.conformance.corpus`), and each test names the rules its definition lists."""
    if name != "test_scenarios.py":
        return set()
    from machine.conformance.corpus import scenarios
    return {rule for definition in scenarios() for rule in definition.rules}


def rule_index(files: Iterable[Path] | None = None) -> dict[str, list[str]]:
    """For each spec rule: the test files (names) that name it, sorted."""
    paths = files if files is not None else sorted(TESTS.glob("test_*.py"))
    named_by_file = {path.name: named_ids(path.read_text(encoding="utf-8")) | collected_ids(path.name)
                     for path in paths if path.name not in ABOUT_IDS}
    return {rule: sorted(file for file, named in named_by_file.items()
                         if any(names(rule, n) for n in named))
            for rule in spec_rules()}


# --------------------------------------------------------------------------
# Families: where the tests of a rule are filed
# --------------------------------------------------------------------------

def family_of(rule: str) -> str:
    """R rules: their section of specs/core.md (R10.9 -> R10); the others: their spec file."""
    if rule.startswith("RT"):
        return "RT"
    if rule.startswith("R"):
        return rule.split(".")[0]
    return {"D": "D", "P": "P", "L": "L", "V": "V", "E": "V", "S": "S", "W": "W"}[rule[0]]


#: Test files of a family, as patterns (fnmatch). Every R<n> family also has the files
#: ``test_R<n>_*.py``; the other families the files named after their spec.
FAMILY_FILES: dict[str, tuple[str, ...]] = {
    "R4": ("test_state.py", "test_machines.py"),
    "R19": ("test_reentrancy.py", "test_runtime_reentrancy.py", "test_differential.py",
            "test_reach.py"),
    "R20": ("test_invariants.py", "test_internal_failures.py", "test_explore.py"),
    # A difference from the original (D) is tested with the rule it changes, wherever that
    # rule's tests are filed; tests/test_differences.py holds those of the fidelity work.
    "D": ("test_*.py",),
    "P": ("test_protocol.py", "test_internal_failures.py"),
    "L": ("test_log.py", "test_logfiles.py", "test_cli_log.py"),
    "V": ("test_vocabulary.py", "test_codec.py", "test_payloads.py", "test_deep_values.py",
          "test_hostile_values.py"),
    "S": ("test_store_*.py",),
    "RT": ("test_runtime_*.py",),
    "W": ("test_providers*.py",),
}


def family_files(family: str) -> tuple[str, ...]:
    own = (f"test_{family}_*.py",) if re.fullmatch(r"R\d+", family) else ()
    return own + FAMILY_FILES.get(family, ())


def in_family(rule: str, file: str) -> bool:
    return any(fnmatch(file, pattern) for pattern in family_files(family_of(rule)))


# --------------------------------------------------------------------------
# Exemptions, each with its reason. A rule leaves the list when a test names it.
# --------------------------------------------------------------------------

#: Rules no test names.
UNNAMED: dict[str, str] = {}

#: Rules named, but by no test file of their family.
UNFILED: dict[str, str] = {}


# --------------------------------------------------------------------------
# The index
# --------------------------------------------------------------------------


def test_rule_index_names_every_rule_in_its_family() -> None:
    """Each spec rule is named by a test file, and by one of its family, or is exempt; the
    exemptions name rules of the specs and still hold."""
    index = rule_index()
    rules = list(index)
    assert len(rules) > 200 and {"R10.9", "R19", "P13", "L2", "V15", "E4", "S9", "RT15", "D5"} <= set(rules)
    unnamed = [rule for rule, files in index.items() if not files]
    unfiled = [rule for rule, files in index.items()
               if files and not any(in_family(rule, file) for file in files)]
    filed = len(rules) - len(unnamed) - len(unfiled)
    print_index(index)
    print(f"\nrule index: {len(rules)} rules; {len(rules) - len(unnamed)} named by a test file, "
          f"{filed} of them in a file of their family; {len(unnamed)} unnamed and "
          f"{len(unfiled)} unfiled, each exempt with its reason")
    assert set(UNNAMED) | set(UNFILED) <= set(rules), "exempt rules the specs do not define"
    assert [r for r in unnamed if r not in UNNAMED] == [], \
        "rules no test names: name them in a test of their family (tests/README.md)"
    assert [r for r in unfiled if r not in UNFILED] == [], \
        "rules named only outside their family: add a test to the family's file"
    assert [r for r in UNNAMED if r not in unnamed] == [], \
        "named now: remove these rules from UNNAMED (or move them to UNFILED)"
    assert [r for r in UNFILED if r not in unfiled] == [], \
        "filed now (or unnamed): remove these rules from UNFILED"


def test_rule_ids_are_read_from_test_names_and_docstrings() -> None:
    assert ids_in_name("test_R10_9_prepare_failure_ends_the_batch") == ["R10.9"]
    assert ids_in_name("test_P13_R15_4_a_header_that_is_not_json") == ["P13", "R15.4"]
    assert ids_in_name("test_V3_V4_V8_registration_errors") == ["V3", "V4", "V8"]
    assert ids_in_name("test_R20_1b_monitor_error_names_its_rule") == ["R20.1b"]
    assert ids_in_name("test_RT15_adapter_maps_errors") == ["RT15"]
    assert ids_in_name("test_L5_step_end_1_is_refused") == ["L5"]
    assert ids_in_name("test_E1_cancel_notifies_before_clearing__R16_2_P7") == ["R16.2", "P7"]
    assert ids_in_name("test_a3_b_empty_id") == [] and ids_in_name("test_G4_fork") == []
    assert ids_in_docstring("R9.6 step 3, P13, R15.3 (§9.6); R20.1b. Scenario E3 and D5.") == [
        "R9.6", "P13", "R15.3", "R20.1b", "D5"]
    assert ids_in_docstring("HTTP2, R10.9.x, version 1.2, L1–L14") == ["R10.9", "L1", "L14"]
    assert names("R20.1", "R20.1b") and names("R8.3", "R8.3.2") and names("R19", "R19")
    assert not names("R1", "R10.2") and not names("R10.1", "R10.12") and not names("V1", "V15")
    assert family_of("R10.9") == "R10" and family_of("E4") == "V" and family_of("RT3") == "RT"
    assert in_family("R10.9", "test_R10_tools.py") and not in_family("R10.9", "test_R1_x.py")
    assert in_family("S9", "test_store_damage.py") and in_family("V1", "test_codec.py")


def print_index(index: dict[str, list[str]]) -> None:
    """One line per rule: its family, the files that name it; marked ``-`` when exempt
    (UNNAMED, UNFILED) and ``!`` when it fails the index."""
    for rule, files in index.items():
        mark = (" " if any(in_family(rule, f) for f in files) else
                "-" if rule in UNFILED or rule in UNNAMED else "!")
        print(f"{mark} {rule:7} {family_of(rule):4} {', '.join(files) or '(none)'}")


if __name__ == "__main__":
    print_index(rule_index())
