"""``turnstile run SCRIPT.json`` (machine/cli/runner.py, specs/scripts.md).

A golden run of the checked-in example, the observer-position semantics of
``when`` (a pattern, ``"here"``, absent) and of effect selectors, and every
error path: each exits 2 with one ``turnstile run:`` line on stderr and no
traceback.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest

from machine.cli import main as cli
from machine.cli import runner
from machine.cli.main import main
from machine.cli.runner import HERE, ScriptError, matches, parse_script, run_script
from machine.events import Event
from machine.log import validate_events

EXAMPLES = Path(__file__).resolve().parent.parent / "specs" / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.json"))

GOLDEN_BLOCKED_THEN_ALLOWED = """\
{"out":"live","type":"session/created"}
{"out":"live","type":"agent/created","status":"idle"}
{"out":"live","type":"agent/session-start","source":"startup"}
{"out":"effect","effect":0,"kind":"tick","purpose":"wake"}
{"out":"live","type":"agent/inbox/enqueue","message":{"id":"p1","role":"user",\
"content":[{"type":"text","text":"rm -rf /"}],"source":{"kind":"user"}},"placement":"queued"}
{"out":"live","type":"agent/status","status":"running"}
{"out":"effect","effect":1,"kind":"prompt-submit","message":{"id":"p1","role":"user",\
"content":[{"type":"text","text":"rm -rf /"}],"source":{"kind":"user"}},"signal":1}
{"out":"live","type":"agent/inbox/dequeue","message":{"id":"p1","role":"user",\
"content":[{"type":"text","text":"rm -rf /"}],"source":{"kind":"user"}},"placement":"queued"}
{"out":"event","type":"user/message","seq":0,"data":{"id":"c1","role":"user",\
"content":[{"type":"text","text":"cwd is /home/me"}],"source":{"kind":"plugin","plugin":"shell"}},\
"surfaceOp":"append"}
{"out":"effect","effect":2,"kind":"tick","purpose":"rejected-admission"}
{"out":"live","type":"agent/status","status":"idle"}
{"out":"effect","effect":3,"kind":"tick","purpose":"wake"}
{"out":"live","type":"agent/inbox/enqueue","message":{"id":"p2","role":"user",\
"content":[{"type":"text","text":"list files"}],"source":{"kind":"user"}},"placement":"queued"}
{"out":"live","type":"agent/status","status":"running"}
{"out":"effect","effect":4,"kind":"prompt-submit","message":{"id":"p2","role":"user",\
"content":[{"type":"text","text":"list files"}],"source":{"kind":"user"}},"signal":2}
{"out":"live","type":"agent/inbox/dequeue","message":{"id":"p2","role":"user",\
"content":[{"type":"text","text":"list files"}],"source":{"kind":"user"}},"placement":"queued"}
{"out":"event","type":"turn/start","seq":1,"data":{"turn":1,"trigger":{"kind":"message",\
"source":{"kind":"user"}}}}
{"out":"event","type":"user/message","seq":2,"data":{"id":"p2","role":"user",\
"content":[{"type":"text","text":"list files"}],"source":{"kind":"user"}},"surfaceOp":"append"}
{"out":"effect","effect":5,"kind":"step","turn":1,"step":1,"signal":3}
{"out":"effect","effect":6,"kind":"system-prompt","turn":1,"step":1,"signal":3}
{"out":"event","type":"step/start","seq":3,"data":{"turn":1,"step":1}}
{"out":"effect","effect":7,"kind":"request","turn":1,"step":1,"signal":3,\
"config":{"provider":"demo","model":"demo-1"},"system":"You are terse."}
{"out":"event","type":"request/header","seq":4,"data":{"header":{"config":{"provider":"demo",\
"model":"demo-1"},"system":"You are terse."},"reason":"initial"}}
{"out":"effect","effect":8,"kind":"model","turn":1,"step":1,"signal":3,\
"header":{"config":{"provider":"demo","model":"demo-1"},"system":"You are terse."},"historyEnd":3}
{"out":"event","type":"assistant/chunk","seq":5,"data":{"turn":1,"step":1,"chunk":{"type":"text",\
"text":"a.txt b.txt"}}}
{"out":"event","type":"assistant/chunk","seq":6,"data":{"turn":1,"step":1,"chunk":{"type":"usage",\
"usage":{"inputTokens":12,"outputTokens":4}}}}
{"out":"event","type":"assistant/chunk","seq":7,"data":{"turn":1,"step":1,"chunk":{"type":"finish",\
"kind":"stop"}}}
{"out":"event","type":"assistant/message","seq":8,"data":{"turn":1,"step":1,\
"message":{"id":"assistant-8","role":"assistant","content":[{"type":"text","text":"a.txt b.txt"}],\
"source":{"kind":"model","provider":"demo","model":"demo-1"}},"usage":{"inputTokens":12,\
"outputTokens":4}},"surfaceOp":"append","sourceEventSeqs":[5,6,7]}
{"out":"event","type":"step/end","seq":9,"data":{"turn":1,"step":1}}
{"out":"effect","effect":9,"kind":"turn-stopping","turn":1,"signal":3}
{"out":"event","type":"turn/end","seq":10,"data":{"turn":1,"reason":{"kind":"completed"}}}
{"out":"effect","effect":10,"kind":"flush","turn":1}
{"out":"live","type":"agent/settled","turn":1,"reason":{"kind":"completed"}}
{"out":"live","type":"agent/status","status":"idle"}
"""


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, list[str], str]:
    status = main(list(argv))
    captured = capsys.readouterr()
    return status, captured.out.splitlines(), captured.err


def write_script(tmp_path: Path, script: Any, name: str = "s.json") -> str:
    path = tmp_path / name
    path.write_text(script if isinstance(script, str) else json.dumps(script), encoding="utf-8")
    return str(path)


def user(id_: str, text: str = "hello", **source: Any) -> dict[str, Any]:
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": text}],
            "source": source or {"kind": "user"}}


def script(*inputs: object, **config: Any) -> dict[str, Any]:
    return {"version": 1, "config": config, "inputs": list(inputs)}


def lines_of(value: dict[str, Any], *, echo: bool = False) -> list[dict[str, Any]]:
    return list(run_script(parse_script(json.dumps(value)), echo_inputs=echo))


def durable(lines: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    """(type, message id or turn) of each durable event, for compact assertions."""
    out = []
    for line in lines:
        if line.get("out") == "event":
            data = line["data"]
            out.append((line["type"], data.get("id", data.get("turn"))))
    return out


def effect(kind: str, value: Any = None, **selector: Any) -> dict[str, Any]:
    return {"in": "resolve", "effect": {"kind": kind, **selector}, "value": value}


ALLOW = effect("prompt-submit", {"kind": "allow"})
REQUEST = effect("request", {"config": {"provider": "p", "model": "m"}})


def model_reply(text: str) -> list[dict[str, Any]]:
    return [{"in": "chunk", "effect": {"kind": "model"}, "chunk": {"type": "text", "text": text}},
            {"in": "chunk", "effect": {"kind": "model"}, "chunk": {"type": "finish", "kind": "stop"}},
            {"in": "end", "effect": {"kind": "model"}}]


def one_turn(text: str = "ok") -> list[dict[str, Any]]:
    """Answers for an admitted prompt's single-step turn, after the wake tick."""
    return [ALLOW, effect("step"), effect("system-prompt"), REQUEST, *model_reply(text),
            effect("turn-stopping"), effect("flush")]


# --------------------------------------------------------------------------
# Golden output and the checked-in examples
# --------------------------------------------------------------------------


def test_golden_output_of_blocked_then_allowed(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "run", str(EXAMPLES / "blocked-then-allowed.json"))
    assert (status, err) == (0, "")
    assert out == GOLDEN_BLOCKED_THEN_ALLOWED.splitlines()


def test_echo_inputs_interleaves_applied_inputs_with_resolved_ids(
        capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = run(capsys, "run", "--echo-inputs", str(EXAMPLES / "blocked-then-allowed.json"))
    assert status == 0
    values = [json.loads(line) for line in out]
    assert [v for v in values if "out" in v] == [json.loads(g) for g in
                                                  GOLDEN_BLOCKED_THEN_ALLOWED.splitlines()]
    inputs = [v for v in values if "in" in v]
    assert len(inputs) == len(json.loads((EXAMPLES / "blocked-then-allowed.json").read_text())["inputs"])
    assert all("when" not in v and "note" not in v for v in inputs)
    assert [v["effect"] for v in inputs if "effect" in v][:4] == [0, 1, 2, 3]
    # the inject is applied right after p1's dequeue notice, the position its pattern names
    at = next(i for i, v in enumerate(values) if v.get("in") == "inject")
    assert values[at - 1]["type"] == "agent/inbox/dequeue"


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.name for p in SCRIPTS])
def test_example_scripts_run_and_their_durable_events_form_a_valid_log(
        path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, err = run(capsys, "run", str(path))
    assert (status, err) == (0, "")
    events = [json.loads(line) for line in out]
    durable_events = [Event.from_json({**{k: v for k, v in e.items() if k != "out"}, "time": 0})
                      for e in events if e["out"] == "event"]
    assert validate_events(durable_events) is None
    assert events[-1] == {"out": "live", "type": "agent/status", "status": "idle"}
    assert any(e["out"] == "event" and e["type"] == "turn/end" for e in events)


def test_examples_exist() -> None:
    assert {p.name for p in SCRIPTS} >= {"blocked-then-allowed.json", "tool-call.json"}


def test_blocked_then_allowed_shows_the_context_appended_on_its_own() -> None:
    value = json.loads((EXAMPLES / "blocked-then-allowed.json").read_text(encoding="utf-8"))
    lines = lines_of(value)
    assert durable(lines)[:3] == [("user/message", "c1"), ("turn/start", 1), ("user/message", "p2")]
    assert not any(line.get("data", {}).get("id") == "p1" for line in lines)


def test_tool_call_example_drains_the_observer_context_before_step_end() -> None:
    value = json.loads((EXAMPLES / "tool-call.json").read_text(encoding="utf-8"))
    kinds = durable(lines_of(value))
    at = kinds.index(("tool/result", 1))
    assert kinds[at + 1:at + 3] == [("user/message", "c1"), ("step/end", 1)]


def test_stdin_script(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO(json.dumps(script())))
    status, out, err = run(capsys, "run", "-")
    assert (status, err) == (0, "")
    assert [json.loads(line)["type"] for line in out] == [
        "session/created", "agent/created", "agent/session-start"]


def test_runs_are_deterministic() -> None:
    value = json.loads((EXAMPLES / "tool-call.json").read_text(encoding="utf-8"))
    assert lines_of(value, echo=True) == lines_of(value, echo=True)


# --------------------------------------------------------------------------
# Observer positions: when
# --------------------------------------------------------------------------


def test_P2_an_inject_observing_the_dequeue_is_staged_into_the_turn() -> None:
    lines = lines_of(script(
        {"in": "followup", "message": user("p1")},
        effect("tick"),
        {"in": "inject", "message": user("c1"), "when": {"out": "live", "type": "agent/inbox/dequeue"}},
        *one_turn()))
    assert durable(lines)[:3] == [("turn/start", 1), ("user/message", "p1"), ("user/message", "c1")]


def test_P2_an_inject_before_the_wake_completes_is_appended_at_once() -> None:
    lines = lines_of(script(
        {"in": "followup", "message": user("p1")},
        {"in": "inject", "message": user("c1")},     # window closed: appended now
        effect("tick"),
        *one_turn()))
    assert durable(lines)[:3] == [("user/message", "c1"), ("turn/start", 1), ("user/message", "p1")]


def test_P2_without_when_an_input_lands_after_everything_available() -> None:
    """The same inject without ``when``, after the tick: the window is open by then (staged)."""
    lines = lines_of(script(
        {"in": "followup", "message": user("p1")},
        effect("tick"),
        {"in": "inject", "message": user("c1")},
        *one_turn()), echo=True)
    at = next(i for i, v in enumerate(lines) if v.get("in") == "inject")
    assert lines[at - 1]["type"] == "agent/inbox/dequeue"          # all of the admission was pulled
    assert durable(lines)[:3] == [("turn/start", 1), ("user/message", "p1"), ("user/message", "c1")]


def test_P2_here_applies_at_the_same_position_without_pulling() -> None:
    """``here`` after resolving the wake: the loop has not resumed, so the window is still closed."""
    lines = lines_of(script(
        {"in": "followup", "message": user("p1")},
        effect("tick"),
        {"in": "inject", "message": user("c1"), "when": HERE},
        *one_turn()), echo=True)
    inputs_at = [i for i, v in enumerate(lines) if "in" in v]
    assert inputs_at[1] + 1 == inputs_at[2]                          # nothing pulled in between
    assert durable(lines)[:3] == [("user/message", "c1"), ("turn/start", 1), ("user/message", "p1")]


def test_P2_a_pattern_stops_right_after_the_first_matching_output() -> None:
    lines = lines_of(script(
        {"in": "followup", "message": user("p1")},
        {"in": "steer", "message": user("s1"), "when": {"out": "live", "type": "agent/inbox/enqueue"}},
        effect("tick")), echo=True)
    types = [v.get("type", v.get("in")) for v in lines]
    assert types[types.index("agent/inbox/enqueue") + 1] == "steer"


def test_a_pattern_only_looks_at_outputs_pulled_after_the_previous_input(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_script(tmp_path, script(
        {"in": "followup", "message": user("p1")},
        effect("tick"),
        {"in": "steer", "message": user("s1")},         # pulls agent/status running first
        # ... so that output does not count again for a later pattern
        {"in": "inject", "message": user("c1"), "when": {"out": "live", "type": "agent/status"}}))
    status, out, err = run(capsys, "run", path)
    assert status == 2
    assert err == (f"turnstile run: {path}: inputs[3].when: the pattern "
                   '{"out":"live","type":"agent/status"} never matched: the core waits for input '
                   "after output 9 (outstanding effects: 1 (prompt-submit))\n")
    assert len(out) == 9                       # everything pulled before the problem is printed
    assert json.loads(out[5]) == {"out": "live", "type": "agent/status", "status": "running"}


def test_a_pattern_may_match_nested_fields() -> None:
    lines = lines_of(script(
        {"in": "followup", "message": user("p1")},
        {"in": "followup", "message": user("p2"), "when": HERE},
        {"in": "steer", "message": user("s1"),
         "when": {"out": "live", "type": "agent/inbox/enqueue", "message": {"id": "p2"}}}), echo=True)
    at = next(i for i, v in enumerate(lines) if v.get("in") == "steer")
    assert lines[at - 1]["message"]["id"] == "p2"


# --------------------------------------------------------------------------
# Effect selectors
# --------------------------------------------------------------------------


def test_a_selector_names_the_oldest_outstanding_matching_effect() -> None:
    calls = [{"in": "chunk", "effect": {"kind": "model"},
              "chunk": {"type": "tool-call", "id": f"c{n}", "name": "t", "arguments": "{}"}}
             for n in (1, 2)]
    result = {"content": [{"type": "text", "text": "r"}]}
    lines = lines_of(script(
        {"in": "followup", "message": user("p1")}, effect("tick"), ALLOW, effect("step"),
        effect("system-prompt"), REQUEST, *calls,
        {"in": "chunk", "effect": {"kind": "model"}, "chunk": {"type": "finish", "kind": "stop"}},
        {"in": "end", "effect": {"kind": "model"}},
        effect("tool-prepare"), effect("tool-prepare"),
        effect("tool-execute", result, callId="c2"),   # by field: the younger one first
        effect("tool-execute", result),                 # the oldest outstanding: c1's
        effect("tool-finalize", result), effect("tool-finalize", result),
        toolModes={"t": "parallel"}), echo=True)
    effects = {v["effect"]: v for v in lines if v.get("out") == "effect"}
    executes = [v for v in lines
                if v.get("in") == "resolve" and effects[v["effect"]]["kind"] == "tool-execute"]
    assert [effects[v["effect"]]["callId"] for v in executes] == ["c2", "c1"]
    model_inputs = {v["effect"] for v in lines if v.get("in") in ("chunk", "end")}
    assert len(model_inputs) == 1                        # the same model effect throughout its stream
    assert [d for d in durable(lines) if d[0] == "tool/result"] == [("tool/result", 1)] * 2


def test_an_integer_effect_id_is_used_as_is() -> None:
    lines = lines_of(script({"in": "followup", "message": user("p1")},
                            {"in": "resolve", "effect": 0, "value": None}), echo=True)
    assert {"in": "resolve", "effect": 0, "value": None} in lines
    assert lines[-1]["type"] == "agent/inbox/dequeue"


def test_a_selector_only_sees_effects_already_pulled(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """The wake tick is queued by the followup but not yet pulled at a ``here`` position."""
    path = write_script(tmp_path, script({"in": "followup", "message": user("p1")},
                                         {**effect("tick"), "when": HERE}))
    status, _, err = run(capsys, "run", path)
    assert status == 2
    assert err == (f"turnstile run: {path}: inputs[1].effect: no outstanding effect matches "
                   '{"kind":"tick"} (outstanding effects: none)\n')


# --------------------------------------------------------------------------
# Subset matching
# --------------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "value", "expected"), [
    ({}, {"a": 1}, True),
    ({"a": 1}, {"a": 1, "b": 2}, True),
    ({"a": 1, "c": 3}, {"a": 1, "b": 2}, False),
    ({"a": {"b": 1}}, {"a": {"b": 1, "c": 2}}, True),
    ({"a": {"b": 1}}, {"a": 1}, False),
    ({"a": [1, {"b": 2}]}, {"a": [1, {"b": 2, "c": 3}]}, True),
    ({"a": [1]}, {"a": [1, 2]}, False),
    ({"a": True}, {"a": 1}, False),
    ({"a": 1}, {"a": True}, False),
    ({"a": 1}, {"a": 1.0}, True),
    ({"a": None}, {"a": None}, True),
    ({"a": None}, {}, False),
    ({"a": "1"}, {"a": 1}, False),
    ([], {}, False),
])
def test_matches_is_a_typed_subset_match(pattern: Any, value: Any, expected: bool) -> None:
    assert matches(pattern, value) is expected


# --------------------------------------------------------------------------
# Errors: every one exits 2 with one line on stderr
# --------------------------------------------------------------------------


MALFORMED: list[tuple[str, Any, str]] = [
    ("not-json", "{", "invalid JSON: Expecting property name enclosed in double quotes (line 1, column 2)"),
    ("duplicate-key", '{"version": 1, "version": 1, "inputs": []}',
     "invalid JSON: duplicate key 'version' in an object"),
    ("nan", '{"version": 1, "inputs": [{"in": "resolve", "effect": 0, "value": NaN}]}',
     "invalid JSON: NaN is not JSON"),
    ("not-an-object", [1], "$: a script is an object {version, config?, inputs, description?}"),
    ("unknown-top-level", {"version": 1, "inputs": [], "steps": []},
     "$: unexpected field(s) ['steps']; a script has ['version', 'description', 'config', 'inputs']"),
    ("no-version", {"inputs": []}, "version: is required (the script format version, 1)"),
    ("bad-version", {"version": 2, "inputs": []}, "version: unsupported version 2; expected 1"),
    ("bool-version", {"version": True, "inputs": []}, "version: unsupported version True; expected 1"),
    ("description", {"version": 1, "inputs": [], "description": 3}, "description: must be a string"),
    ("no-inputs", {"version": 1}, "inputs: is required (a list of inputs)"),
    ("inputs-not-list", {"version": 1, "inputs": {}}, "inputs: must be a list of inputs"),
    ("config-not-object", {"version": 1, "inputs": [], "config": []},
     "config: must be an object with fields ['requestOptions', 'toolModes', 'maxParallelToolCalls', "
     "'sessionStart', 'publish']"),
    ("config-unknown", {"version": 1, "inputs": [], "config": {"request_options": {}}},
     "config: unexpected field(s) ['request_options']; allowed: ['requestOptions', 'toolModes', "
     "'maxParallelToolCalls', 'sessionStart', 'publish']"),
    ("config-tool-mode", script(toolModes={"ls": "serial"}),
     "config.toolModes.ls: must map a tool name to 'exclusive' or 'parallel'"),
    ("config-parallel", script(maxParallelToolCalls=0),
     "config.maxParallelToolCalls: must be an integer >= 1"),
    ("config-session-start", script(sessionStart="later"),
     "config.sessionStart: must be 'startup' or 'resume'"),
    ("config-request-options", script(requestOptions=[1]), "config.requestOptions: must be a mapping"),
    ("entry-not-object", script(3), "inputs[0]: must be an input object with a string 'in' "
                                    "(specs/protocol.md P9)"),
    ("unknown-input", script({"in": "poke"}),
     "inputs[0].in: unknown input 'poke'; expected one of ['append', 'cancel', 'chunk', 'dispose', "
     "'end', 'followup', 'inject', 'observer', 'raise', 'resolve', 'send', 'steer']"),
    ("unexpected-field", script({"in": "dispose", "now": True}),
     "inputs[0]: unexpected field(s) ['now'] for input 'dispose'"),
    ("effect-not-id", script({"in": "end", "effect": "model"}),
     "inputs[0].effect: must be a non-negative integer effect id"),
    ("effect-negative", script({"in": "end", "effect": -1}),
     "inputs[0].effect: must be a non-negative integer effect id"),
    ("selector-empty", script({"in": "end", "effect": {}}),
     'inputs[0].effect: an effect selector needs at least one field, e.g. {"kind": "model"}'),
    ("selector-kind", script({"in": "end", "effect": {"kind": "modle"}}),
     "inputs[0].effect.kind: 'modle' is not an effect kind; expected one of ['flush', 'model', "
     "'prompt-submit', 'request', 'request-error', 'step', 'system-prompt', 'tick', 'tool-execute', "
     "'tool-finalize', 'tool-prepare', 'turn-stopping']"),
    ("selector-out", script({"in": "end", "effect": {"out": "effect", "kind": "model"}}),
     "inputs[0].effect.out: is not a selector field; to name one effect, give its integer id as 'effect'"),
    ("selector-on-command", script({"in": "dispose", "effect": {"kind": "model"}}),
     "inputs[0]: unexpected field(s) ['effect'] for input 'dispose'"),
    ("raise-bad-error", script({"in": "raise", "effect": {"kind": "model"}, "error": {"causes": "x"}}),
     "inputs[0].error.causes: must be a list of strings"),
    ("when-string", script({"in": "dispose", "when": "later"}),
     "inputs[0].when: must be an output pattern (an object) or 'here'"),
    ("when-null", script({"in": "dispose", "when": None}),
     "inputs[0].when: must be an output pattern (an object) or 'here'"),
    ("when-out", script({"in": "dispose", "when": {"out": "events"}}),
     "inputs[0].when.out: 'events' is not an output kind; expected one of ['event', 'live', 'effect', "
     "'abort', 'release']"),
    ("note", script({"in": "dispose", "note": 1}), "inputs[0].note: must be a string"),
    ("later-entry", script({"in": "dispose"}, {"in": "dispose"}, {"message": {}}),
     "inputs[2]: must be an input object with a string 'in' (specs/protocol.md P9)"),
]


@pytest.mark.parametrize(("name", "content", "message"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_malformed_scripts_exit_2_before_running(name: str, content: Any, message: str, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = write_script(tmp_path, content)
    status, out, err = run(capsys, "run", path)
    assert (status, out) == (2, [])                 # checked before anything runs
    assert err == f"turnstile run: {path}: {message}\n"


def test_raise_error_paths_are_checked_when_loading() -> None:
    with pytest.raises(ScriptError) as info:
        parse_script(json.dumps(script({"in": "raise", "effect": 0, "error": []})))
    assert info.value.path.startswith("inputs[0].error")


@pytest.mark.parametrize(("name", "make", "message"), [
    ("missing", lambda p: str(p / "nope.json"), "no such file"),
    ("directory", lambda p: str(p), "is a directory, not a script"),
    ("not-utf8", lambda p: write_bytes(p / "s.json", b'{"version": 1, \xff}'),
     "not UTF-8 text (invalid start byte at byte 15)"),
])
def test_unreadable_files_exit_2(name: str, make: Any, message: str, tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    path = make(tmp_path)
    status, out, err = run(capsys, "run", path)
    assert (status, out, err) == (2, [], f"turnstile run: {path}: {message}\n")


def write_bytes(path: Path, data: bytes) -> str:
    path.write_bytes(data)
    return str(path)


RUNTIME: list[tuple[str, list[dict[str, Any]], str]] = [
    ("protocol-error", [{"in": "resolve", "effect": 99, "value": None}],
     "inputs[0]: refused by the core (ProtocolError): effect 99 was never requested"),
    ("resolve-model", [{"in": "followup", "message": user("p1")}, effect("tick"), *one_turn()[:4],
                       {"in": "resolve", "effect": {"kind": "model"}, "value": None}],
     "inputs[6]: refused by the core (ProtocolError): effect 5 is a model stream: complete it with "
     "chunk, end or raise"),
    ("completed-twice", [{"in": "followup", "message": user("p1")},
                         {"in": "resolve", "effect": 0, "value": None},
                         {"in": "resolve", "effect": 0, "value": None}],
     "inputs[2]: refused by the core (ProtocolError): effect 0 was already completed"),
    ("bad-message", [{"in": "followup", "message": {**user("p1"), "role": "assistant"}}],
     "inputs[0]: refused by the core (ValidationError): message.role: must be 'user', not 'assistant'"),
    ("bad-options", [{"in": "send", "message": user("p1"), "options": {"target": "now", "wakeup": True}}],
     "inputs[0]: refused by the core (ValidationError): options.target: 'now' is not 'next-turn' or "
     "'next-step'"),
    ("bad-cause", [{"in": "cancel", "cause": {"kind": "boredom"}}],
     "inputs[0]: refused by the core (ValidationError): cause.kind: 'boredom' is not 'user', 'parent' "
     "or 'disposed'"),
    ("after-dispose", [{"in": "dispose"}, {"in": "followup", "message": user("p1")}],
     "inputs[1]: refused by the core (DisposedError): the agent is disposed; only dispose() may be called"),
    ("no-such-effect", [{"in": "followup", "message": user("p1")}, effect("model")],
     'inputs[1].effect: no outstanding effect matches {"kind":"model"} (outstanding effects: 0 (tick))'),
    ("when-never", [{"in": "followup", "message": user("p1")},
                    {"in": "dispose", "when": {"out": "event", "type": "turn/end"}}],
     'inputs[1].when: the pattern {"out":"event","type":"turn/end"} never matched: the core waits for '
     "input after output 5 (outstanding effects: 0 (tick))"),
]


@pytest.mark.parametrize(("name", "inputs", "message"), RUNTIME, ids=[r[0] for r in RUNTIME])
def test_runtime_errors_exit_2_after_printing_what_was_pulled(
        name: str, inputs: list[dict[str, Any]], message: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = write_script(tmp_path, script(*inputs))
    status, out, err = run(capsys, "run", path)
    assert status == 2
    assert err == f"turnstile run: {path}: {message}\n"
    assert "Traceback" not in err
    assert all("out" in json.loads(line) for line in out)


def test_an_invariant_error_from_append_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_script(tmp_path, script({"in": "append", "type": "turn/end",
                                          "data": {"turn": 1, "reason": {"kind": "completed"}}}))
    status, _, err = run(capsys, "run", path)
    assert status == 2
    assert err.startswith(f"turnstile run: {path}: inputs[0]: refused by the core (")
    assert err.count("\n") == 1


def test_an_internal_error_is_reported_without_a_traceback(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*_args: Any, **_kwargs: Any) -> Any:
        yield from ()  # a generator, as run_script is: it raises at the first next()
        raise RuntimeError("boom")

    monkeypatch.setattr(runner, "run_script", broken)
    path = write_script(tmp_path, script())
    status, _, err = run(capsys, "run", path)
    assert status == 2
    assert err == f"turnstile run: {path}: internal error (please report): RuntimeError: boom\n"


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run(capsys, "run")
    assert status == 2 and "SCRIPT.json" in err


def test_run_is_a_registered_command() -> None:
    assert {"log", "run", "diagrams"} <= set(cli.COMMANDS)


def test_V23_a_lone_surrogate_in_a_script_is_refused_by_the_core_not_an_internal_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 14.5: `turnstile run` reported an 'internal error' for a lone surrogate; the
    core refuses it at acceptance (V23), with the path and the index of the surrogate."""
    text = json.dumps(script({"in": "followup", "message": user("p\ud800")}))
    assert "\\ud800" in text                     # as a JSON escape, the only way to spell it
    path = write_script(tmp_path, text)
    status, out, err = run(capsys, "run", path)
    assert status == 2
    assert err == (f"turnstile run: {path}: inputs[0]: refused by the core "
                   "(NotJsonCompatibleError): message.id: the string holds a lone surrogate "
                   "(U+D800 at index 1), which UTF-8 JSON cannot represent\n")
    assert all("out" in json.loads(line) for line in out)
