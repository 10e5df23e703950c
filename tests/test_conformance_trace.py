"""`turnstile verify-trace`: traces of another implementation checked step by step."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from machine.cli import terminal
from machine.conformance import cli, trace
from machine.conformance.trace import trace_lines, verify_trace
from machine.conformance.vectors import MalformedError, find_vectors, load_vector
from machine.core import AgentCore
from machine.events import LiveEvent
from machine.io import Control, Effect, Live
from machine.jsonvalue import FrozenDict

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "specs" / "conformance" / "vectors"
A5 = load_vector(CORPUS / "A5-idle-steer-is-a-prompt.json")
G6 = load_vector(CORPUS / "G6-resume-continues-numbering.json")


def write(path: Path, lines: list[str]) -> str:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return str(path)


def test_every_vector_as_a_trace_verifies(tmp_path: Path) -> None:
    lines: list[str] = []
    vectors = [load_vector(p) for p in find_vectors([CORPUS])]
    for vector in vectors:
        lines.extend(trace_lines(vector, implementation="turnstile"))
    report = verify_trace(write(tmp_path / "all.jsonl", lines))
    assert report.ok and report.sessions == len(vectors) and report.lines == len(lines)
    assert report.inputs + report.outputs + report.sessions == len(lines)


def test_a_divergence_is_reported_with_its_line_and_context(tmp_path: Path) -> None:
    lines = [line.replace('"placement":"queued"', '"placement":"steering"', 1) if i == 6 else line
             for i, line in enumerate(trace_lines(G6))]
    lines[0:0] = list(trace_lines(A5))          # a first session that agrees
    path = write(tmp_path / "t.jsonl", lines)
    report = verify_trace(path)
    divergence = report.divergence
    assert divergence is not None
    first = len(list(trace_lines(A5)))
    assert (divergence.line, divergence.session_line) == (first + 7, first + 1)
    assert [n for n, _ in divergence.context] == list(range(first + 1, first + 7))
    text = report.format()
    assert text[0] == f"{path}:{first + 7}: DIVERGES from turnstile (session starting at line " \
                      f"{first + 1})"
    assert text[-1] == 'difference at /placement: expected "queued", got "steering"'.join(
        ["  ", ""])
    assert text[-3].startswith("  observed (trace): ") and '"steering"' in text[-3]
    assert text[-2].startswith("  expected (turnstile): ") and '"queued"' in text[-2]


def test_refused_inputs_missing_outputs_and_extra_outputs(tmp_path: Path) -> None:
    header = json.dumps({"trace": 1, "config": {}})
    base = [header, '{"in":"dispose"}', '{"out":"live","type":"session/created"}']
    refused = [*base, '{"in":"steer","message":{"id":"","role":"user","content":[],'
               '"source":{"kind":"user"}},"raises":"disposed"}']
    report = verify_trace(write(tmp_path / "a.jsonl", refused))
    assert report.divergence is not None      # not torn down yet: the empty id is the problem
    assert report.divergence.expected == ("refused with a validation error: message.id: must be "
                                          "a non-empty string")
    assert report.divergence.observed.endswith(" refused with a disposed error")
    premature = [*base, '{"out":"none"}']
    report = verify_trace(write(tmp_path / "b.jsonl", premature))
    assert report.divergence is not None and report.divergence.line == 4
    assert report.divergence.expected == '{"out":"live","type":"agent/created","status":"idle"}'
    ok = [*base, '{"out":"live","type":"agent/created","status":"idle"}',
          '{"out":"live","type":"agent/session-start","source":"startup"}',
          '{"out":"live","type":"agent/disposed"}', '{"out":"live","type":"session/disposed"}',
          '{"out":"none"}', '{"in":"followup","message":{"id":"m","role":"user","content":[],'
          '"source":{"kind":"user"}},"raises":"disposed"}']
    assert verify_trace(write(tmp_path / "c.jsonl", ok)).ok
    extra = [*ok, '{"out":"live","type":"agent/disposed","time":5}']
    report = verify_trace(write(tmp_path / "d.jsonl", extra))
    assert report.divergence is not None
    assert report.divergence.expected == "no output now (turnstile waits for an input)"


def test_durable_time_and_notes_are_ignored_but_bools_are_not_numbers(tmp_path: Path) -> None:
    lines = list(trace_lines(load_vector(CORPUS / "A1-simple-prompt-turn.json")))
    event = next(i for i, line in enumerate(lines) if '"out":"event"' in line)
    value = json.loads(lines[event])
    lines[event] = json.dumps({**value, "time": 1234.5, "note": "observed"})
    assert verify_trace(write(tmp_path / "ok.jsonl", lines)).ok
    settled = next(i for i, line in enumerate(lines) if "agent/settled" in line)
    lines[settled] = lines[settled].replace('"turn":1', '"turn":true')
    report = verify_trace(write(tmp_path / "bad.jsonl", lines))
    assert report.divergence is not None and report.divergence.line == settled + 1
    assert report.divergence.difference == "at /turn: expected 1, got true"
    lines[event] = json.dumps({**value, "seq": True})
    with pytest.raises(MalformedError, match=r"bad.jsonl:\d+: /seq: must be a non-negative"):
        verify_trace(write(tmp_path / "bad.jsonl", lines))


MALFORMED = [
    (["not json"], "t.jsonl:1: invalid JSON: Expecting value (column 1)"),
    (['{"in":"dispose"}'], 't.jsonl:1: an input before the first {"trace": 1, ...} header'),
    (['{"trace":2}'], "t.jsonl:1: /trace: must be 1"),
    (['{"trace":1,"config":{"toolModes":{"x":"often"}}}'],
     "t.jsonl:1: /config/toolModes/x: must map a tool name to 'exclusive' or 'parallel'"),
    (['{"trace":1}', '{"in":"resolve","effect":"0"}'],
     "t.jsonl:2: /effect: must be a non-negative integer effect id"),
    (['{"trace":1}', '{"out":"event","type":"x","data":{}}'], "t.jsonl:2: /seq: is missing"),
    (['{"trace":1}', '{"out":"maybe"}'], "t.jsonl:2: /out: unknown output \"maybe\"; expected one "
     "of ['event', 'live', 'effect', 'abort', 'release', 'none']"),
    (['{"trace":1}', "[1, 2]"], "t.jsonl:2: a trace line must be a JSON object"),
    (['{"trace":1}', '{"out":[]}'], "t.jsonl:2: /out: unknown output []; expected one of "
     "['event', 'live', 'effect', 'abort', 'release', 'none']"),  # unhashable: no TypeError
    # completions the fast path hands over to the general one, reported as always
    (['{"trace":1}', '{"in":"chunk","effect":0}'], "t.jsonl:2: /chunk: is missing (input "
     "'chunk' needs it)"),
    (['{"trace":1}', '{"in":"end","effect":0,"chunk":{}}'], "t.jsonl:2: /chunk: unknown field "
     "for input 'end' (allowed: effect)"),
    (['{"trace":1}', '{"in":"resolve","effect":0,"x":1}'], "t.jsonl:2: /x: unknown field for "
     "input 'resolve' (allowed: effect, value)"),
    (['{"trace":1}', '{"in":"chunk","effect":-1,"chunk":{}}'],
     "t.jsonl:2: /effect: must be a non-negative integer effect id"),
    (['{"trace":1}', '{"in":"end","effect":0}\f'], "t.jsonl:2: invalid JSON: Extra data "
     "(column 24)"),  # not JSON whitespace, though str.isspace() says so
    (['{"trace":1}', "[" * 100_000], "t.jsonl:2: invalid JSON: nested too deeply"),
    (['{"trace":1}', " " + "[" * 100_000], "t.jsonl:2: invalid JSON: nested too deeply"),
    ([], 't.jsonl: no {"trace": 1, ...} header: not a trace'),
]


@pytest.mark.parametrize(("lines", "message"), MALFORMED, ids=[m for _, m in MALFORMED])
def test_malformed_traces_name_line_and_field(tmp_path: Path, lines: list[str], message: str
                                              ) -> None:
    path = write(tmp_path / "t.jsonl", lines)
    with pytest.raises(MalformedError) as caught:
        verify_trace(path)
    assert str(caught.value) == str(tmp_path / message)


COMPLETIONS = ['{"in":"chunk","effect":3,"chunk":{"type":"text","text":"x"}}',
               '{"in":"end","effect":3}', '{"in":"resolve","effect":3,"value":null}',
               '{"in":"resolve","effect":3}']


@pytest.mark.parametrize("line", COMPLETIONS)
def test_completions_are_checked_as_any_input(tmp_path: Path, line: str,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # The usual completions take a fast path; with a "note" the same line takes the general
    # one. Both report a refusal the trace does not show, or a crash, identically.
    def check(observed: str, expected: str) -> None:
        for text, name in ((line, "fast"), (line[:-1] + ',"note":"n"}', "general")):
            report = verify_trace(write(tmp_path / f"{name}.jsonl", ['{"trace":1}', text]))
            assert report.divergence is not None and report.inputs == 1
            assert (report.divergence.line, report.divergence.observed,
                    report.divergence.expected) == (2, observed, expected)
    check(f"{line} accepted", "refused with a protocol error: effect 3 was never requested")

    def crash(*args: object) -> None:
        raise RuntimeError("boom")
    kind = json.loads(line)["in"]
    monkeypatch.setattr(AgentCore, kind, crash)
    check(line, "turnstile raised RuntimeError: boom (a bug in turnstile; please report)")
    monkeypatch.undo()
    report = verify_trace(write(tmp_path / "raises.jsonl", ['{"trace":1}',
                                                            line[:-1] + ',"raises":"protocol"}']))
    assert report.ok and report.inputs == 1
    report = verify_trace(write(tmp_path / "accepted.jsonl", ['{"trace":1}',
                                                              '{"in":"dispose","raises":"protocol"}']))
    assert report.divergence is not None
    assert (report.divergence.observed, report.divergence.expected) == (
        '{"in":"dispose"} refused with a protocol error', "accepted")


def test_canonical_lines_of_every_output_kind(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    # Outputs the corpus never shows: empty payloads, and payload keys that repeat an
    # envelope field (their would-be canonical line is not theirs: the general path decides).
    outputs = [Effect(0, "tick", FrozenDict({})), Control("release", FrozenDict({"effect": 0})),
               Control("abort", FrozenDict({})), Effect(1, "tick", FrozenDict({"kind": "x"})),
               Control("abort", FrozenDict({"out": "abort"})),
               Live(LiveEvent("agent/x", FrozenDict({"out": "y"})))]
    real = trace._session_core

    def session_core(header: dict[str, object], path: str, lineno: int) -> AgentCore:
        core = real(header, path, lineno)
        monkeypatch.setattr(core, "next_output", iter([*outputs, None]).__next__)
        return core
    monkeypatch.setattr(trace, "_session_core", session_core)
    lines = ['{"trace":1}', '{"out":"effect","effect":0,"kind":"tick"}',
             '{"out":"release","effect":0}', "", '{"out":"abort"}',
             '{"out":"effect","effect":1,"kind":"tick","kind":"x"}', '{"out":"abort"}']
    report = verify_trace(write(tmp_path / "ok.jsonl", lines))
    assert report.ok and report.outputs == 5
    with pytest.raises(MalformedError, match=r':8: /out: unknown output "y"'):
        verify_trace(write(tmp_path / "bad.jsonl", [*lines, '{"out":"live","type":"agent/x",'
                                                                '"out":"y"}']))


def test_the_command_line(tmp_path: Path) -> None:
    good = write(tmp_path / "good.jsonl", list(trace_lines(A5)))
    bad = write(tmp_path / "bad.jsonl", ['{"trace":1}', "{"])
    missing = str(tmp_path / "missing.jsonl")

    def run(*paths: str, progress: bool | None = False) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        status = cli.verify(argparse.Namespace(traces=list(paths), progress=progress), out, err)
        return status, out.getvalue(), err.getvalue()
    status, out, err = run(good)
    assert (status, err) == (0, "") and out == f"{good}: OK (46 lines, 1 session, 11 inputs, " \
                                               "34 outputs)\n"
    status, out, err = run(good, bad, missing)
    assert status == 3
    assert err == (f"turnstile verify-trace: malformed trace: {bad}:2: invalid JSON: Expecting "
                   f"property name enclosed in double quotes (column 2)\n"
                   f"turnstile verify-trace: {missing}: no such file\n")


def test_progress_is_shown_on_long_traces(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    lines = list(trace_lines(A5))
    path = write(tmp_path / "long.jsonl", lines + [line for _ in range(120) for line in lines])
    monkeypatch.setattr(terminal, "REFRESH", 0.0)
    stream = io.StringIO()          # not a terminal: the display asked for is the plain line
    assert verify_trace(path, progress=stream).ok
    shown = stream.getvalue()
    assert "long.jsonl:  " in shown and "% 4,096 lines, " in shown and "lines/s" in shown
    assert shown.endswith("\r" + " " * 78 + "\r")


def test_long_lived_objects_are_frozen_only_while_checking(tmp_path: Path) -> None:
    """verify_trace freezes what survives collections while it runs (a tenth of a long
    trace's time was full collections walking the replayed history), and gives it back."""
    import gc

    path = write(tmp_path / "t.jsonl", list(trace_lines(A5)))
    original = trace._verify
    during: list[tuple[int, int]] = []

    def verify_and_collect(*args: object, **kwargs: object) -> trace.TraceReport:
        gc.collect(1)   # a middle-generation collection during the check
        during.append((len(gc.callbacks), gc.get_freeze_count()))
        return original(*args, **kwargs)  # type: ignore[arg-type]

    callbacks = list(gc.callbacks)
    trace._verify = verify_and_collect
    try:
        assert gc.get_freeze_count() == 0
        assert verify_trace(path).ok
        assert during[-1][0] == len(callbacks) + 1 and during[-1][1] > 0   # frozen meanwhile
        assert gc.get_freeze_count() == 0 and gc.callbacks == callbacks   # all given back
        gc.freeze()     # a caller's own frozen objects: left alone (no callback installed)
        try:
            assert verify_trace(path).ok
            assert during[-1][0] == len(callbacks) and gc.get_freeze_count() > 0
        finally:
            gc.unfreeze()
        gc.disable()    # the collector off: nothing to spare, nothing installed
        try:
            assert verify_trace(path).ok
            assert during[-1] == (len(callbacks), 0)
        finally:
            gc.enable()
    finally:
        trace._verify = original


def test_recorded_traces_take_the_canonical_fast_path(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """PROTOCOL.md §Traces: every output line as this implementation writes it is its
    canonical line, so only headers and inputs are parsed; the same outputs written in
    another layout are parsed and compared, with the same verdict."""
    parsed: list[str] = []
    scan = trace._scan_once

    def counting_scan(line: str, index: int) -> tuple[object, int]:
        parsed.append(line)
        return scan(line, index)

    monkeypatch.setattr(trace, "_scan_once", counting_scan)
    checked = 0
    for path in find_vectors([CORPUS]):
        vector = load_vector(path)
        lines = list(trace_lines(vector))
        parsed.clear()
        assert verify_trace(write(tmp_path / "t.jsonl", lines)).ok
        # Lines that carry "loose" or "note" annotations are not canonical: parsed.
        annotated = [line for line in lines if line.startswith('{"out"')
                     and {"loose", "note", "time"} & json.loads(line).keys()]
        assert [line.rstrip("\n") for line in parsed if line.startswith('{"out"')] == annotated, \
            vector.id
        assert len(parsed) == sum(not line.startswith('{"out"') for line in lines) + len(annotated)
        spaced = [line if not line.startswith('{"out"') else
                  json.dumps(json.loads(line), ensure_ascii=False) for line in lines]
        parsed.clear()
        assert verify_trace(write(tmp_path / "t.jsonl", spaced)).ok
        assert len(parsed) == len(lines)
        checked += 1
    assert checked > 100


def test_D16_an_ignorable_event_is_checked_with_its_mark(tmp_path: Path) -> None:
    """A recorded trace holding an append marked ignorable verifies (on the canonical fast
    path and parsed); the same trace without the mark, or with it on another event, diverges."""
    from machine.conformance.recorder import record_draft
    draft = tmp_path / "draft.json"
    draft.write_text(json.dumps({"id": "ignorable", "steps": [
        {"in": "append", "type": "x-test/state", "data": {"n": 1}, "ignorable": True},
        {"in": "append", "type": "x-test/other", "data": {}}, {"pull": "all"}]}),
        encoding="utf-8")
    lines = list(trace_lines(record_draft(draft)))
    marked = [line for line in lines if '"ignorable":true' in line]
    assert len(marked) == 2          # the input and its durable output
    assert verify_trace(write(tmp_path / "t.jsonl", lines)).ok
    spaced = [json.dumps(json.loads(line)) if line.startswith('{"out"') else line
              for line in lines]
    assert verify_trace(write(tmp_path / "s.jsonl", spaced)).ok
    output = next(i for i, line in enumerate(lines)
                  if line.startswith('{"out"') and '"ignorable":true' in line)
    unmarked = [line.replace(',"ignorable":true', "") if i == output else line
                for i, line in enumerate(lines)]
    assert not verify_trace(write(tmp_path / "u.jsonl", unmarked)).ok
    other = next(i for i, line in enumerate(lines) if '"x-test/other"' in line
                 and line.startswith('{"out"'))
    moved = [line.replace("}}", '},"ignorable":true}', 1) if i == other else line
             for i, line in enumerate(unmarked)]
    assert not verify_trace(write(tmp_path / "m.jsonl", moved)).ok
