"""The conformance corpus (specs/conformance/vectors): schema, loader, coverage, and a green run here."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]  # types-jsonschema is not a dev dependency
import pytest

from machine.conformance.checker import run_all
from machine.conformance.corpus.build import build
from machine.conformance.corpus.examples import examples
from machine.conformance.coverage import (
    DIMENSIONS,
    configuration_of,
    covered_by,
    pair_coverage,
    rule_ids,
)
from machine.conformance.subjects import LocalSubject
from machine.conformance.vectors import (
    MalformedError,
    Vector,
    dump_vector,
    find_vectors,
    load_vector,
    parse_vector,
)

ROOT = Path(__file__).resolve().parents[1]
SPECS = ROOT / "specs"
CORPUS = SPECS / "conformance" / "vectors"
SCHEMA = json.loads((SPECS / "conformance" / "vector.schema.json").read_text(encoding="utf-8"))

#: Rules no vector can reach: they concern persistence, not the sans-I/O core, or the
#: implementation's own state, which the protocol does not show.
EXEMPT = {"D8": "storage damage on load (specs/persistence.md); the core has no storage",
          "D16": "refusing to resume an unreadable session (specs/persistence.md S34); the "
                 "core has no storage",
          "R4.11": "couplings of the implementation's state (tests/test_state.py checks them "
                   "at every input and output of every vector)",
          "R20.5": "provider requests are the adapters' (specs/providers.md), not outputs of "
                   "the port protocol (InvariantMonitor checks them at every position of every "
                   "vector, tests/test_providers_reach.py)",
          "R4.12": "snapshots are an API of the implementation, not of the port protocol "
                   "(tests/test_R4_snapshots.py restores the core at every input and output "
                   "of every vector)",
          "R4.13": "the loop's declared graph is the implementation's own state, which the "
                   "protocol does not show (the invariant monitor checks every phase change "
                   "against it at every output of every vector, tests/test_R4_loop.py)"}

#: scenarios.md scenarios of the core; G4 (fork) and G7 (loading a live session) are
#: persistence-only.
SCENARIOS = [
    "A1", "A2", "A3", "A4", "A5", "A6", "A8", "A10", "A12",
    "B1", "B2", "B3", "B4", "B7", "B8", "B9", "B10", "B11",
    "C1", "C2", "C3", "C5", "C7", "C8", "C10", "C13",
    "D1", "D2", "D3", "D5", "D8",
    "E1", "E2", "E3", "E4", "E6", "E7", "E9", "E10", "E11", "E12", "E14", "E16", "E18", "E19", "E21",
    "F1", "F2", "F5", "F6", "F7", "F8", "F9", "F10", "F12",
    "G1", "G2", "G6", "G8", "H6", "H7", "H9",
]

VECTOR_FILES = sorted(find_vectors([CORPUS]))


@pytest.fixture(scope="module")
def corpus() -> list[Vector]:
    return [load_vector(path) for path in VECTOR_FILES]


def test_the_corpus_is_substantial() -> None:
    assert len(VECTOR_FILES) >= 200


def test_every_vector_validates_against_the_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    validator = jsonschema.Draft202012Validator(SCHEMA)
    problems = []
    for path in VECTOR_FILES:
        for error in validator.iter_errors(json.loads(path.read_text(encoding="utf-8"))):
            problems.append(f"{path.name}: {error.json_path}: {error.message[:120]}")
    assert problems == []


def test_every_vector_loads_and_is_written_canonically(corpus: list[Vector]) -> None:
    for vector, path in zip(corpus, VECTOR_FILES, strict=True):
        assert vector.id == path.stem
        assert dump_vector(vector) == path.read_text(encoding="utf-8"), path.name
        assert all(vector.line(i) > 0 for i in range(len(vector.steps)))


def test_every_vector_passes_here(corpus: list[Vector]) -> None:
    outcomes = run_all(corpus, LocalSubject)
    failed = [o.vector.id for o in outcomes if o.status != "passed"]
    assert failed == []


def test_titles_rules_and_tags_are_hand_written(corpus: list[Vector]) -> None:
    for vector in corpus:
        assert len(vector.title) >= 30, vector.id
        assert vector.rules, vector.id
        assert {"scenario", "matrix", "rule"} & set(vector.tags), vector.id
        differs = [t for t in vector.tags if re.fullmatch(r"D[1-9][0-9]*", t)]
        if differs:
            assert "differs-from-original" in vector.tags, vector.id


def _defined_ids() -> set[str]:
    ids = set(rule_ids((SPECS / "core.md").read_text(encoding="utf-8")))
    protocol = (SPECS / "protocol.md").read_text(encoding="utf-8")
    ids |= set(re.findall(r"^## (P\d+)\.", protocol, re.M))
    for name in ("log.md", "vocabulary.md"):
        ids |= set(rule_ids((SPECS / name).read_text(encoding="utf-8"), prefixes=("L", "V", "E")))
    return ids


DIFFERENCE = re.compile(r"D[1-9][0-9]*")
DIFFERENCES = (SPECS / "differences.md").read_text(encoding="utf-8")
CAPABILITIES_OF_EXTENSIONS = {"prepare-result", "request-header"}


def _differences(names: tuple[str, ...]) -> set[str]:
    return {n for n in names if DIFFERENCE.fullmatch(n)}


def test_D_tags_a_vector_lists_a_difference_in_its_rules_iff_in_its_tags(corpus: list[Vector]) -> None:
    """specs/differences.md: a vector carries ``differs-from-original`` and ``Dn`` exactly
    when the original's outputs differ because of Dn; its rules list Dn exactly then too."""
    for vector in corpus:
        tagged, listed = _differences(vector.tags), _differences(vector.rules)
        assert tagged == listed, (vector.id, sorted(tagged), sorted(listed))
        assert ("differs-from-original" in vector.tags) == bool(tagged), vector.id


def test_D_tags_every_difference_has_a_vector_and_the_table_names_them(corpus: list[Vector]) -> None:
    """Each D of specs/core.md has at least one vector (D8 excepted: the core has no storage),
    and the table of specs/differences.md and the entry's *Vectors:* line in specs/core.md list
    exactly the vectors tagged with it."""
    core = (SPECS / "core.md").read_text(encoding="utf-8")
    declared = set(re.findall(r"^\*\*(D\d+)\. ", core, re.M))
    assert declared == {f"D{n}" for n in range(1, 17)}
    by_tag: dict[str, set[str]] = {d: set() for d in declared}
    for vector in corpus:
        for difference in _differences(vector.tags):
            by_tag[difference].add(vector.id)
    table = dict(re.findall(r"^\| (D\d+) \| (.+) \|$", DIFFERENCES, re.M))
    # each D entry of core.md ends with "*Vectors:* a, b, c." (wrapped over lines)
    entries = {d: " ".join(v.split()) for d, v in re.findall(
        r"^\*\*(D\d+)\. .*?\*Vectors:\* (.*?)\.$", core, re.M | re.S)}
    assert set(entries) == declared
    assert set(table) == declared
    for difference in sorted(declared, key=lambda d: int(d[1:])):
        named = {v.strip() for v in table[difference].split(",")}
        if difference in EXEMPT:
            assert by_tag[difference] == set()
            continue
        assert by_tag[difference], f"{difference} has no vector"
        assert named == by_tag[difference], (difference, sorted(named ^ by_tag[difference]))
        listed = {v.strip() for v in entries[difference].split(",")}
        assert listed == by_tag[difference], ("core.md", difference,
                                              sorted(listed ^ by_tag[difference]))


def test_D_tags_each_differing_vector_says_where_the_original_departs(corpus: list[Vector]) -> None:
    """A vector tagged differs-from-original carries ``"original": {"step", "does", "where"}``
    (and no other vector does): N names an existing step at or after the vector's first input;
    ``does`` says what the original does there and ``where`` cites its code as file:line at
    the anchor commit."""
    cited = re.compile(r"^packages/[\w./-]+\.ts:\d+.*\(at 5a128f3a69\)$")
    for vector in corpus:
        differs = "differs-from-original" in vector.tags
        assert (vector.original_step is not None) == differs, vector.id
        if vector.original_step is not None:
            first_input = next(i for i, step in enumerate(vector.steps) if step.kind == "in")
            assert first_input < vector.original_step <= len(vector.steps), vector.id
            assert vector.original_does and len(vector.original_does) > 40, vector.id
            assert vector.original_where and cited.match(vector.original_where), (
                vector.id, vector.original_where)


def test_extension_tags_name_a_capability_a_port_may_decline(corpus: list[Vector]) -> None:
    """PROTOCOL.md §Skipping: ``extension`` goes with ``extension:<capability>``, and the
    capability is one of the seams turnstile has and the original lacks."""
    for vector in corpus:
        named = {t[len("extension:"):] for t in vector.tags if t.startswith("extension:")}
        assert ("extension" in vector.tags) == bool(named), vector.id
        assert named <= CAPABILITIES_OF_EXTENSIONS, vector.id
        assert named <= vector.requires, vector.id
        assert not (named and "differs-from-original" in vector.tags), vector.id


def test_every_listed_rule_exists(corpus: list[Vector]) -> None:
    defined = _defined_ids()
    unknown = {(v.id, r) for v in corpus for r in v.rules
               if r not in defined and r.rsplit(".", 1)[0] not in defined}
    assert unknown == set()


def test_every_rule_of_the_core_spec_is_covered(corpus: list[Vector]) -> None:
    ids = rule_ids((SPECS / "core.md").read_text(encoding="utf-8"))
    assert len(ids) > 100 and "R19" in ids and "D1" in ids and "R15.2" in ids
    coverage = covered_by([r for r in ids if r not in EXEMPT], {v.id: v.rules for v in corpus})
    missing = sorted(rule for rule, vectors in coverage.items() if not vectors)
    percent = 100 * (len(coverage) - len(missing)) / len(coverage)
    assert missing == [], f"rule coverage {percent:.1f}%: no vector covers {missing}"


#: (rule, dimension, class) pairs that must stay covered: the tool-batch rules with a
#: parallel pool larger than its limit, and admission, cancel and D6 on a resumed session.
REQUIRED_PAIRS = [
    *((rule, "tools", "pool over the limit")
      for rule in ("R10.2", "R10.3", "R10.4", "R10.7", "R10.9", "R10.10", "R10.11")),
    *((rule, "log", "seeded") for rule in ("R7.10", "R9.6", "R10.2", "R13.3", "R16.2", "D6")),
    *((rule, "publish", "unpublished") for rule in ("P11", "R16.2", "R17.4")),
]


def test_rules_are_covered_under_each_configuration(corpus: list[Vector]) -> None:
    """(rule × configuration) coverage: every class of every dimension is used by some
    vector, the REQUIRED_PAIRS are covered, and the pair counts are reported."""
    ids = [r for r in rule_ids((SPECS / "core.md").read_text(encoding="utf-8")) if r not in EXEMPT]
    ids += sorted(set(re.findall(r"^## (P\d+)\.", (SPECS / "protocol.md").read_text(
        encoding="utf-8"), re.M)))
    classes = {v.id: configuration_of(v.config, v.seed, [s.value for s in v.steps
                                                         if s.kind == "out"]) for v in corpus}
    used = {(dimension, cls) for found in classes.values() for dimension, cls in found.items()}
    unused = [(d, c) for d, cs in DIMENSIONS.items() for c in cs if (d, c) not in used]
    assert unused == [], f"no vector runs under {unused}"
    pairs = pair_coverage(ids, {v.id: (v.rules, classes[v.id]) for v in corpus})
    missing = [pair for pair in REQUIRED_PAIRS if not pairs[pair]]
    assert missing == [], f"uncovered (rule, dimension, class) pairs: {missing}"
    covered = sum(1 for vectors in pairs.values() if vectors)
    print(f"\n(rule x configuration) coverage: {covered} of {len(pairs)} pairs; " + "; ".join(
        f"{d}: " + ", ".join(f"{c} {sum(1 for r in ids if pairs[(r, d, c)])}" for c in cs)
        for d, cs in DIMENSIONS.items()))


def test_configuration_of_classifies_the_tool_pools_a_vector_exercises() -> None:
    def message(*names: str) -> dict[str, Any]:
        return {"out": "event", "type": "assistant/message", "data": {"message": {"content": [
            {"type": "tool-call", "id": f"c{i}", "name": n, "arguments": "{}"}
            for i, n in enumerate(names)]}}}
    config = {"toolModes": {"p": "parallel"}, "maxParallelToolCalls": 2, "publish": False,
              "sessionStart": "resume"}
    assert configuration_of(config, [{}], [message("p", "p", "p")]) == {
        "log": "seeded", "publish": "unpublished", "start": "resume",
        "tools": "pool over the limit"}
    assert configuration_of(config, [], [message("p", "e", "p")])["tools"] == \
        "parallel within the limit"
    assert configuration_of({}, [], [message("e"), message()])["tools"] == "exclusive"
    assert configuration_of({}, [], [])["tools"] == "no tools"


def test_every_scenario_and_matrix_row_has_vectors(corpus: list[Vector]) -> None:
    tags = {t for v in corpus for t in v.tags}
    assert {f"scenario:{s}" for s in SCENARIOS} <= tags
    rows = re.findall(r"^\| (\d+)\. ", (SPECS / "core.md").read_text(encoding="utf-8"), re.M)
    assert rows and {f"matrix:row{r}" for r in rows} <= tags
    for row in rows:
        commands = {v.id.split("-", 1)[1] for v in corpus if f"matrix:row{row}" in v.tags}
        assert commands >= {"steer", "inject", "followup", "cancel"} or commands == {"all"}, row


def test_the_corpus_is_what_the_authoring_scripts_write() -> None:
    """``python -m machine.conformance.corpus --check``: every definition reviewed, no vector
    stale, none missing or extra."""
    texts, problems = build()
    assert problems == {}
    stale = [i for i, text in texts.items()
             if (CORPUS / f"{i}.json").read_text(encoding="utf-8") != text]
    assert stale == []
    assert set(texts) == {p.stem for p in VECTOR_FILES}


def test_the_example_logs_are_what_their_generator_writes() -> None:
    """``python -m machine.conformance.corpus.examples --check``: specs/examples is fresh."""
    for name, text in examples().items():
        assert (SPECS / "examples" / name).read_bytes() == text.encode("utf-8"), name


def test_rule_ids_reads_ranges_sections_and_skips_informative_ones() -> None:
    text = """## R7. Admission
**R7.1 Who.** x
**R7.10 Rejected** (blocked):
## R15. Classification
**R15.1–R15.3 Classification.** y
## R18. Quiescence
prose only
## R26. Remaining hazards (informative)
* **R26.1** With the window closed
## D. Differences
**D3. Drains reach a fixed point** (R8.5).
"""
    assert rule_ids(text) == ["R7.1", "R7.10", "R15.1", "R15.2", "R15.3", "R18", "D3"]
    assert covered_by(["R8", "R8.3", "R9.1"], {"v": ["R8.3.2"]}) == {
        "R8": ["v"], "R8.3": ["v"], "R9.1": []}


# --------------------------------------------------------------------------
# Malformed vectors: the loader and the schema both refuse, naming line and field
# --------------------------------------------------------------------------

GOOD: dict[str, Any] = {
    "version": 2, "id": "x", "title": "a title", "rules": ["R5.2"], "tags": [], "config": {},
    "steps": [{"in": "dispose"}, {"out": "live", "type": "agent/disposed"}, {"out": "none"}]}


def _variant(**changes: Any) -> dict[str, Any]:
    value: dict[str, Any] = json.loads(json.dumps(GOOD))
    for key, item in changes.items():
        if item is None:
            value.pop(key)
        else:
            value[key] = item
    return value


BAD = [
    (_variant(version=1), "/version", "must be 2"),
    (_variant(title=None), "/title", "is missing"),
    (_variant(rules=["R5.2", "Q1"]), "/rules/1", "must be a rule id"),
    (_variant(config={"toolModes": {"t": "sometimes"}}), "/config/toolModes/t", "exclusive"),
    (_variant(config={"colour": "blue"}), "/config/colour", "unknown configuration field"),
    (_variant(steps=[{"in": "dispose", "out": "none"}]), "/steps/0", "exactly one"),
    (_variant(steps=[{"in": "shout"}]), "/steps/0/in", "unknown input"),
    (_variant(steps=[{"in": "resolve", "effect": -1}]), "/steps/0/effect", "non-negative"),
    (_variant(steps=[{"in": "steer"}]), "/steps/0/message", "is missing"),
    (_variant(steps=[{"in": "dispose", "raises": "boom"}]), "/steps/0/raises", "must be one of"),
    (_variant(steps=[{"out": "event", "type": "turn/start", "seq": 0, "data": {}, "time": 5}]),
     "/steps/0/time", "time is omitted"),
    (_variant(steps=[{"out": "none", "type": "x"}]), "/steps/0/type", "no other fields"),
    (_variant(steps=[{"out": "effect", "effect": 0, "kind": "telepathy"}]), "/steps/0/kind",
     "effect kind"),
    (_variant(steps=[{"out": "live", "type": "agent/warning", "text": "x",
                      "loose": {"/missing": ""}}]), "/steps/0/loose/~1missing", "names no field"),
]


@pytest.mark.parametrize(("value", "field", "problem"), BAD,
                         ids=[f"{field}" for _, field, _ in BAD])
def test_malformed_vectors_are_refused_by_loader_and_schema(
        value: dict[str, Any], field: str, problem: str) -> None:
    text = json.dumps(value, indent=2)
    with pytest.raises(MalformedError) as caught:
        parse_vector(text, "bad.json")
    error = caught.value
    assert error.field == field and problem in error.problem, str(error)
    assert error.line is not None and str(error).startswith(f"bad.json:{error.line}: {field}: ")
    if field not in ("/config/colour", "/steps/0/loose/~1missing"):  # beyond what a schema says
        assert list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(value)), field
    assert not list(jsonschema.Draft202012Validator(SCHEMA).iter_errors(GOOD))


def test_malformed_json_names_line_and_column() -> None:
    with pytest.raises(MalformedError) as caught:
        parse_vector('{\n  "version": 2,\n  "id": oops\n}', "broken.json")
    assert str(caught.value).startswith("broken.json:3: invalid JSON: Expecting value (column 9)")


def test_the_line_of_a_field_in_a_pretty_printed_vector() -> None:
    text = dump_vector(GOOD).replace('{"in": "dispose"}', '{"in": "dispose", "effect": 1}')
    with pytest.raises(MalformedError) as caught:
        parse_vector(text, "v.json")
    assert (caught.value.line, caught.value.field) == (9, "/steps/0/effect")
