"""``turnstile check``: selection, known failures, JSON and JUnit results, versions (PROTOCOL.md §6).

Vectors are run in process (this implementation) and, where a failure is needed, through
the deliberately wrong example port; paths are given explicitly so each test runs a few.
"""

from __future__ import annotations

import json
import shlex
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from machine import __version__
from machine.cli.main import main
from machine.conformance.selection import (
    KnownFailuresError,
    Selection,
    load_known_failures,
    patterns,
)
from machine.conformance.vectors import find_vectors, load_vector
from machine.specfiles import corpus_info, vectors_dir

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "specs" / "conformance" / "vectors"
A1 = str(CORPUS / "A1-simple-prompt-turn.json")
A6 = str(CORPUS / "A6-two-idle-steers-two-turns.json")
A5 = str(CORPUS / "A5-idle-steer-is-a-prompt.json")
WRONG = shlex.join([sys.executable, "-m", "machine.conformance.examples.wrong_port", "--bug",
                    "idle-steer"])


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = main(["check", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def corpus() -> list[str]:
    return [load_vector(path).id for path in find_vectors([CORPUS])]


# --------------------------------------------------------------------------
# Selection
# --------------------------------------------------------------------------


def test_run_and_skip_select_by_id_glob(capsys: pytest.CaptureFixture[str]) -> None:
    ids = corpus()
    a_ids = [i for i in ids if i.startswith("A")]
    status, out, err = run(capsys, "--run", "A*", "--skip", "A1-*,A10-*", "-v")
    assert (status, err) == (0, "")
    passed = [line.removeprefix("PASS ") for line in out.splitlines() if line.startswith("PASS")]
    assert sorted(passed) == sorted(i for i in a_ids if not i.startswith(("A1-", "A10-")))
    assert out.splitlines()[-1] == (f"{len(passed)} passed, 0 failed, "
                                    f"{len(ids) - len(passed)} not selected")


def test_tag_and_rule_select_and_combine(capsys: pytest.CaptureFixture[str]) -> None:
    vectors = [load_vector(path) for path in find_vectors([CORPUS])]
    by_tag = [v.id for v in vectors if "cancel" in v.tags]
    status, out, _ = run(capsys, "--tag", "cancel")
    assert status == 0 and out.startswith(f"{len(by_tag)} passed, 0 failed")
    # a rule pattern matches the rules under it, never a longer number
    under = [v.id for v in vectors if any(r == "R16" or r.startswith("R16.") for r in v.rules)]
    status, out, _ = run(capsys, "--rule", "R16")
    assert status == 0 and out.startswith(f"{len(under)} passed, 0 failed")
    both = [v.id for v in vectors if "cancel" in v.tags
            and any(r.startswith("R16.") for r in v.rules) and v.id.startswith("M")]
    status, out, _ = run(capsys, "--tag", "cancel", "--rule", "R16", "--run", "M*", "-v")
    assert sorted(line[5:] for line in out.splitlines() if line.startswith("PASS")) == \
        sorted(both)


def test_the_selection_rules_themselves() -> None:
    vector = load_vector(A5)          # rules R5.3, R5.4, …, V13; tags scenario, scenario:A5
    assert Selection().selects(vector)
    assert Selection(run=("A?-idle-*",)).selects(vector)
    assert not Selection(run=("a5*",)).selects(vector)            # case-sensitive
    assert not Selection(skip=("A5-*",)).selects(vector)
    assert Selection(tags=("scenario:A*",)).selects(vector)
    assert not Selection(tags=("matrix",)).selects(vector)
    assert Selection(rules=("R5",)).selects(vector)
    assert Selection(rules=("R5.3",)).selects(vector)
    assert not Selection(rules=("R5.34",)).selects(vector)
    assert not Selection(rules=("R50",)).selects(vector)
    assert Selection(rules=("V1?",)).selects(vector)
    assert patterns(["a,b", " c ", ",,"]) == ("a", "b", "c")


def test_a_selection_that_matches_nothing_is_a_usage_error(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, A1, "--run", "Z*")
    assert (status, out) == (2, "")
    assert err == "turnstile check: no vector matches the selection (1 loaded)\n"


def test_the_same_vector_given_twice_runs_once(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, A1, A1, str(CORPUS), "--run", "A1-*")
    assert (status, out, err) == (0, f"1 passed, 0 failed, {len(corpus()) - 1} not selected\n",
                                  "")


# --------------------------------------------------------------------------
# Known failures
# --------------------------------------------------------------------------


def test_known_failures_keep_the_run_green_and_a_fixed_one_fails_it(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    known = tmp_path / "known-failures.txt"
    known.write_text("# myport\n\nA5-idle-steer-is-a-prompt   # routing ignores the window\n"
                     "A6-two-idle-steers-two-turns\n", encoding="utf-8")
    status, out, err = run(capsys, A5, A6, A1, "--port", WRONG, "--known-failures", str(known))
    assert (status, err) == (0, "")
    assert out == "1 passed, 0 failed, 2 known failures\n"
    status, out, _ = run(capsys, A5, A1, "--port", WRONG, "--known-failures", str(known), "-v")
    assert status == 0
    assert out.startswith(f"KNOWN FAIL A5-idle-steer-is-a-prompt ({A5})\n")
    assert "  known failure: routing ignores the window\n" in out
    assert "difference at /placement: expected \"queued\", got \"steering\"" in out
    # run here, where every vector passes: both listed vectors are now fixed
    status, out, err = run(capsys, A5, A6, A1, "--known-failures", str(known))
    assert status == 1
    assert (f"FIXED A5-idle-steer-is-a-prompt ({A5}): a known failure that passes now; "
            f"remove line 3 of {known}") in out
    assert f"remove line 4 of {known}" in out
    assert out.splitlines()[-1] == "1 passed, 0 failed, 2 known failures now pass"


def test_listed_ids_that_name_no_vector_are_noted(capsys: pytest.CaptureFixture[str],
                                                  tmp_path: Path) -> None:
    known = tmp_path / "known.txt"
    known.write_text("A5-idle-steer-is-a-prompt\nZ1-gone\nZ2-gone # removed upstream\n",
                     encoding="utf-8")
    status, out, err = run(capsys, A5, "--port", WRONG, "--known-failures", str(known))
    assert (status, out) == (0, "0 passed, 0 failed, 1 known failure\n")
    assert err == f"turnstile check: {known}: 2 listed ids name no vector of this run: " \
                  "Z1-gone, Z2-gone\n"


@pytest.mark.parametrize(("text", "problem"), [
    ("A1 A2\n", "1: one vector id per line, optionally followed by '# why'; got 'A1 A2'"),
    ("A1\nA*\n", "2: 'A*' is not a vector id (letters, digits, '.', '_' and '-'; globs are not "
                 "allowed here)"),
    ("A1\n# c\nA1 # again\n", "3: A1 is also listed on line 1"),
])
def test_a_malformed_known_failures_file_names_its_line(
        capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, problem: str) -> None:
    known = tmp_path / "known.txt"
    known.write_text(text, encoding="utf-8")
    with pytest.raises(KnownFailuresError) as raised:
        load_known_failures(known)
    assert str(raised.value) == f"{known}:{problem}"
    status, out, err = run(capsys, A1, "--known-failures", str(known))
    assert (status, out, err) == (2, "", f"turnstile check: known failures: {known}:{problem}\n")
    status, _, err = run(capsys, A1, "--known-failures", str(tmp_path / "none.txt"))
    assert status == 2 and err.endswith("none.txt: no such file\n")


def test_write_known_failures_lists_what_did_not_pass_and_keeps_reasons(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    known = tmp_path / "known.txt"
    status, out, err = run(capsys, A5, A6, A1, "--port", WRONG, "--write-known-failures",
                           str(known))
    assert status == 1 and out.endswith("1 passed, 2 failed\n")
    assert err == f"turnstile check: wrote {known} (2 vectors that did not pass)\n"
    text = known.read_text(encoding="utf-8")
    assert 'A5-idle-steer-is-a-prompt  # at /placement: expected "queued", got "steering"' in text
    assert "A1-simple-prompt-turn" not in text
    # with the file in place the run is green; rewriting it keeps an edited reason
    known.write_text(text.replace('# at /placement: expected "queued", got "steering"\nA6',
                                  "# see issue 12\nA6", 1), encoding="utf-8")
    status, out, _ = run(capsys, A5, A6, A1, "--port", WRONG, "--known-failures", str(known),
                         "--write-known-failures", str(known))
    assert (status, out) == (0, "1 passed, 0 failed, 2 known failures\n")
    assert "A5-idle-steer-is-a-prompt  # see issue 12" in known.read_text(encoding="utf-8")
    assert set(load_known_failures(known).entries) == {"A5-idle-steer-is-a-prompt",
                                                                           "A6-two-idle-steers-two-turns"}


# --------------------------------------------------------------------------
# JSON and JUnit
# --------------------------------------------------------------------------


def test_json_gives_one_object_per_vector_and_a_summary(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("{}", encoding="utf-8")
    status, out, err = run(capsys, A5, A1, str(bad), "--port", WRONG, "--json")
    assert status == 3 and "malformed vector" in err
    records = [json.loads(line) for line in out.splitlines()]
    assert records[0] == {"path": str(bad), "status": "malformed",
                          "message": f"{bad}:1: /config: is missing"}
    failed = records[1]
    assert (failed["vector"], failed["status"], failed["path"]) == \
        ("A5-idle-steer-is-a-prompt", "failed", A5)
    divergence = failed["divergence"]
    assert (divergence["step"], divergence["line"], divergence["kind"]) == (6, 14, "output")
    assert divergence["expected"]["placement"] == "queued"
    assert divergence["actual"]["placement"] == "steering"
    assert divergence["pointer"] == "/placement"
    assert divergence["difference"] == 'at /placement: expected "queued", got "steering"'
    assert records[2]["status"] == "passed" and "divergence" not in records[2]
    summary = records[3]
    assert summary["summary"] == {"passed": 1, "failed": 1, "error": 0, "skipped": 0,
                                  "known-failure": 0, "fixed": 0, "malformed": 1,
                                  "notSelected": 0}
    assert (summary["implementation"], summary["exit"]) == ("wrong-port", 3)
    assert summary["line"] == "1 passed, 1 failed"
    assert "corpus" not in summary                      # paths were given


def test_json_of_the_default_corpus_names_its_version(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "--json", "--run", "A1-*")
    summary = json.loads(out.splitlines()[-1])
    assert status == 0 and summary["corpus"] == corpus_info().corpus
    assert summary["implementation"] == f"turnstile {__version__}"


def test_json_of_a_port_error_and_of_an_input_divergence(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    garbage = shlex.join([sys.executable, "-m", "machine.conformance.examples.wrong_port",
                          "--bug", "garbage"])
    status, out, _ = run(capsys, A1, "--port", garbage, "--json")
    record = json.loads(out.splitlines()[0])
    assert status == 4 and record["status"] == "error"
    assert record["portFailure"]["step"] == 2 and record["portFailure"]["line"] == 10
    assert "not JSON" in record["portFailure"]["message"]
    vector = json.loads(Path(CORPUS / "A3-invalid-messages-refused.json").read_text("utf-8"))
    for step in vector["steps"]:
        step.pop("raises", None)
    edited = tmp_path / "A3-invalid-messages-refused.json"
    edited.write_text(json.dumps(vector), encoding="utf-8")
    status, out, _ = run(capsys, str(edited), "--json")
    divergence = json.loads(out.splitlines()[0])["divergence"]
    assert status == 1 and divergence["kind"] == "input"
    assert divergence["expected"] == "accepted"
    assert divergence["actual"].startswith("refused with a validation error: message.id")
    assert divergence["input"] == {k: v for k, v in vector["steps"][divergence["step"] - 1].items()
                                   if k != "note"}


def test_junit_report_has_one_case_per_vector(capsys: pytest.CaptureFixture[str],
                                              tmp_path: Path) -> None:
    known = tmp_path / "known.txt"
    known.write_text("A6-two-idle-steers-two-turns # known\n", encoding="utf-8")
    report = tmp_path / "report.xml"
    status, out, _ = run(capsys, A5, A6, A1, "--port", WRONG, "--known-failures", str(known),
                         "--junit", str(report))
    assert status == 1 and out.endswith("1 passed, 1 failed, 1 known failure\n")
    root = ET.parse(report).getroot()
    suite = root.find("testsuite")
    assert suite is not None
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"),
            suite.get("skipped")) == ("3", "1", "0", "1")
    cases = {case.get("name"): case for case in suite.iter("testcase")}
    assert set(cases) == {"A5-idle-steer-is-a-prompt", "A6-two-idle-steers-two-turns",
                          "A1-simple-prompt-turn"}
    failure = cases["A5-idle-steer-is-a-prompt"].find("failure")
    assert failure is not None and failure.get("message", "").startswith("at /placement")
    assert "FAIL A5-idle-steer-is-a-prompt" in (failure.text or "")
    skipped = cases["A6-two-idle-steers-two-turns"].find("skipped")
    assert skipped is not None and skipped.get("message") == "known failure: known"
    assert len(cases["A1-simple-prompt-turn"]) == 0
    assert cases["A1-simple-prompt-turn"].get("classname") == "conformance.scenario"
    status, _, err = run(capsys, A1, "--junit", str(tmp_path / "no" / "such" / "dir.xml"))
    assert status == 2 and "cannot write the JUnit report" in err


# --------------------------------------------------------------------------
# Versions
# --------------------------------------------------------------------------


def test_check_version_names_the_corpus_and_where_the_kit_is(
        capsys: pytest.CaptureFixture[str]) -> None:
    info = corpus_info()
    count = len(corpus())
    status, out, err = run(capsys, "--version")
    assert (status, err) == (0, "")
    assert out.splitlines() == [
        f"turnstile {__version__} (distribution turnstile-agent)",
        f"conformance corpus {info.corpus}: {count} vectors (vector format 2, adapter "
        "protocol 1, trace format 1)",
        f"kit: {info.path} (PROTOCOL.md, README.md, vector.schema.json, vectors/)"]
    status, out, _ = run(capsys, "--version", "--json")
    assert json.loads(out) == {"turnstile": __version__, "corpus": info.corpus,
                               "vectorFormat": 2, "adapterProtocol": 1, "traceFormat": 1,
                               "vectors": count, "kit": str(info.path)}


def test_corpus_json_agrees_with_the_formats_the_tools_speak() -> None:
    from machine.conformance.adapter import PROTOCOL_VERSION
    from machine.conformance.port import PROTOCOL_VERSION as CHECKER_PROTOCOL
    from machine.conformance.trace import TRACE_VERSION
    from machine.conformance.vectors import VERSION

    info = corpus_info()
    assert info.path == CORPUS.parent and vectors_dir() == CORPUS
    assert (info.vector_format, info.adapter_protocol, info.trace_format) == \
        (VERSION, PROTOCOL_VERSION, TRACE_VERSION)
    assert CHECKER_PROTOCOL == PROTOCOL_VERSION
    assert all(json.loads(path.read_text("utf-8"))["version"] == info.vector_format
               for path in find_vectors([CORPUS]))
    major, minor = info.corpus.split(".")
    assert major.isdigit() and minor.isdigit()
    protocol = (CORPUS.parent / "PROTOCOL.md").read_text(encoding="utf-8")
    assert f"The corpus version is `{info.corpus}`" in protocol


def test_corpus_version_follows_its_content() -> None:
    """PROTOCOL.md §6: the corpus version changes with the vectors. corpus.json keeps the
    corpus's digests at its version; a changed corpus must come with a new version (MAJOR
    when what a port's verdict depends on changed, MINOR otherwise) and new digests."""
    from machine.conformance.vectors import corpus_fingerprint

    recorded = json.loads((CORPUS.parent / "corpus.json").read_text("utf-8"))["fingerprint"]
    info = corpus_info()
    now = corpus_fingerprint([CORPUS])
    how = ("decide the new corpus version by PROTOCOL.md §6, set it in corpus.json and record "
           f"the digests there: fingerprint = {{'corpus': <version>, **{now}}}")
    assert recorded["corpus"] == info.corpus, f"the fingerprint is of another version: {how}"
    assert recorded["behaviour"] == now["behaviour"], (
        f"vector inputs, configs, seeds or expected outputs changed at corpus {info.corpus}"
        f" (a MAJOR change): {how}")
    assert recorded["description"] == now["description"], (
        f"vector titles, rules, tags or original steps changed at corpus {info.corpus}"
        f" (a MINOR change): {how}")


def test_the_corpus_fingerprint_separates_behaviour_from_description(tmp_path: Path) -> None:
    from machine.conformance.vectors import corpus_fingerprint

    source = next(iter(sorted(CORPUS.glob("A1-*.json"))))
    vector = json.loads(source.read_text("utf-8"))
    (tmp_path / "v.json").write_text(json.dumps(vector), "utf-8")
    base = corpus_fingerprint([tmp_path])
    vector["title"] += " (retitled)"
    (tmp_path / "v.json").write_text(json.dumps(vector), "utf-8")
    retitled = corpus_fingerprint([tmp_path])
    assert retitled["behaviour"] == base["behaviour"]
    assert retitled["description"] != base["description"]
    vector["steps"][-1] = {**vector["steps"][-1], "note": "changed"}
    (tmp_path / "v.json").write_text(json.dumps(vector), "utf-8")
    assert corpus_fingerprint([tmp_path])["behaviour"] != base["behaviour"]


def test_top_level_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"turnstile {__version__} (distribution turnstile-agent)\n"
