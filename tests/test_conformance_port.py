"""`turnstile check --port` and `turnstile adapter`: the adapter protocol end to end.

The tests that start port processes are few; the adapter's request handling is
also tested in process.
"""

from __future__ import annotations

import argparse
import io
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from machine.conformance import cli
from machine.conformance.adapter import Adapter, serve
from machine.conformance.port import PortSubject
from machine.conformance.vectors import find_vectors, load_vector

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT / "specs" / "conformance" / "vectors"
A1 = "specs/conformance/vectors/A1-simple-prompt-turn.json"
A5 = "specs/conformance/vectors/A5-idle-steer-is-a-prompt.json"
H7B = "specs/conformance/vectors/H7b-idle-cancel-context-only.json"


def command(*argv: str) -> str:
    return shlex.join([sys.executable, *argv])


def wrong_port(*argv: str) -> str:
    return command("-m", "machine.conformance.examples.wrong_port", *argv)


@pytest.fixture(autouse=True)
def _in_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)   # the reports name vectors by the paths given


def run_check(paths: list[str], port: str, *, timeout: float = 20.0) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(paths=paths, port=port, timeout=timeout, verbose=False)
    status = cli.check(args, out, err)
    return status, out.getvalue(), err.getvalue()


def test_turnstile_adapter_passes_the_whole_corpus_through_the_protocol() -> None:
    status, out, err = run_check([], command("-m", "machine.cli.main", "adapter"))
    count = len(list(find_vectors([CORPUS])))
    assert (status, out, err) == (0, f"{count} passed, 0 failed\n", "")


def test_a_port_that_routes_an_idle_steer_as_steering_gets_the_precise_report() -> None:
    status, out, err = run_check([A5, A1], wrong_port("--bug", "idle-steer"))
    message = ('{"id":"m1","role":"user","content":[{"type":"text","text":"steer idle"}],'
               '"source":{"kind":"plugin","plugin":"test"}}')
    assert (status, err) == (1, "")
    assert out == f"""\
FAIL A5-idle-steer-is-a-prompt ({A5})
  title: A5. An idle steer is queued (placement queued) and becomes an ordinary prompt turn \
whose trigger carries the steer's source; no steering/message
  rules: R5.3, R5.4, R5.6, R6.2, R7.9, V13
  first divergence at step 6 (line 14), an output step
  inputs up to that point:
    step 1 (line 9): {{"in":"steer","message":{message}}}
  last matching output, step 5 (line 13): {{"out":"effect","effect":0,"kind":"tick","purpose":"wake"}}
  expected: {{"out":"live","type":"agent/inbox/enqueue","message":{message},"placement":"queued"}}
  actual:   {{"out":"live","type":"agent/inbox/enqueue","message":{message},"placement":"steering"}}
  difference at /placement: expected "queued", got "steering"

1 passed, 1 failed
"""


def test_declared_deviations_skip_the_tagged_vectors() -> None:
    tagged = [v for v in map(load_vector, find_vectors([CORPUS])) if "D6" in v.tags]
    paths = [v.path for v in tagged] + [A1]
    status, out, _ = run_check(paths, wrong_port("--bug", "no-context-discard", "--deviate", "D6"))
    assert (status, out) == (0, f"1 passed, 0 failed, {len(tagged)} skipped\n")
    status, out, _ = run_check([H7B], wrong_port("--bug", "no-context-discard"))
    assert status == 1
    assert out.splitlines()[-4:] == [
        '  expected: {"out":"live","type":"agent/context/discard","messages":[{"id":"m2",'
        '"role":"user","content":[{"type":"text","text":"C"}],"source":{"kind":"plugin",'
        '"plugin":"test"}}]}',
        "  actual:   no output (the implementation waits for an input)",
        "",
        "0 passed, 1 failed"]


def test_an_input_that_fails_after_being_accepted_fails_the_vector_at_that_input() -> None:
    """PROTOCOL.md §3 (ports built on an event loop): ``input-failed`` after an early
    ``accepted`` is a failure of the vector at that input, not a port failure; the port is
    restarted and the next vector runs."""
    status, out, err = run_check([A1, A5], wrong_port("--bug", "late-failure"))
    assert (status, err) == (1, "")
    lines = out.splitlines()
    assert lines[0] == f"FAIL A1-simple-prompt-turn ({A1})"
    assert "  first divergence at step 1 (line 9), an input step" in lines
    assert ("  actual:   accepted at its first output, then failed with a validation error: "
            "the followup failed after its first output") in lines
    assert lines[-1] == "1 passed, 1 failed"


def test_a_port_without_the_extension_capabilities_skips_the_extension_vectors() -> None:
    """PROTOCOL.md §Skipping: a vector tagged extension:<capability> needs that capability; a
    port of the original lists neither prepare-result nor request-header."""
    extension = [v for v in map(load_vector, find_vectors([CORPUS])) if "extension" in v.tags]
    assert {c for v in extension for c in v.requires} >= {"prepare-result", "request-header"}
    status, out, _ = run_check([v.path for v in extension] + [A1],
                               command("-m", "machine.conformance.examples.original_like_port"))
    assert (status, out) == (0, f"1 passed, 0 failed, {len(extension)} skipped\n")


def test_a_reply_that_is_not_json_is_a_port_failure_with_its_line() -> None:
    status, out, err = run_check([A1], wrong_port("--bug", "garbage"))
    assert status == 4 and err == ""
    assert ("  port failure at step 2 (line 10): port reply line 4 (in reply to "
            '{"op":"pull","max":6}): not JSON (Expecting value: line 1 column 1 (char 0)): '
            "'this is not JSON'") in out.splitlines()
    assert out.endswith("0 passed, 0 failed, 1 port error\n") and "Traceback" not in out


def test_a_silent_port_times_out_and_is_restarted() -> None:
    """The port answers its handshake (which has its own generous budget) and then nothing:
    the short reply timeout can only expire, however slow the machine, so nothing races."""
    status, out, _ = run_check([A1, A5], wrong_port("--bug", "hang"), timeout=0.2)
    assert status == 4
    assert out.count("no reply within 0.2s in reply to {\"op\":\"start\"") == 2
    assert out.endswith("0 passed, 0 failed, 2 port errors\n")


def run_check_started(paths: list[str], port: str, *, timeout: float,
                      start_timeout: float) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    args = argparse.Namespace(paths=paths, port=port, timeout=timeout,
                              start_timeout=start_timeout, verbose=False)
    return cli.check(args, out, err), out.getvalue(), err.getvalue()


def slow_starting_port(seconds: float) -> str:
    return command("-c", f"import time; time.sleep({seconds}); "
                   "from machine.conformance.examples.minimal_port import Port; Port().serve()")


def test_a_slow_start_is_not_a_timeout_the_handshake_has_its_own_budget() -> None:
    """A port that takes longer to start than one reply may take shakes hands all the same:
    the handshake is measured against the start timeout, later replies against the timeout.
    (Only the handshake is awaited here, so the short reply timeout races nothing.)"""
    subject = PortSubject(slow_starting_port(0.5), timeout=0.2, start_timeout=60.0)
    try:
        assert subject.info.implementation == "minimal-port"
    finally:
        subject.close()


def test_a_port_that_never_shakes_hands_fails_after_the_start_timeout() -> None:
    status, out, err = run_check_started([A1], slow_starting_port(3600), timeout=20.0,
                                         start_timeout=0.2)
    assert (status, out) == (4, "")
    assert err.endswith("no reply within 0.2s in reply to {\"op\":\"hello\",\"protocol\":1}\n"), err


def test_ports_that_cannot_start_or_shake_hands_are_reported() -> None:
    status, out, err = run_check([A1], "/no/such/port --flag")
    assert (status, out) == (4, "")
    assert err == ("turnstile check: port '/no/such/port --flag': cannot start the port "
                   "'/no/such/port --flag': No such file or directory\n")
    speaks_two = command("-c", "import json, sys; sys.stdin.readline(); "
                         "print(json.dumps({'op': 'hello', 'protocol': 2}), flush=True)")
    status, out, err = run_check([A1], speaks_two)
    assert (status, out) == (4, "")
    assert err.endswith("port reply line 1 (in reply to {\"op\":\"hello\",\"protocol\":1}): field "
                        "/protocol: the port speaks protocol 2; this checker speaks 1\n")


HELLO = {"op": "hello", "protocol": 1, "implementation": "p 1", "capabilities": [],
         "deviations": []}


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("capabilities", None, "is missing: the hello reply must carry the optional features the "
                           "port supports (an array, [] for none)"),
    ("deviations", None, "is missing: the hello reply must carry the vector tags the port "
                         "deviates from on purpose (an array, [] for none)"),
    ("implementation", None, "is missing: the hello reply must carry the port's name and "
                             "version (a string)"),
    ("capabilities", "seed", "must be an array of strings"),
    ("deviations", [6], "must be an array of vector tags"),
    ("implementation", "", "must be a non-empty string"),
])
def test_the_handshake_is_strict_every_field_present_and_of_its_type(
        field: str, value: object, problem: str) -> None:
    """PROTOCOL.md §3: a hello reply without implementation, capabilities or deviations (or
    with one of the wrong type) fails the handshake, naming the field; the run stops at once."""
    reply = {k: v for k, v in HELLO.items() if k != field or value is not None}
    if value is not None:
        reply[field] = value
    port = command("-c", "import json, sys; sys.stdin.readline(); "
                   f"print(json.dumps({reply!r}), flush=True); sys.stdin.readline()")
    status, out, err = run_check([A1], port)
    assert (status, out) == (4, "")
    assert err.endswith('port reply line 1 (in reply to {"op":"hello","protocol":1}): field '
                        f"/{field}: {problem}\n"), err
    assert "Traceback" not in err


# --------------------------------------------------------------------------
# The adapter in process
# --------------------------------------------------------------------------


def test_the_adapter_answers_each_request() -> None:
    adapter = Adapter(deviations=["D6"])
    assert adapter.handle({"op": "hello", "protocol": 1}) == [{
        "op": "hello", "protocol": 1, "implementation": "turnstile",
        "capabilities": ["seed", "append", "observer", "prepare-result", "request-header"],
        "deviations": ["D6"]}]
    assert adapter.handle({"op": "pull"}) == [{"op": "error", "message": "pull before start"}]
    assert adapter.handle({"op": "start", "config": {"maxParallelToolCalls": 0}})[0]["op"] == "error"
    assert adapter.handle({"op": "start", "vector": "v", "config": {}}) == [{"op": "started"}]
    assert adapter.handle({"op": "pull", "max": 2}) == [
        {"op": "output", "output": {"out": "live", "type": "session/created"}},
        {"op": "output", "output": {"out": "live", "type": "agent/created", "status": "idle"}}]
    assert adapter.handle({"op": "pull", "max": 5}) == [
        {"op": "output", "output": {"out": "live", "type": "agent/session-start",
                                    "source": "startup"}},
        {"op": "waiting"}]
    refused = adapter.handle({"op": "input", "input": {"in": "resolve", "effect": 7}})
    assert refused == [{"op": "refused", "kind": "protocol",
                        "message": "effect 7 was never requested"}]
    assert adapter.handle({"op": "input", "input": {"in": "dispose"}}) == [{"op": "accepted"}]
    assert adapter.handle({"op": "input", "input": {"in": "yell"}})[0]["op"] == "error"
    assert adapter.handle({"op": "jump"}) == [{"op": "error", "message": "unknown op 'jump'"}]
    assert adapter.handle([1]) == [{"op": "error",
                                    "message": "a request is an object with a string 'op'"}]


def test_serve_reads_lines_until_bye() -> None:
    out = io.StringIO()
    lines = ['{"op":"hello","protocol":1}\n', "not json\n", "\n", '{"op":"bye"}\n',
             '{"op":"hello"}\n']
    assert serve(lines, out) == 0
    replies = out.getvalue().splitlines()
    assert len(replies) == 3 and replies[1].startswith('{"op":"error","message":"not JSON')
    assert replies[2] == '{"op":"bye"}'


# --------------------------------------------------------------------------
# PROTOCOL.md §3, errors and timeouts: a port that leaves children behind, or floods its
# output, is a port failure (exit 4); its whole process group is ended (issue 14.4)
# --------------------------------------------------------------------------


def _gone(pid: int, within: float = 60.0) -> bool:
    """Whether process *pid* is gone (or a zombie) within *within* seconds."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return True
        if state == "Z":
            return True
        time.sleep(0.1)
    return False


def wrapped(tmp_path: Path, bug: str) -> tuple[str, Path]:
    """A wrapper in the manner of `npm run`: a shell that starts a helper holding the
    port's standard output, then becomes the port. Returns the command and where the
    helper's pid is written."""
    pidfile = tmp_path / f"helper-{bug}.pid"
    script = (f"sleep 600 & echo $! > {shlex.quote(str(pidfile))}; "
              f"exec {wrong_port('--bug', bug)}")
    return shlex.join(["sh", "-c", script]), pidfile


def test_PROTOCOL_3_a_port_whose_wrapper_leaves_a_child_on_its_output_is_ended_with_its_group(
        tmp_path: Path) -> None:
    """PROTOCOL.md §3 (the checker ends the port's whole process group; a regression of
    issue 14.4): the helper holds the port's output open, so the end of the output never
    comes; the checker times out, ends the port's whole process group and exits 4."""
    port, pidfile = wrapped(tmp_path, "hang")
    status, out, _ = run_check([A1], port, timeout=2.0)
    assert status == 4
    assert 'no reply within 2s in reply to {"op":"start"' in out
    assert _gone(int(pidfile.read_text()))


def test_PROTOCOL_3_a_port_that_exits_while_a_child_holds_its_output_is_reported_as_exited(
        tmp_path: Path) -> None:
    """PROTOCOL.md §3 (the port exiting counts even while a child of it still holds its
    output open): the port itself exits at the first pull; its helper still holds the
    output. The checker notices the exit without waiting for the (generous) reply
    timeout."""
    port, pidfile = wrapped(tmp_path, "exit")
    started = time.monotonic()
    status, out, _ = run_check([A1], port, timeout=600.0)
    assert status == 4
    assert "the port exited with status 3" in out
    assert time.monotonic() - started < 300      # far below the 600 s reply timeout
    assert _gone(int(pidfile.read_text()))


def _setsid_wrapped(tmp_path: Path, port: str, *, streams: str = "") -> tuple[str, Path]:
    """A wrapper whose helper leaves the port's session and process group (``setsid``),
    keeping the port's standard streams unless *streams* redirects them, then becomes
    *port*. Returns the command and where the helper's pid is written."""
    pidfile = tmp_path / "helper.pid"
    script = f"setsid sleep 600 {streams} & echo $! > {shlex.quote(str(pidfile))}; exec {port}"
    return shlex.join(["sh", "-c", script]), pidfile


def test_PROTOCOL_3_a_helper_that_leaves_the_group_and_keeps_the_output_is_ended(
        tmp_path: Path) -> None:
    """PROTOCOL.md §3 (the checker ends what left the group but holds the port's streams;
    a regression of issue 28): a correct port whose helper calls setsid() and keeps its
    output passes, and the helper does not outlive the checker (it was left running, and
    each vector waited for its output to end)."""
    port, pidfile = _setsid_wrapped(tmp_path, command("-m", "machine.cli.main", "adapter"))
    status, out, err = run_check([A1, A5], port)
    assert (status, out, err) == (0, "2 passed, 0 failed\n", "")
    assert _gone(int(pidfile.read_text()))


def test_PROTOCOL_3_a_hung_port_s_helper_in_a_session_of_its_own_is_ended(
        tmp_path: Path) -> None:
    """PROTOCOL.md §3 (descendants of the port's processes are ended too): the helper left
    the session and holds none of the port's streams, but its parent (the port) still runs
    when the checker gives up on it."""
    port, pidfile = _setsid_wrapped(tmp_path, wrong_port("--bug", "hang"),
                                    streams="</dev/null >/dev/null 2>&1")
    status, out, _ = run_check([A1], port, timeout=2.0)
    assert status == 4 and 'no reply within 2s in reply to {"op":"start"' in out
    assert _gone(int(pidfile.read_text()))


@pytest.mark.parametrize("bug", ["huge-line", "endless"])
def test_PROTOCOL_3_a_port_flooding_its_output_exits_4_without_a_traceback(bug: str) -> None:
    """PROTOCOL.md §3 (a reply line longer than 16 MiB, at most 256 lines read ahead):
    a 300 MB reply line, or output that never ends: `turnstile check --port` reads at
    most MAX_LINE_BYTES of a line and QUEUED_LINES ahead, reports a port failure (exit 4)
    and nothing on standard error."""
    done = subprocess.run(
        [sys.executable, "-m", "machine.cli.main", "check", "--timeout", "120", "--port",
         wrong_port("--bug", bug), A1],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 4, (done.stdout, done.stderr)
    assert done.stderr == "" and "Traceback" not in done.stdout
    if bug == "huge-line":
        assert "a reply line longer than 16,777,216 bytes" in done.stdout
    else:
        assert "not JSON" in done.stdout
