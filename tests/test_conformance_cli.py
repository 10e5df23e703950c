"""`turnstile check` (here), `turnstile record`, exit statuses and messages; strict comparison."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from machine.cli.main import main
from machine.conformance import cli
from machine.conformance.jsoncmp import first_difference, parse_pointer, pointer, same, same_frozen
from machine.conformance.recorder import record_draft
from machine.conformance.trace import verify_trace
from machine.conformance.vectors import dump_vector, load_vector
from machine.jsonvalue import freeze

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "specs" / "conformance" / "vectors"


def check(*paths: str, verbose: bool = False) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = cli.check(argparse.Namespace(paths=list(paths), port=None, timeout=1.0,
                                          verbose=verbose), out, err)
    return status, out.getvalue(), err.getvalue()


def copy_vector(tmp_path: Path, name: str, edit: Any = None) -> Path:
    data = json.loads((CORPUS / f"{name}.json").read_text(encoding="utf-8"))
    if edit is not None:
        edit(data)
    path = tmp_path / f"{data['id']}.json"
    path.write_text(dump_vector(data), encoding="utf-8")
    return path


def test_the_shipped_corpus_passes_by_default(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["check"]) == 0
    out = capsys.readouterr().out
    assert out.endswith(" passed, 0 failed\n") and out.count("\n") == 1


def test_a_wrong_expectation_is_reported_at_its_first_divergence(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        for step in data["steps"]:
            if step.get("type") == "agent/status" and step.get("status") == "idle":
                step["status"] = "resting"
    path = copy_vector(tmp_path, "E4-cancel-parked-quiet-item")
    bad = copy_vector(tmp_path, "B3-block-nothing-durable", edit)
    status, out, err = check(str(bad), str(path), verbose=True)
    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == f"FAIL B3-block-nothing-durable ({bad})"
    assert lines[3] == "  first divergence at step 17 (line 25), an output step"
    assert lines[4:10] == [
        "  inputs up to that point:",
        '    step 1 (line 9): {"in":"followup","message":{"id":"m1","role":"user","content":'
        '[{"type":"text","text":"do something"}],"source":{"kind":"user"}}}',
        '    step 8 (line 16): {"in":"resolve","effect":0,"value":null}',
        '    step 13 (line 21): {"in":"resolve","effect":1,"value":{"kind":"block",'
        '"reason":"blocked by policy"}}',
        '    step 16 (line 24): {"in":"resolve","effect":2,"value":null}',
        '  last matching output, step 14 (line 22): {"out":"effect","effect":2,"kind":"tick",'
        '"purpose":"rejected-admission"}']
    assert lines[-6:] == [
        '  expected: {"out":"live","type":"agent/status","status":"resting"}',
        '  actual:   {"out":"live","type":"agent/status","status":"idle"}',
        '  difference at /status: expected "resting", got "idle"',
        "",
        "PASS E4-cancel-parked-quiet-item",
        "1 passed, 1 failed"]


def test_a_refusal_divergence(tmp_path: Path) -> None:
    def edit(data: dict[str, Any]) -> None:
        for step in data["steps"]:
            step.pop("raises", None)
    path = copy_vector(tmp_path, "A3-invalid-messages-refused", edit)
    status, out, _ = check(str(path))
    assert status == 1
    assert "  expected: accepted" in out.splitlines()
    assert ("  actual:   refused with a validation error: message.id: must be a non-empty string"
            in out.splitlines())


def test_malformed_vectors_missing_paths_and_duplicates(tmp_path: Path) -> None:
    good = copy_vector(tmp_path, "A2-idle-inject-appends-only")
    bad = tmp_path / "bad.json"
    bad.write_text(dump_vector(load_vector(good)).replace('"id": "A2-idle-inject-appends-only"',
                                                          '"id": "bad"').replace(
        '{"in": "inject"', '{"in": "inject", "keep": 1'), encoding="utf-8")
    twin_dir = tmp_path / "twin"
    twin_dir.mkdir()
    (twin_dir / good.name).write_text(good.read_text(encoding="utf-8"), encoding="utf-8")
    status, out, err = check(str(tmp_path), str(tmp_path / "nowhere"))
    assert status == 3 and out == "1 passed, 0 failed\n"
    assert err.splitlines() == [
        f"turnstile check: {tmp_path / 'nowhere'}: no such file or directory",
        f"turnstile check: malformed vector: {bad}:9: /steps/0/keep: unknown field for input "
        "'inject' (allowed: message)",
        f"turnstile check: malformed vector: {twin_dir / good.name}: /id: "
        f"'A2-idle-inject-appends-only' is also the id of {good}"]
    assert "Traceback" not in out + err


def test_usage_errors(tmp_path: Path) -> None:
    assert check(str(tmp_path)) == (2, "", "turnstile check: no vectors found\n")
    assert main(["check", "--timeout", "soon"]) == 2


def test_record_a_draft_then_check_and_trace_it(tmp_path: Path) -> None:
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({
        "id": "idle-steer", "title": "an idle steer is queued and runs as a prompt turn",
        "rules": ["R5.3"], "tags": ["rule"], "config": {},
        "steps": [
            {"in": "steer", "message": {"id": "s1", "role": "user", "content": [],
                                        "source": {"kind": "user"}}},
            {"pull": "all"},
            {"in": "resolve", "effect": 0},
            {"pull": 2},
            {"in": "resolve", "effect": 99, "note": "refused: never requested"},
            {"in": "resolve", "effect": 1, "value": {"kind": "block", "reason": "no"}},
        ]}), encoding="utf-8")
    vector = record_draft(draft)
    assert [s.raises for s in vector.steps if s.kind == "in"] == [None, None, "protocol", None]
    assert vector.steps[-1].value == {"out": "none"}
    out_file = tmp_path / "idle-steer.json"
    assert main(["record", str(draft), "-o", str(out_file)]) == 0
    assert check(str(out_file)) == (0, "1 passed, 0 failed\n", "")
    trace_file = tmp_path / "idle-steer.jsonl"
    assert main(["record", str(draft), "--trace", "-o", str(trace_file)]) == 0
    assert verify_trace(trace_file).ok


def test_record_refuses_a_malformed_draft(tmp_path: Path, capsys: pytest.CaptureFixture[str]
                                          ) -> None:
    draft = tmp_path / "draft.json"
    draft.write_text('{\n  "steps": [\n    {"pull": 0}\n  ]\n}\n', encoding="utf-8")
    assert main(["record", str(draft)]) == 3
    assert capsys.readouterr().err == (f"turnstile record: malformed draft: {draft}:3: "
                                       "/steps/0/pull: must be a positive number of outputs or "
                                       '"all"\n')


# --------------------------------------------------------------------------
# Strict comparison
# --------------------------------------------------------------------------


def test_strict_json_comparison() -> None:
    assert same({"a": [1, 2.0, None]}, {"a": [1.0, 2, None]})
    assert not same({"a": True}, {"a": 1}) and not same([0], [False])
    assert not same({"a": 1}, {"a": 1, "b": 2})
    assert str(first_difference({"a": {"b": [1, 2]}}, {"a": {"b": [1]}})) == \
        "at /a/b: expected 2 item(s), got 1"
    assert str(first_difference({"a": 1}, {"a": 1, "z": 0})) == "at /z: unexpected field (got 0)"
    assert str(first_difference({"m": "prefix: x"}, {"m": "prefix: y"}, {("m",): "prefix: "})) \
        is None or first_difference({"m": "p: x"}, {"m": "p: y"}, {("m",): "p: "}) is None
    assert str(first_difference({"m": "p: x"}, {"m": "q"}, {("m",): "p: "})) == \
        'at /m: expected a string starting with "p: ", got "q"'
    assert pointer(("a/b", "c~d", 0)) == "/a~1b/c~0d/0"
    assert parse_pointer("/a~1b/c~0d/0") == ("a/b", "c~d", "0")


JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.floats(-2, 2) | st.text(max_size=3),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=2),
                                                                                inner, max_size=3),
                    max_leaves=10)


@given(JSON, JSON)
def test_same_frozen_agrees_with_same(a: Any, b: Any) -> None:
    assert same_frozen(freeze(a), b) == same(a, b)
    assert same_frozen(freeze(a), json.loads(json.dumps(a))) == same(a, json.loads(json.dumps(a)))


def test_an_implementation_that_crashes_fails_that_vector_only() -> None:
    from machine.conformance.checker import format_outcome, run_all
    from machine.conformance.subjects import LocalSubject

    class Crashing(LocalSubject):
        def pull(self, count: int) -> list[dict[str, Any] | None]:
            raise RuntimeError("boom")

    vectors = [load_vector(CORPUS / "A2-idle-inject-appends-only.json")]
    outcomes = run_all(vectors, Crashing)
    assert outcomes[0].status == "failed"
    assert format_outcome(outcomes[0])[-2:] == [
        '  expected: {"out":"live","type":"session/created"}',
        "  actual:   the implementation raised RuntimeError: boom"]


def test_loose_fields_only_need_their_prefix(tmp_path: Path) -> None:
    prefix = "prompt admission returned an invalid decision: "

    def reword(data: dict[str, Any]) -> None:
        for step in data["steps"]:
            if step.get("type") == "agent/warning":
                step["text"] = prefix + "worded differently by another implementation"
    path = copy_vector(tmp_path, "R-invalid-decisions", reword)
    assert check(str(path))[0] == 0

    def strict(data: dict[str, Any]) -> None:
        reword(data)
        for step in data["steps"]:
            step.pop("loose", None)
    path = copy_vector(tmp_path, "R-invalid-decisions", strict)
    status, out, _ = check(str(path))
    assert status == 1 and "  difference at /text: expected" in out


@pytest.mark.parametrize("depth", [5000, 100_000])
def test_PROTOCOL_5_record_reports_a_draft_nested_too_deeply_as_malformed_exit_3(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], depth: int) -> None:
    """PROTOCOL.md §5 (exit 3: a malformed draft, one nested too deeply to parse included;
    a regression of issue 14.8, where `turnstile record` on deeply nested JSON exited 70,
    internal error): it is a malformed draft, as for check, run and verify-trace."""
    nested = "[" * depth + "]" * depth
    for text in (nested, '{"steps": [{"in": "followup", "message": ' + nested + '}]}'):
        draft = tmp_path / "draft.json"
        draft.write_text(text, encoding="utf-8")
        assert main(["record", str(draft)]) == 3
        err = capsys.readouterr().err
        assert err == f"turnstile record: malformed draft: {draft}: invalid JSON: nested too deeply\n"
        assert main(["check", str(draft)]) == 3
        assert "nested too deeply" in capsys.readouterr().err


def test_record_of_a_value_deeper_than_V1_records_the_refusal(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A draft that parses but carries a value deeper than V1 allows: the followup is
    recorded as refused (validation), and the vector checks."""
    nested = "[" * 300 + "]" * 300
    draft = tmp_path / "deep-draft.json"
    draft.write_text('{"id": "deep-draft", "steps": [{"in": "followup", "message": {"id": "m", '
                     '"role": "user", "content": [{"type": "x", "v": ' + nested + '}], '
                     '"source": {"kind": "user"}}}, {"pull": "all"}]}', encoding="utf-8")
    out = tmp_path / "deep-draft.json"
    assert main(["record", str(draft), "-o", str(out)]) == 0
    capsys.readouterr()
    vector = json.loads(out.read_text(encoding="utf-8"))
    assert vector["steps"][0]["raises"] == "validation"
    assert main(["check", str(out)]) == 0


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0", "soon"])
def test_PROTOCOL_5_1_check_refuses_a_timeout_that_is_not_a_positive_number(
        value: str, capsys: pytest.CaptureFixture[str]) -> None:
    """PROTOCOL.md 5.1: a timeout out of range or not finite is a usage error (exit 2)."""
    assert main(["check", "--timeout", value, "--port", "x"]) == 2
    assert "argument --timeout" in capsys.readouterr().err
