"""The §19 reentrancy matrix: every row × steer / inject / followup / cancel / dispose.

The conformance corpus holds the matrix too (``machine/conformance/corpus/matrix.py``, vectors
``M<row>-<command>``, collected as tests by ``tests/test_scenarios.py``): one position per row
and command, reviewed with what every cell states (the window column, placements, teardown:
``review_cell``). This file is the denser sweep: every place a row names, each with all five
commands. A cell that is a vector at the same position, whose assertions the vector's review
makes, is not repeated here: row 1 at the enqueue of the waking send, row 2 at ``agent/status
running`` and row 5 at ``turn/start`` (all five commands); row 3 at the claimed item's dequeue
(inject, dispose); row 19 at ``turn/end`` (all but cancel); rows 21 and 23 at ``agent/settled``
and ``agent/status idle`` (steer, inject, followup).

Each row of the matrix names places where a command can be issued. A *point* here is one
such place, realised exactly: an **observer** is a driver observer of that output (the
command lands at that output, rule P2); a **hook point** is an environment handler for that
effect kind (the command is issued while the effect is being answered, then the handler
answers). Every point runs the same small script (``followup('go')``; the model replies
``'ok'`` unless the row needs tool calls or a failure) and issues one command exactly once:

* ``steer``    → ``steer('S')`` (source user)
* ``inject``   → ``inject('C')`` (source plugin:test)
* ``followup`` → ``followup('F')``
* ``cancel``   → ``cancel({kind:'parent'})`` (``parent``, so it is told apart from a test's own
  ``user`` cancel)
* ``dispose``  → ``dispose()``: the cancel column with cause ``disposed`` and no
  ``agent/cancel-requested``, followed by teardown (§17)

The cell's expectation is the exact durable log in the scenario notation, plus the live
facts the cell states (placements, discards, cancel notices, running intervals, retained
input). Rows whose cancel column is "discards only" queue a quiet item ``Q`` first, so the
cancel has something to discard. Cells marked ``then next`` follow up with
``followup('next')`` after the script to show where retained input lands.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from scenario_helpers import L, Scenario, at, integer, msg, result_with_contexts

from machine.checking.scripted import calls_reply, model_failure, ok_result, text_reply
from machine.errors import DisposedError
from machine.io import Control, Effect, Output
from machine.jsonvalue import JsonLike

COMMANDS = ("steer", "inject", "followup", "cancel", "dispose")

ISSUE: dict[str, Callable[[Scenario], None]] = {
    "steer": lambda s: s.steer("S"),
    "inject": lambda s: s.inject("C", "plugin:test"),
    "followup": lambda s: s.followup("F"),
    "cancel": lambda s: s.cancel("parent"),
    "cancel-keepInbox": lambda s: s.cancel("parent", keep_inbox=True),
    "dispose": lambda s: s.dispose(),
}

# --------------------------------------------------------------------------
# Log fragments
# --------------------------------------------------------------------------

GO1 = "TS(1,msg:user) UM('go')"


def step(n: int, s: int, *, rh: bool = False, reply: str = "ok") -> str:
    return f"SS({n}.{s}) {'RH(initial) ' if rh else ''}CH… AM({n}.{s};'{reply}') SE({n}.{s})"


def turn(n: int, text: str, *, rh: bool = False, src: str = "") -> str:
    um = f"UM('{text}';{src})" if src else f"UM('{text}')"
    return f"TS({n},msg:user) {um} {step(n, 1, rh=rh)} TE({n},completed)"


BASE = f"{GO1} {step(1, 1, rh=True)} TE(1,completed)"
#: The reason of a turn whose request failed (FAILED1): the notation's TE shows its kind only.
ERR = {"kind": "error", "step": 1, "failure": {"message": "model unavailable", "code": "UNAVAILABLE"}}
FAILED1 = f"{GO1} SS(1.1) RH(initial) SE(1.1) TE(1,error)"
ABORTED_REQ1 = f"{GO1} SS(1.1) RH(initial) SE(1.1) TE(1,aborted)"
RETRY2 = f"TS(2,retry) {step(2, 1)} TE(2,completed)"
# D15: the cancel stops the hanging stream, which keeps what it streamed as an interrupted message
HUNG = f"{GO1} SS(1.1) RH(initial) CH CH AM(1.1;'partial reply';interrupted) SE(1.1) TE(1,aborted)"
C_UM = "UM('C';plugin:test)"
S_STM1 = "STM(1;'S';user)"


def failure() -> object:
    return model_failure("model unavailable", "UNAVAILABLE")


# --------------------------------------------------------------------------
# Expectations
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class X:
    """One matrix cell's expectation."""

    log: str
    placement: str | None = None          # the enqueue placement of 'S' / 'F' ('queued'|'steering')
    live: tuple[str, ...] = ()            # contiguous runs of live tokens that must appear
    intervals: int | None = None          # number of running intervals (running/idle pairs)
    retained: tuple[int, int] | None = None   # (steering, context) still staged after the script
    cancel_notices: int | None = None     # number of agent/cancel-requested
    check: Callable[[Scenario], None] | None = None


def lives(*runs: str) -> tuple[str, ...]:
    return runs


@dataclass(frozen=True)
class Point:
    row: str                       # the matrix row (id fragment)
    refs: str                      # the rules the row exercises
    name: str                      # where exactly the command is issued
    drive: Callable[[Scenario, Callable[[], None], bool], None]
    cells: dict[str, X]
    replies: tuple[object, ...] = ()
    tool_modes: dict[str, str] = field(default_factory=dict)
    then_next: bool = False        # follow up with followup('next') after the script
    quiet_for_cancel: bool = False  # queue a quiet 'Q' first for the cancel and dispose cells


def _text_of(data: object) -> str:
    content = data["content"]  # type: ignore[index]
    return str(content[0].get("text", ""))


def on_text(s: Scenario, type_: str, text: str, fire: Callable[[], None]) -> None:
    """An observer of the first *type_* event whose message text is *text*."""
    def observer(data: object) -> None:
        message = data["message"] if type_ == "steering/message" else data  # type: ignore[index]
        if _text_of(message) == text:
            fire()
    s.observe(type_, observer)


def call_is(call_id: str) -> Callable[[Effect], bool]:
    return lambda e: e.payload["callId"] == call_id


def fire_then(fire: Callable[[], None], answer: object = None) -> Callable[[Effect], object]:
    def hook(_e: Effect) -> object:
        fire()
        return answer
    return hook


def quiet(s: Scenario) -> None:
    s.send("Q", "next-turn", wakeup=False)


# --------------------------------------------------------------------------
# Drives: install the point, run the script
# --------------------------------------------------------------------------


def go(s: Scenario, with_quiet: bool = False) -> None:
    s.followup("go")
    if with_quiet:
        quiet(s)
    s.run()


def observer_point(type_: str, *, when: Callable[[object], bool] | None = None) -> Callable[..., None]:
    def drive(s: Scenario, fire: Callable[[], None], with_quiet: bool) -> None:
        def observer(data: object) -> None:
            if when is None or when(data):
                fire()
        s.observe(type_, observer)
        go(s, with_quiet)
    return drive


def hook_point(kind: str, *, when: Callable[[Effect], bool] | None = None,
               answer: object = None) -> Callable[..., None]:
    def drive(s: Scenario, fire: Callable[[], None], with_quiet: bool) -> None:
        s.handle(kind, fire_then(fire, answer), times=1, when=when)
        go(s, with_quiet)
    return drive


def is_idle(p: object) -> bool:
    return p["status"] == "idle"  # type: ignore[index,no-any-return]


# --------------------------------------------------------------------------
# Row: running / dequeue of the claimed item / prompt-submit (admission)
# --------------------------------------------------------------------------


def admission_cells(*commands: str) -> dict[str, X]:
    def no_turn(s: Scenario) -> None:
        assert len(s.effects("prompt-submit")) == 1
        assert s.live("agent/settled") == [] and s.effects("flush") == []

    cells = {
        "steer": X(f"{GO1} {S_STM1} {step(1, 1, rh=True)} TE(1,completed)", placement="steering"),
        "inject": X(f"{GO1} {C_UM} {step(1, 1, rh=True)} TE(1,completed)"),
        "followup": X(f"{BASE} {turn(2, 'F')}", placement="queued", intervals=1),
        "cancel": X("", live=lives("deq(go,q) cancel-req(parent) idle"), intervals=1, check=no_turn),
        "dispose": X("", live=lives("deq(go,q) idle agent/disposed session/disposed"), intervals=1,
                     check=no_turn),
    }
    return {command: cells[command] for command in commands or cells}


ROW_ADMISSION = [
    # inject and dispose at the dequeue are vectors M03-inject and M03-dispose
    Point("admission", "R7.3-R7.6-R7.7-R16.4", "dequeue-observer",
          observer_point("agent/inbox/dequeue"), admission_cells("steer", "followup", "cancel")),
    Point("admission", "R7.5-R7.7-R16.4", "prompt-submit-hook",
          hook_point("prompt-submit"), admission_cells()),
]

# --------------------------------------------------------------------------
# Row: observers of the run-start drains and of the prompt and context appends
# --------------------------------------------------------------------------


def run_start_cells(prefix: str, *, after: str = "", aborted_prefix: str | None = None,
                    discard: str = "") -> dict[str, X]:
    """*prefix* is the log up to and including the event whose observer issues the command;
    *after* is what the run start still appends before the command's own item;
    *aborted_prefix* is the log before ``turn/end`` when the command cancels."""
    mid = f"{prefix} {after}".strip()
    cut = aborted_prefix if aborted_prefix is not None else prefix

    def no_step_start(s: Scenario) -> None:
        assert s.of("step/start") == [], "the turn ends aborted with no step/start"

    return {
        "steer": X(f"{mid} {S_STM1} {step(1, 1, rh=True)} TE(1,completed)", placement="steering"),
        "inject": X(f"{mid} {C_UM} {step(1, 1, rh=True)} TE(1,completed)"),
        "followup": X(f"{mid} {step(1, 1, rh=True)} TE(1,completed) {turn(2, 'F')}",
                      placement="queued", intervals=1),
        "cancel": X(f"{cut} TE(1,aborted)", live=lives(f"cancel-req(parent) {discard}".strip()),
                    check=no_step_start),
        "dispose": X(f"{cut} TE(1,disposed)", live=lives(discard) if discard else (),
                     check=no_step_start),
    }


def drive_context_append(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    s.handle("prompt-submit", lambda _e: ("resolve", {
        "kind": "allow", "additionalContexts": [msg("A", "plugin:test")]}), times=1)
    on_text(s, "user/message", "A", fire)
    go(s)


def drive_rest_drain(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    s.handle("prompt-submit", lambda _e: s.steer("T"), times=1)
    on_text(s, "steering/message", "T", fire)
    go(s)


def drive_inherited_drain(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    def block_with_retained(_e: Effect) -> object:
        s.inject("K", "plugin:test")
        s.steer("R")
        return ("resolve", {"kind": "block", "reason": "no"})
    s.handle("prompt-submit", block_with_retained, times=1)
    on_text(s, "user/message", "K", fire)
    s.followup("B")
    s.followup("go")
    s.run()


ROW_RUN_START = [
    Point("run-start-drain-and-append-observers", "R8.3-R11.1-D3", "prompt-append-observer",
          observer_point("user/message"), run_start_cells(GO1)),
    Point("run-start-drain-and-append-observers", "R7.7-R8.3-D3", "decision-context-append-observer",
          drive_context_append, run_start_cells(f"{GO1} UM('A';plugin:test)")),
    Point("run-start-drain-and-append-observers", "R8.3.4-R11.1-D3", "rest-drain-output-observer",
          drive_rest_drain, run_start_cells(f"{GO1} STM(1;'T';user)")),
    Point("run-start-drain-and-append-observers", "R8.3.1-R11.1-R7.10", "inherited-drain-output-observer",
          drive_inherited_drain,
          run_start_cells("TS(1,msg:user) UM('K';plugin:test)", after="STM(1;'R';user) UM('go')",
                          aborted_prefix="TS(1,msg:user) UM('K';plugin:test) UM('go')",
                          discard="disc[R]")),
]

# --------------------------------------------------------------------------
# Row: the step extension point; observers of the top-of-step drain's outputs
# --------------------------------------------------------------------------


def top_of_step_cells(prefix: str) -> dict[str, X]:
    def same_request(s: Scenario) -> None:
        assert len(s.of("step/start")) == 1 and len(s.requests) == 1

    def in_request(label: str) -> Callable[[Scenario], None]:
        def check(s: Scenario) -> None:
            same_request(s)
            assert label in s.request(1)
        return check

    return {
        "steer": X(f"{prefix} {S_STM1} {step(1, 1, rh=True)} TE(1,completed)", placement="steering",
                   check=in_request("'S'")),
        "inject": X(f"{prefix} {C_UM} {step(1, 1, rh=True)} TE(1,completed)",
                    check=in_request("'C';plugin:test")),
        "followup": X(f"{prefix} {step(1, 1, rh=True)} TE(1,completed) {turn(2, 'F')}",
                      placement="queued", intervals=1),
        "cancel": X(f"{prefix} TE(1,aborted)", cancel_notices=1),
        "dispose": X(f"{prefix} TE(1,disposed)", cancel_notices=0),
    }


def drive_top_drain(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    s.handle("step", lambda _e: s.inject("P", "plugin:test"), times=1)
    on_text(s, "user/message", "P", fire)
    go(s)


ROW_STEP_HOOK = [
    Point("step-hook-and-top-of-step-drain", "R9.1-R9.2-P8", "step-hook",
          hook_point("step"), top_of_step_cells(GO1)),
    Point("step-hook-and-top-of-step-drain", "R9.2-R11.1-D3", "top-of-step-drain-output-observer",
          drive_top_drain, top_of_step_cells(f"{GO1} UM('P';plugin:test)")),
]

# --------------------------------------------------------------------------
# Row: assembly, step/start, request hook, request/header, model call, assistant/chunk
# --------------------------------------------------------------------------


def streaming_cells(aborted_prefix: str) -> dict[str, X]:
    def next_request(label: str) -> Callable[[Scenario], None]:
        def check(s: Scenario) -> None:
            assert label not in s.request(1) and label in s.request(2)
        return check

    def no_extra_step(s: Scenario) -> None:
        assert len(s.of("step/start")) == 1 and "'C';plugin:test" not in s.request(1)

    first = f"{GO1} SS(1.1) RH(initial) CH… AM(1.1;'ok')"
    return {
        "steer": X(f"{first} {S_STM1} SE(1.1) {step(1, 2)} TE(1,completed)", placement="steering",
                   check=next_request("'S'")),
        "inject": X(f"{first} {C_UM} SE(1.1) TE(1,completed)", check=no_extra_step),
        "followup": X(f"{BASE} {turn(2, 'F')}", placement="queued", intervals=1),
        "cancel": X(f"{aborted_prefix} TE(1,aborted)", cancel_notices=1),
        "dispose": X(f"{aborted_prefix} TE(1,disposed)", cancel_notices=0),
    }


def fire_at_abort(output: Output, fire: Callable[[], None]) -> None:
    """Call *fire* at an ``abort`` control output."""
    if isinstance(output, Control) and output.kind == "abort":
        fire()


def drive_model_call(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    def reply(_e: Effect) -> list[JsonLike]:
        fire()
        return text_reply("ok")
    s.handle("model", reply, times=1)
    go(s)


ROW_STREAMING = [
    Point("assembly-request-and-stream", "R9.3-R9.5-R11.2-P8", "system-prompt-hook",
          hook_point("system-prompt"), streaming_cells(GO1)),
    Point("assembly-request-and-stream", "R9.5-R11.2-P8", "step-start-observer",
          observer_point("step/start"), streaming_cells(f"{GO1} SS(1.1) SE(1.1)")),
    Point("assembly-request-and-stream", "R9.6-R11.2-P8", "request-hook",
          hook_point("request"), streaming_cells(f"{GO1} SS(1.1) SE(1.1)")),
    Point("assembly-request-and-stream", "R9.6-R9.7-R11.2-P8", "request-header-observer",
          observer_point("request/header"), streaming_cells(f"{GO1} SS(1.1) RH(initial) SE(1.1)")),
    Point("assembly-request-and-stream", "R9.7-R11.2-P8", "model-call-hook",
          drive_model_call, streaming_cells(f"{GO1} SS(1.1) RH(initial) SE(1.1)")),
    Point("assembly-request-and-stream", "R9.7-R11.2-P8", "assistant-chunk-observer",
          observer_point("assistant/chunk"),
          streaming_cells(f"{GO1} SS(1.1) RH(initial) CH AM(1.1;'ok';interrupted) SE(1.1)")),
]

# --------------------------------------------------------------------------
# Row: assistant/message observers; tool stages; tool/call and tool/result observers
# --------------------------------------------------------------------------

TOOLS_PRE = f"{GO1} SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) TC(1.1;c1)"
CTX = "UM('ctx-c1';plugin:tool)"
TOOLS_OK = "TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ok)"
TOOLS_NEXT = f"SE(1.1) {step(1, 2, reply='done')} TE(1,completed)"


def tool_cells(point: str) -> dict[str, X]:
    late = point == "execute-c2"      # c1's context is already staged when the command lands
    steer_drain = f"{CTX} {S_STM1}" if late else f"{S_STM1} {CTX}"
    inject_drain = f"{CTX} {C_UM}" if late else f"{C_UM} {CTX}"
    results = {
        "am": "TR(1.1;c1;ERR ABD) TC(1.1;c2) TR(1.1;c2;ERR ABD)",
        "prepare-c1": "TR(1.1;c1;ERR ABD) TC(1.1;c2) TR(1.1;c2;ERR ABD)",
        "tool-call-c1": "TR(1.1;c1;ERR ABD) TC(1.1;c2) TR(1.1;c2;ERR ABD)",
        "execute-c1": f"TR(1.1;c1;ERR ABORTED) TC(1.1;c2) TR(1.1;c2;ERR ABD) {CTX}",
        # R10.4 step 1: a successful finalized result consumed after the abort is ABORTED
        "finalize-c1": f"TR(1.1;c1;ERR ABORTED) TC(1.1;c2) TR(1.1;c2;ERR ABD) {CTX}",
        "tool-result-c1": f"TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ERR ABD) {CTX}",
        "execute-c2": "TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ERR ABORTED)",
    }[point]
    discards = lives("ctxdisc[ctx-c1]") if late else ()
    executed = {"am": [], "prepare-c1": [], "tool-call-c1": [], "execute-c1": ["c1"],
                "finalize-c1": ["c1"], "tool-result-c1": ["c1"], "execute-c2": ["c1", "c2"]}[point]

    def bodies(s: Scenario) -> None:
        assert [e.payload["callId"] for e in s.effects("tool-execute")] == executed
        assert s.live_tokens("agent/context/discard") == list(discards)

    return {
        "steer": X(f"{TOOLS_PRE} {TOOLS_OK} {steer_drain} {TOOLS_NEXT}", placement="steering"),
        "inject": X(f"{TOOLS_PRE} {TOOLS_OK} {inject_drain} {TOOLS_NEXT}"),
        "followup": X(f"{TOOLS_PRE} {TOOLS_OK} {CTX} {TOOLS_NEXT} {turn(2, 'F')}", placement="queued",
                      intervals=1),
        "cancel": X(f"{TOOLS_PRE} {results} SE(1.1) TE(1,aborted)",
                    live=lives(" ".join(["cancel-req(parent)", *discards])), check=bodies),
        "dispose": X(f"{TOOLS_PRE} {results} SE(1.1) TE(1,disposed)", live=discards, check=bodies),
    }


def tools_point(name: str, drive: Callable[..., None]) -> Point:
    return Point("assistant-message-and-tool-batch", "R10.3-R10.4-R10.5-R10.7-R10.11-D6", name,
                 drive, tool_cells(name),
                 replies=(calls_reply(("c1", "t"), ("c2", "t")), text_reply("done")))


def with_c1_context(drive: Callable[..., None]) -> Callable[..., None]:
    def wrapped(s: Scenario, fire: Callable[[], None], q: bool) -> None:
        s.env.tool_results["c1"] = result_with_contexts("ok", msg("ctx-c1", "plugin:tool"))
        drive(s, fire, q)
    return wrapped


ROW_TOOLS = [
    tools_point("am", with_c1_context(observer_point("assistant/message"))),
    tools_point("prepare-c1", with_c1_context(hook_point("tool-prepare", when=call_is("c1")))),
    tools_point("execute-c1", with_c1_context(hook_point("tool-execute", when=call_is("c1")))),
    tools_point("finalize-c1", with_c1_context(hook_point("tool-finalize", when=call_is("c1")))),
    tools_point("tool-call-c1", with_c1_context(observer_point("tool/call"))),
    tools_point("tool-result-c1", with_c1_context(observer_point("tool/result"))),
    tools_point("execute-c2", with_c1_context(hook_point("tool-execute", when=call_is("c2")))),
]

# --------------------------------------------------------------------------
# Row: observers of the end-of-step drain's outputs
# --------------------------------------------------------------------------


def drive_end_drain(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    s.handle("request", lambda _e: s.inject("late", "plugin:test"), times=1)
    on_text(s, "user/message", "late", fire)
    go(s)


END_PRE = f"{GO1} SS(1.1) RH(initial) CH… AM(1.1;'ok') UM('late';plugin:test)"
ROW_END_DRAIN = [Point(
    "end-of-step-drain-output-observers", "R9.10-R11.1-D3", "end-drain-output-observer",
    drive_end_drain, {
        "steer": X(f"{END_PRE} {S_STM1} SE(1.1) {step(1, 2)} TE(1,completed)", placement="steering"),
        "inject": X(f"{END_PRE} {C_UM} SE(1.1) TE(1,completed)"),
        "followup": X(f"{END_PRE} SE(1.1) TE(1,completed) {turn(2, 'F')}", placement="queued",
                      intervals=1),
        "cancel": X(f"{END_PRE} SE(1.1) TE(1,aborted)", cancel_notices=1),
        "dispose": X(f"{END_PRE} SE(1.1) TE(1,disposed)", cancel_notices=0),
    })]

# --------------------------------------------------------------------------
# Row: step/end observers
# --------------------------------------------------------------------------


def stopping_count(n: int) -> Callable[[Scenario], None]:
    def check(s: Scenario) -> None:
        assert len(s.effects("turn-stopping")) == n
    return check


FINAL1 = f"{GO1} {step(1, 1, rh=True)}"
CALL1 = f"{GO1} SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) TR(1.1;c1;ok) SE(1.1)"
NEXT2 = f"{step(2, 1)} TE(2,completed)"


def drive_concluded(s: Scenario, fire: Callable[[], None], q: bool) -> None:
    s.env.tool_results["c1"] = ok_result(concludesTurn=True)
    observer_point("step/end")(s, fire, q)


def no_recovery(s: Scenario) -> None:
    assert s.effects("request-error") == [], "recovery is not invoked once the signal is aborted"


ROW_STEP_END = [
    Point("step-end-observers", "R8.4-R8.5", "step-end-observer-final-step",
          observer_point("step/end"), {
              "steer": X(f"{FINAL1} {S_STM1} {step(1, 2)} TE(1,completed)", placement="steering",
                         check=stopping_count(1)),
              "inject": X(f"{FINAL1} {C_UM} TE(1,completed)", check=stopping_count(1)),
              "followup": X(f"{BASE} {turn(2, 'F')}", placement="queued", intervals=1),
              "cancel": X(f"{FINAL1} TE(1,aborted)", cancel_notices=1),
              "dispose": X(f"{FINAL1} TE(1,disposed)", cancel_notices=0),
          }),
    Point("step-end-observers", "R8.4-R9.2", "step-end-observer-continuing-step",
          observer_point("step/end"), {
              "steer": X(f"{CALL1} {S_STM1} {step(1, 2)} TE(1,completed)", placement="steering"),
              "inject": X(f"{CALL1} {C_UM} {step(1, 2)} TE(1,completed)"),
              "followup": X(f"{CALL1} {step(1, 2)} TE(1,completed) {turn(2, 'F')}",
                            placement="queued", intervals=1),
              "cancel": X(f"{CALL1} TE(1,aborted)", cancel_notices=1),
              "dispose": X(f"{CALL1} TE(1,disposed)", cancel_notices=0),
          }, replies=(calls_reply(("c1", "t")),)),
    Point("step-end-observers", "R8.4-R10.6-R11.3", "step-end-observer-concluding-step",
          drive_concluded, {
              "steer": X(f"{CALL1} TE(1,completed) TS(2,msg:user) STM(2;'S';user) UM('next') {NEXT2}",
                         placement="steering", retained=(1, 0)),
              "inject": X(f"{CALL1} TE(1,completed) TS(2,msg:user) {C_UM} UM('next') {NEXT2}",
                          retained=(0, 1)),
              "followup": X(f"{CALL1} TE(1,completed) {turn(2, 'F')} {turn(3, 'next')}",
                            placement="queued"),
              # R8.4: a concluding step ends the turn with no signal check, as in the
              # original: the cancel is effective but the reason stays completed.
              "cancel": X(f"{CALL1} TE(1,completed) {turn(2, 'next')}", cancel_notices=1),
              "dispose": X(f"{CALL1} TE(1,completed)", cancel_notices=0),
          }, replies=(calls_reply(("c1", "t")),), then_next=True),
    Point("step-end-observers", "R13.2-R11.3", "step-end-observer-failed-step",
          observer_point("step/end"), {
              "steer": X(f"{FAILED1} TS(2,msg:user) STM(2;'S';user) UM('next') {NEXT2}",
                         placement="steering", retained=(1, 0)),
              "inject": X(f"{FAILED1} TS(2,msg:user) {C_UM} UM('next') {NEXT2}", retained=(0, 1)),
              "followup": X(f"{FAILED1} {turn(2, 'F')} {turn(3, 'next')}", placement="queued"),
              "cancel": X(f"{ABORTED_REQ1} {turn(2, 'next')}", cancel_notices=1, check=no_recovery),
              "dispose": X(f"{GO1} SS(1.1) RH(initial) SE(1.1) TE(1,disposed)", cancel_notices=0),
          }, replies=(failure(),), then_next=True),
]



# --------------------------------------------------------------------------
# Row: the turn-stopping extension point; observers of its drain's outputs
# --------------------------------------------------------------------------


def drive_stop_drain(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    s.handle("turn-stopping", lambda _e: s.inject("Z", "plugin:test"), times=1)
    on_text(s, "user/message", "Z", fire)
    go(s)


def turn_stopping_cells(prefix: str, *, checked: bool) -> dict[str, X]:
    """*checked*: whether a signal check follows the position (R8.5: the hook's check does;
    at an output of its drain, none follows when the drain took no steering)."""
    aborted, disposed = ("aborted", "disposed") if checked else ("completed", "completed")
    return {
        "steer": X(f"{prefix} {S_STM1} {step(1, 2)} TE(1,completed)", placement="steering"),
        "inject": X(f"{prefix} {C_UM} TE(1,completed)"),
        "followup": X(f"{prefix} TE(1,completed) {turn(2, 'F')}", placement="queued", intervals=1),
        "cancel": X(f"{prefix} TE(1,{aborted})", cancel_notices=1),
        "dispose": X(f"{prefix} TE(1,{disposed})", cancel_notices=0),
    }


ROW_TURN_STOPPING = [
    Point("turn-stopping-and-its-drain", "R8.5-P10", "turn-stopping-hook",
          hook_point("turn-stopping"), turn_stopping_cells(FINAL1, checked=True)),
    Point("turn-stopping-and-its-drain", "R8.5-R11.1-D3", "turn-stopping-drain-output-observer",
          drive_stop_drain, turn_stopping_cells(f"{FINAL1} UM('Z';plugin:test)", checked=False)),
]

# --------------------------------------------------------------------------
# Row: the request-error extension point; agent/error observers inside a turn
# --------------------------------------------------------------------------

RETRY = ("resolve", {"kind": "retry"})


def drive_agent_error(s: Scenario, fire: Callable[[], None], q: bool) -> None:
    s.handle("request-error", lambda _e: RETRY)
    observer_point("agent/error")(s, fire, q)


def settles(*tokens: str) -> Callable[[Scenario], None]:
    def check(s: Scenario) -> None:
        assert s.live_tokens("agent/settled") == list(tokens)
    return check


ROW_REQUEST_ERROR = [
    Point("request-error-and-agent-error", "R13.2-R11.3-R16.4", "request-error-hook-no-retry",
          hook_point("request-error"), {
              "steer": X(f"{FAILED1} TS(2,msg:user) STM(2;'S';user) UM('next') {NEXT2}",
                         placement="steering", retained=(1, 0)),
              "inject": X(f"{FAILED1} TS(2,msg:user) {C_UM} UM('next') {NEXT2}", retained=(0, 1)),
              "followup": X(f"{FAILED1} {turn(2, 'F')} {turn(3, 'next')}", placement="queued"),
              "cancel": X(f"{ABORTED_REQ1} {turn(2, 'next')}", cancel_notices=1),
              "dispose": X(f"{GO1} SS(1.1) RH(initial) SE(1.1) TE(1,disposed)", cancel_notices=0),
          }, replies=(failure(),), then_next=True),
    Point("request-error-and-agent-error", "R13.2-R13.3-R13.5-D2", "request-error-hook-retry",
          hook_point("request-error", answer=RETRY), {
              "steer": X(f"{FAILED1} TS(2,retry) STM(2;'S';user) {step(2, 1)} TE(2,completed)",
                         placement="steering", check=settles("settled(2,completed)")),
              "inject": X(f"{FAILED1} TS(2,retry) {C_UM} {step(2, 1)} TE(2,completed)"),
              "followup": X(f"{FAILED1} {RETRY2} {turn(3, 'F')}", placement="queued", intervals=1),
              "cancel": X(ABORTED_REQ1, cancel_notices=1, check=settles("settled(1,aborted)")),
              "dispose": X(f"{GO1} SS(1.1) RH(initial) SE(1.1) TE(1,disposed)", cancel_notices=0),
          }, replies=(failure(),)),
    Point("request-error-and-agent-error", "R13.5-R15.2-D2", "agent-error-observer",
          drive_agent_error, {
              "steer": X(f"{FAILED1} TS(2,retry) STM(2;'S';user) {step(2, 1)} TE(2,completed)",
                         placement="steering"),
              "inject": X(f"{FAILED1} TS(2,retry) {C_UM} {step(2, 1)} TE(2,completed)"),
              "followup": X(f"{FAILED1} {RETRY2} {turn(3, 'F')}", placement="queued", intervals=1),
              "cancel": X(FAILED1, cancel_notices=1, check=settles("settled(1,error)")),
              "dispose": X(FAILED1, cancel_notices=0, check=settles("settled(1,error)")),
          }, replies=(failure(),)),
]

# --------------------------------------------------------------------------
# Row: turn/end observers
# --------------------------------------------------------------------------


def drive_turn_end_retry(s: Scenario, fire: Callable[[], None], q: bool) -> None:
    s.handle("request-error", lambda _e: RETRY)
    observer_point("turn/end")(s, fire, q)


def one_wake(s: Scenario) -> None:
    wakes = [e for e in s.effects("tick") if e.payload["purpose"] == "wake"]
    assert len(wakes) == 1      # the command was queued without a wake of its own


ROW_TURN_END = [
    # steer, inject, followup and dispose at turn/end are vectors M19-*
    Point("turn-end-observers", "R12.1-R12.2-R12.3-D4", "turn-end-observer",
          observer_point("turn/end"), {
              "cancel": X(BASE, live=lives("cancel-req(parent) settled(1,completed) idle"),
                          cancel_notices=1),
          }),
    Point("turn-end-observers", "R12.2-R13.5-D2", "turn-end-observer-retry-pending",
          drive_turn_end_retry, {
              "steer": X(f"{FAILED1} {RETRY2} {turn(3, 'S')}", placement="queued", intervals=1),
              "inject": X(f"{FAILED1} {C_UM} {RETRY2}"),
              "followup": X(f"{FAILED1} {RETRY2} {turn(3, 'F')}", placement="queued", intervals=1),
              "cancel": X(FAILED1, cancel_notices=1, check=settles("settled(1,error)")),
              "dispose": X(FAILED1, cancel_notices=0, check=settles("settled(1,error)")),
          }, replies=(failure(),)),
]

# --------------------------------------------------------------------------
# Row: during the post-turn flush
# --------------------------------------------------------------------------


def drive_flush_retry(s: Scenario, fire: Callable[[], None], q: bool) -> None:
    s.handle("request-error", lambda _e: RETRY)
    hook_point("flush")(s, fire, q)


def quiet_survives(s: Scenario) -> None:
    assert s.core.pending_queued == 1 and s.live("agent/inbox/discard") == []


ROW_FLUSH = [
    Point("post-turn-flush", "R12.4-R6.1-D1", "flush-hook",
          hook_point("flush"), {
              "steer": X(f"{BASE} {turn(2, 'S')}", placement="queued", intervals=1, check=one_wake),
              "inject": X(f"{BASE} {C_UM}"),
              "followup": X(f"{BASE} {turn(2, 'F')}", placement="queued", intervals=1, check=one_wake),
              "cancel": X(BASE, live=lives("cancel-req(parent) disc[Q] settled(1,completed) idle")),
              "dispose": X(BASE, live=lives("disc[Q] settled(1,completed) idle agent/disposed "
                                            "session/disposed")),
          }, quiet_for_cancel=True),
    Point("post-turn-flush", "R12.4-R12.5-R13.5-D1-D2", "flush-hook-retry-pending",
          drive_flush_retry, {
              "steer": X(f"{FAILED1} {RETRY2} {turn(3, 'S')}", placement="queued", intervals=1),
              "inject": X(f"{FAILED1} {C_UM} {RETRY2}"),
              "followup": X(f"{FAILED1} {RETRY2} {turn(3, 'F')}", placement="queued", intervals=1),
              "cancel": X(FAILED1, live=lives("cancel-req(parent) disc[Q] settled(1,error) idle")),
              "cancel-keepInbox": X(FAILED1, live=lives("cancel-req(parent) settled(1,error) idle"),
                                    check=quiet_survives),
              "dispose": X(FAILED1, live=lives("disc[Q] settled(1,error) idle agent/disposed "
                                               "session/disposed")),
          }, replies=(failure(),), quiet_for_cancel=True),
]

# --------------------------------------------------------------------------
# Row: agent/settled observers
# --------------------------------------------------------------------------

ROW_SETTLED = [Point(   # steer, inject and followup at agent/settled are vectors M21-*
    "settled-observers", "R12.5-R12.7", "settled-observer",
    observer_point("agent/settled"), {
        "cancel": X(BASE, live=lives("settled(1,completed) cancel-req(parent) disc[Q] idle")),
        "dispose": X(BASE, live=lives("settled(1,completed) disc[Q] idle agent/disposed "
                                      "session/disposed")),
    }, quiet_for_cancel=True)]

# --------------------------------------------------------------------------
# Row: the rejected-admission tail (observers of its context appends; its tick)
# --------------------------------------------------------------------------


def rejected_tail(point: str) -> Callable[..., None]:
    def drive(s: Scenario, fire: Callable[[], None], with_quiet: bool) -> None:
        def block(_e: Effect) -> object:
            s.inject("K", "plugin:test")
            if with_quiet:
                quiet(s)
            return ("resolve", {"kind": "block", "reason": "no"})
        s.handle("prompt-submit", block, times=1)
        if point == "context-append":
            on_text(s, "user/message", "K", fire)
        else:
            s.handle("tick", fire_then(fire), times=1,
                     when=lambda e: e.payload["purpose"] == "rejected-admission")
        s.followup("B")
        s.run()
    return drive


def rejected_cells() -> dict[str, X]:
    k = "UM('K';plugin:test)"
    return {
        "steer": X(f"{k} {turn(1, 'S', rh=True)}", placement="queued", intervals=1, check=one_wake),
        "inject": X(f"{k} {C_UM}"),
        "followup": X(f"{k} {turn(1, 'F', rh=True)}", placement="queued", intervals=1,
                      check=one_wake),
        "cancel": X(k, live=lives("cancel-req(parent) disc[Q] idle")),
        "dispose": X(k, live=lives("disc[Q] idle agent/disposed session/disposed")),
    }


ROW_REJECTED = [
    Point("rejected-admission-tail", "R7.10-D1", "context-append-observer",
          rejected_tail("context-append"), rejected_cells(), quiet_for_cancel=True),
    Point("rejected-admission-tail", "R7.10-D1", "tail-tick",
          rejected_tail("tick"), rejected_cells(), quiet_for_cancel=True),
]

# --------------------------------------------------------------------------
# Row: agent/status('idle') observers
# --------------------------------------------------------------------------

ROW_IDLE = [Point(   # steer, inject and followup at agent/status idle are vectors M23-*
    "status-idle-observers", "R12.7-R6.1-R16.4", "status-idle-observer",
    observer_point("agent/status", when=is_idle), {
        "cancel": X(BASE, live=lives("idle cancel-req(parent) disc[Q]"), intervals=1),
        "dispose": X(BASE, live=lives("idle disc[Q] agent/disposed session/disposed"), intervals=1),
    }, quiet_for_cancel=True)]

# --------------------------------------------------------------------------
# Row: agent/cancel-requested observers
# --------------------------------------------------------------------------


def hanging_then_cancel(*, keep: bool = False, stage: Callable[[Scenario], None] | None = None,
                        watch: str = "agent/cancel-requested",
                        on_control: bool = False) -> Callable[..., None]:
    """Model hangs after two chunks; *stage* adds pending input; the test cancels(user)."""
    def drive(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
        s.hold("model")
        go(s)
        model = s.hang_model()
        if stage is not None:
            stage(s)
            s.run()
        if on_control:
            s.on_output(lambda o: fire_at_abort(o, fire))
        else:
            s.observe(watch, lambda _p: fire(), once=True)
        s.cancel("user", keep_inbox=keep)
        s.run()
        s.model_honours_abort(model)
    return drive


def idle_then_cancel(watch: str) -> Callable[..., None]:
    def drive(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
        s.pump()
        quiet(s)
        s.observe(watch, lambda _p: fire(), once=True)
        s.cancel("user")
        s.run()
    return drive


def reason_is(kind: str) -> Callable[[Scenario], None]:
    def check(s: Scenario) -> None:
        signal = integer(s.requests[0].payload["signal"])
        reason = s.core.signal_reason(signal)
        assert reason is None or reason.kind == kind
        aborts = [o for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]
        assert [at(a.payload, "reason", "kind") for a in aborts] == [kind]
    return check


ROW_CANCEL_REQUESTED = [
    Point("cancel-requested-observers", "R16.2-R16.3-P7", "cancel-requested-observer-in-turn",
          hanging_then_cancel(), {
              "steer": X(HUNG, placement="steering",
                         live=lives("cancel-req(user) enq(S,s) disc[S]")),
              "inject": X(HUNG, live=lives("cancel-req(user) ctxdisc[C]")),
              "followup": X(HUNG, placement="queued",
                            live=lives("cancel-req(user) enq(F,q) disc[F]"), intervals=1),
              # D9: a joined cancel with nothing new to clear does nothing
              "cancel": X(HUNG, live=lives("cancel-req(user)"), cancel_notices=1,
                          check=reason_is("user")),
              "dispose": X(HUNG, live=lives("agent/disposed session/disposed"), cancel_notices=1,
                           check=reason_is("user")),
          }),
    Point("cancel-requested-observers", "R16.2-R16.3-R5.2-P7", "cancel-requested-observer-while-idle",
          idle_then_cancel("agent/cancel-requested"), {
              "steer": X("", placement="queued", live=lives("cancel-req(user) enq(S,q) disc[Q,S]"),
                         intervals=0),
              "inject": X(C_UM, live=lives("cancel-req(user) disc[Q]"), intervals=0),
              "followup": X("", placement="queued", live=lives("cancel-req(user) enq(F,q) disc[Q,F]"),
                            intervals=0),
              "cancel": X("", live=lives("cancel-req(user) disc[Q]"), intervals=0,
                          cancel_notices=1),                      # D9
              "dispose": X("", live=lives("cancel-req(user) disc[Q] agent/disposed session/disposed"),
                           intervals=0, cancel_notices=1),
          }),
    Point("cancel-requested-observers", "R16.5-R11.3-P7", "cancel-requested-observer-keepInbox",
          hanging_then_cancel(keep=True), {
              "steer": X(f"{HUNG} TS(2,msg:user) STM(2;'S';user) UM('next') {NEXT2}",
                         placement="steering", retained=(1, 0)),
              "inject": X(f"{HUNG} TS(2,msg:user) {C_UM} UM('next') {NEXT2}", retained=(0, 1)),
              "followup": X(f"{HUNG} {turn(2, 'F')} {turn(3, 'next')}", placement="queued"),
              "cancel": X(f"{HUNG} {turn(2, 'next')}", live=lives("cancel-req(user)"),
                          cancel_notices=1, check=reason_is("user")),            # D9
              "dispose": X(HUNG, cancel_notices=1, check=reason_is("user")),
          }, then_next=True),
]

# --------------------------------------------------------------------------
# Row: agent/inbox/discard, agent/context/discard and abort-signal observers
# --------------------------------------------------------------------------


def discard_in_turn_cells(discard: str) -> dict[str, X]:
    return {
        "steer": X(f"{HUNG} TS(2,msg:user) STM(2;'S';user) UM('next') {NEXT2}", placement="steering",
                   live=lives(f"{discard} enq(S,s)"), retained=(1, 0)),
        "inject": X(f"{HUNG} TS(2,msg:user) {C_UM} UM('next') {NEXT2}", retained=(0, 1)),
        "followup": X(f"{HUNG} {turn(2, 'F')} {turn(3, 'next')}", placement="queued",
                      live=lives(f"{discard} enq(F,q)")),
        # an abort owner still exists (the turn is running), so the cancel is effective (§16.1)
        "cancel": X(f"{HUNG} {turn(2, 'next')}", live=lives(f"{discard} cancel-req(parent)"),
                    cancel_notices=2, check=reason_is("user")),
        "dispose": X(HUNG, cancel_notices=1, check=reason_is("user")),
    }


ABORT_PRE = f"{GO1} SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) TR(1.1;c1;ERR ABORTED)"


def drive_abort_in_batch(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    s.hold("tool-execute")
    go(s)
    execute = s.take("tool-execute")
    s.on_output(lambda o: fire_at_abort(o, fire))
    s.cancel("user")
    s.run()
    s.core.resolve(execute.id, ok_result())
    s.run()


ROW_DISCARD = [
    Point("discard-and-abort-observers", "R16.2-step4-P7", "inbox-discard-observer-in-turn",
          hanging_then_cancel(stage=lambda s: s.followup("tail"), watch="agent/inbox/discard"),
          discard_in_turn_cells("disc[tail]"), then_next=True),
    Point("discard-and-abort-observers", "R16.2-step4-D6", "context-discard-observer-in-turn",
          hanging_then_cancel(stage=lambda s: s.inject("ctx0"), watch="agent/context/discard"),
          discard_in_turn_cells("ctxdisc[ctx0]"), then_next=True),
    Point("discard-and-abort-observers", "R16.2-step4-R10.7-R10.8", "abort-signal-observer-in-batch",
          drive_abort_in_batch, {
              "steer": X(f"{ABORT_PRE} {S_STM1} SE(1.1) TE(1,aborted)", placement="steering"),
              "inject": X(f"{ABORT_PRE} {C_UM} SE(1.1) TE(1,aborted)"),
              "followup": X(f"{ABORT_PRE} SE(1.1) TE(1,aborted) {turn(2, 'F')}", placement="queued",
                            intervals=1),
              "cancel": X(f"{ABORT_PRE} SE(1.1) TE(1,aborted)",
                          live=lives("cancel-req(user) cancel-req(parent)"), cancel_notices=2,
                          check=reason_is("user")),
              "dispose": X(f"{ABORT_PRE} SE(1.1) TE(1,aborted)", cancel_notices=1,
                           check=reason_is("user")),
          }, replies=(calls_reply(("c1", "t")),)),
    Point("discard-and-abort-observers", "R16.1-R16.2-step4", "inbox-discard-observer-while-idle",
          idle_then_cancel("agent/inbox/discard"), {
              "steer": X(turn(1, "S", rh=True), placement="queued",
                         live=lives("cancel-req(user) disc[Q] enq(S,q) running"), intervals=1),
              "inject": X(C_UM, live=lives("cancel-req(user) disc[Q]"), intervals=0),
              "followup": X(turn(1, "F", rh=True), placement="queued", intervals=1),
              "cancel": X("", live=lives("cancel-req(user) disc[Q]"), cancel_notices=1, intervals=0),
              "dispose": X("", live=lives("cancel-req(user) disc[Q] agent/disposed session/disposed"),
                           cancel_notices=1, intervals=0),
          }),
]

# --------------------------------------------------------------------------
# Row: agent/session-start observers
# --------------------------------------------------------------------------


def drive_session_start(s: Scenario, fire: Callable[[], None], _q: bool) -> None:
    s.observe("agent/session-start", lambda _p: fire(), once=True)
    s.pump()
    if s.core.disposed:
        with pytest.raises(DisposedError):
            s.followup("go")
        return
    go(s)


ROW_SESSION_START = [Point(
    "session-start-observers", "R23.2-R6.1-R5.2", "session-start-observer",
    drive_session_start, {
        "steer": X(f"{turn(1, 'S', rh=True)} {turn(2, 'go')}", placement="queued", intervals=1),
        "inject": X(f"{C_UM} {BASE}"),
        "followup": X(f"{turn(1, 'F', rh=True)} {turn(2, 'go')}", placement="queued", intervals=1),
        "cancel": X(BASE, cancel_notices=0),
        "dispose": X("", live=lives("agent/disposed session/disposed"), intervals=0),
    })]

# --------------------------------------------------------------------------
# The matrix
# --------------------------------------------------------------------------

POINTS: list[Point] = [
    *ROW_ADMISSION, *ROW_RUN_START, *ROW_STEP_HOOK, *ROW_STREAMING,
    *ROW_TOOLS, *ROW_END_DRAIN, *ROW_STEP_END, *ROW_TURN_STOPPING, *ROW_REQUEST_ERROR,
    *ROW_TURN_END, *ROW_FLUSH, *ROW_SETTLED, *ROW_REJECTED, *ROW_IDLE, *ROW_CANCEL_REQUESTED,
    *ROW_DISCARD, *ROW_SESSION_START,
]

# Cells where the core departs from the spec (strict xfail with the reason). Empty: the
# earlier ones (final signal check before closing, R8.4/R8.5; nested cancel joins, P7) are fixed.
KNOWN_CORE_BUGS: dict[str, str] = {}


def _cases() -> list[object]:
    cases: list[object] = []
    unused = set(KNOWN_CORE_BUGS)
    for point in POINTS:
        for command, cell in point.cells.items():
            case_id = f"R19-{point.row}-{point.name}-{command}-{point.refs}"
            marks = []
            if case_id in KNOWN_CORE_BUGS:
                unused.discard(case_id)
                marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_CORE_BUGS[case_id]))
            cases.append(pytest.param(point, command, cell, id=case_id, marks=marks))
    assert not unused, f"KNOWN_CORE_BUGS names no case: {sorted(unused)}"
    return cases


# The window column of §19: closed at these points, open at every other.
WINDOW_CLOSED = frozenset({
    "turn-end-observer", "turn-end-observer-retry-pending", "flush-hook",
    "flush-hook-retry-pending", "settled-observer", "context-append-observer", "tail-tick",
    "status-idle-observer", "cancel-requested-observer-while-idle",
    "inbox-discard-observer-while-idle", "session-start-observer",
})


def find_run(tokens: list[str], run: list[str]) -> bool:
    return any(tokens[i:i + len(run)] == run for i in range(len(tokens) - len(run) + 1))


@pytest.mark.parametrize(("point", "command", "cell"), _cases())
def test_R19_reentrancy_matrix(point: Point, command: str, cell: X) -> None:
    replies = list(point.replies)
    s = Scenario(*replies, tool_modes=point.tool_modes)  # type: ignore[arg-type]
    fired: list[str] = []
    window: list[bool] = []

    def fire() -> None:
        if not fired:
            fired.append(command)
            window.append(s.core.accepts_next_step)
            ISSUE[command](s)

    with_quiet = point.quiet_for_cancel and command.startswith(("cancel", "dispose"))
    point.drive(s, fire, with_quiet)
    assert fired == [command], "the command was never issued at this point"
    assert window == [point.name not in WINDOW_CLOSED], "the window column of the row"
    if cell.retained is not None:
        assert (s.core.pending_steering, s.core.pending_context) == cell.retained
    if point.then_next and not s.core.disposed:
        s.followup("next")
        s.run()

    assert s.log() == L(cell.log)
    if cell.log.startswith(FAILED1):
        assert s.of("turn/end")[0].data["reason"] == ERR
    live = s.trace()
    for run in cell.live:
        assert find_run(live, L(run)), f"{run!r} not found in {live}"
    own = {"steer": "S", "followup": "F"}.get(command)
    if cell.placement is not None and own is not None:
        placements = [p["placement"] for p in s.live("agent/inbox/enqueue")
                      if at(p, "message", "content", 0, "text") == own]
        assert placements == [cell.placement]
    if cell.intervals is not None:
        assert s.statuses() == ["running", "idle"] * cell.intervals
    if cell.cancel_notices is not None:
        assert len(s.live("agent/cancel-requested")) == cell.cancel_notices
    if command == "dispose":
        assert s.core.disposed
        assert live[-2:] == ["agent/disposed", "session/disposed"]
        assert "cancel-req(disposed)" not in live
    if command.startswith("cancel") or command == "dispose":
        assert s.live("agent/error") == [] or "error" in cell.log
    if cell.check is not None:
        cell.check(s)
    assert s.core.is_quiescent
    s.check()
