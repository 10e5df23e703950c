"""The reentrancy matrix (specs/core.md R19, refining semantics.md §19): one vector per row and
command.

Every vector issues one command (steer 'S', inject 'C' from plugin:test,
followup 'F', cancel, or dispose) at the row's position: as an observer of
the named output, or while the named effect is outstanding (an observer of
its request). The vector ids are ``M<row>-<command>`` with R19's row
numbers; the review asserts the cell, and `review_cell` what every cell of
the row states: the window column (`WINDOW`) where the command is issued, the
placement of a steer or followup, the teardown of a disposal, no agent/error
from a cancel, a quiescent end.

The cells are data: each row's `cells` table lists them as `Cell` (command,
title, rules, the script that issues the command, the expected log and the
row's further checks); a function is written only for a script of its own.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from machine.conformance.authoring import (
    Predicate,
    Session,
    calls,
    control,
    durable,
    effect,
    error,
    live,
    notation,
    result,
    scenario,
    text_of,
)
from machine.conformance.corpus.common import ABORT, FAILURE, block, inject_during, live_of
from machine.io import Effect

ROWS = {
    1: "anywhere while a wake is pending",
    2: "agent/status running",
    3: "{prompt-submit} outstanding; agent/inbox/dequeue queued",
    4: "agent/warning about a failed or invalid decision",
    5: "[turn/start]",
    6: "outputs of the inherited drain; the prompt's and decision contexts' user/messages",
    7: "outputs of the rest drain",
    8: "{step} outstanding",
    9: "outputs of the top-of-step drain",
    10: "{system-prompt} outstanding",
    11: "[step/start]; {request} outstanding",
    12: "[request/header]; {model} outstanding; [assistant/chunk]; release",
    13: "[assistant/message]; tool stages outstanding; [tool/call]; [tool/result]",
    14: "outputs of the end-of-step drain",
    15: "[step/end]",
    16: "{turn-stopping} outstanding; outputs of its drain",
    17: "{request-error} outstanding; its agent/warning",
    18: "agent/error during a turn",
    19: "[turn/end]",
    20: "{flush} outstanding; a failed flush's warning and error",
    21: "agent/settled",
    22: "the rejected tail: its user/messages; {tick rejected-admission} outstanding",
    23: "agent/status idle",
    24: "agent/cancel-requested",
    25: "agent/inbox/discard, agent/context/discard, abort",
    26: "session/created, agent/created, agent/session-start",
    27: "agent/disposed, session/disposed",
}

RETRY: Any = ("resolve", {"kind": "retry"})
TWO_TURNS = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed) "
             "TS(2,msg:user) UM('F') SS(2.1) CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
ONE_TURN = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed)"
TWO_STEPS = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') STM(1;'S';user) "
             "SE(1.1) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)")
CONTEXT_AT_END = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                  "UM('C';plugin:test) SE(1.1) TE(1,completed)")


#: R19's window column: whether the acceptance window is open where the row's commands land
#: (rows 24 and 25 are "as at that cancel", row 27 "torn down": no single value).
WINDOW: dict[int, bool] = {row: 2 <= row <= 18 for row in (*range(1, 24), 26)}

#: The commands each session's `at` observers issued, with the window at that moment.
FIRED: weakref.WeakKeyDictionary[Session, list[tuple[str, bool]]] = weakref.WeakKeyDictionary()


#: A further check of a cell, after its log.
Check = Callable[[Session], None]
#: A cell's script: plays it, issuing the given command (steer, inject, ...) at its position.
Play = Callable[[str], Session]


@dataclass(frozen=True, slots=True)
class Cell:
    """One cell of row *row*: *play* issues the command (the part of *command* before any
    ``-variant``); the durable log must then read *log* (notation; None: not asserted whole)
    and every one of *checks* hold; `review_cell` reviews what all cells of the row state."""
    row: int
    command: str
    title: str
    rules: Sequence[str]
    play: Play
    log: str | None = None
    checks: Sequence[Check] = ()
    tags: Sequence[str] = ()


def cells(*table: Cell) -> None:
    """Register the cells of *table*, in order (the vector ``M<row>-<command>`` each)."""
    for item in table:
        register(item)


def register(item: Cell) -> None:
    def reviewed() -> Session:
        s = item.play(item.command.split("-")[0])
        if item.log is not None:
            s.expect_log(item.log)
        for check in item.checks:
            check(s)
        review_cell(s, item.row, item.command)
        return s
    scenario(f"M{item.row:02d}-{item.command}",
             f"R19 row {item.row} ({ROWS[item.row]}), {item.command}: {item.title}",
             ["R19", "R0.5", *item.rules, "P2"],
             ["matrix", f"matrix:row{item.row}", *item.tags])(reviewed)


def review_cell(s: Session, row: int, command: str) -> None:
    """What holds of every cell: the command (issued once by an `at` observer) lands with the
    window of the row's column; a steer is enqueued as steering when the window is open, else
    queued, a followup queued (R5.3); a disposal tears down without cancel-requested (R17.1);
    a cancel or a disposal reports no agent/error unless the turn failed by itself; the agent
    ends quiescent."""
    base = command.split("-")[0]
    fired = FIRED.get(s, [])
    if fired:
        assert [c for c, _ in fired] == [base], fired
        window = fired[0][1]
        if row in WINDOW:
            assert window == WINDOW[row], f"the window is {'open' if window else 'closed'}"
        own = {"steer": "S", "followup": "F"}.get(base)
        if own is not None:
            placements = [p["placement"] for p in s.payloads("agent/inbox/enqueue")
                          if text_of(p["message"]) == own]
            assert placements == ["steering" if base == "steer" and window else "queued"], placements
    if base == "dispose":
        assert s.core.disposed and s.live()[-2:] == ["agent/disposed", "session/disposed"]
        assert "cancel-req(disposed)" not in s.live()
    if base in ("cancel", "dispose"):
        assert not s.live("agent/error") or any(t.startswith("TE(") and "error" in t
                                                for t in s.log()), s.live("agent/error")
    assert s.core.is_quiescent


def issue(s: Session, command: str) -> None:
    if command == "steer":
        s.steer("S")
    elif command == "inject":
        s.inject("C", "plugin:test")
    elif command == "followup":
        s.followup("F")
    elif command == "cancel":
        s.cancel()
    elif command == "dispose":
        s.dispose()
    else:  # pragma: no cover
        raise ValueError(command)


def at(s: Session, predicate: Predicate, command: str, *, nth: int = 1) -> None:
    """Issue *command* at the *nth* output matching *predicate* (noted in `FIRED`)."""
    def fire(o: object) -> None:
        FIRED.setdefault(s, []).append((command, s.core.accepts_next_step))
        issue(s, command)
    s.on(predicate, fire, nth=nth)


# --------------------------------------------------------------------------
# The scripts most cells share: a prompt 'go' (replies 'one', 'two'), the command issued at a
# position; the other rows' scripts stand with their rows.
# --------------------------------------------------------------------------


def basic(position: Predicate, *replies: Any, nth: int = 1) -> Play:
    """The prompt 'go', the command issued at the *nth* output matching *position*."""
    def play(command: str) -> Session:
        s = Session(*(replies or ("one", "two")))
        at(s, position, command, nth=nth)
        s.followup("go")
        s.run()
        return s
    return play


def context_from(seam: str, text: str, src: str, *replies: Any) -> Play:
    """Context *text* injected while the first {*seam*} is outstanding; the command is issued
    at its user/message (written by the drain that follows the seam)."""
    def play(command: str) -> Session:
        s = Session(*(replies or ("one", "two")))
        inject_during(s, seam, text, src)
        at(s, durable("user/message", id="m2"), command)
        s.followup("go")
        s.run()
        return s
    return play


def held(seam: str, position: Predicate, command: str, *replies: Any) -> Session:
    """The prompt 'go' with the first {*seam*} held, *command* issued at *position*."""
    s = Session(*replies)
    s.hold(seam)
    at(s, position, command)
    s.followup("go")
    s.run()
    return s


# --------------------------------------------------------------------------
# The checks the cells share, after the log
# --------------------------------------------------------------------------

NOTHING = ""  # an empty durable log


def live_is(text: str, *types: str) -> Check:
    """The live notifications (of these *types*) read *text*."""
    return lambda s: s.expect_live(text, *types)


def statuses(text: str) -> Check:
    return live_is(text, "agent/status")


def live_slice(start: int | None, text: str) -> Check:
    """The live notifications from the *start*-th (None: the last ones) read *text*."""
    return tokens_at(Session.live, start, text)


def live_ends(text: str) -> Check:
    return live_slice(None, text)


def live_has(*tokens: str) -> Check:
    def check(s: Session) -> None:
        assert all(token in s.live() for token in tokens), s.live()
    return check


def live_lacks(*tokens: str) -> Check:
    def check(s: Session) -> None:
        present = set(tokens).intersection(s.live())
        assert not present, present
    return check


def reports(prefixes: str | tuple[str, ...], text: str) -> Check:
    """The live notifications starting with *prefixes* (`live_of`) read *text* (nothing: none)."""
    def check(s: Session) -> None:
        picked = (prefixes,) if isinstance(prefixes, str) else prefixes
        assert live_of(s, *picked) == notation(text), s.live()
    return check


def log_slice(start: int | None, text: str) -> Check:
    """The durable log from the *start*-th event (None: its last events) reads *text*."""
    return tokens_at(Session.log, start, text)


def tokens_at(view: Callable[[Session], list[str]], start: int | None, text: str) -> Check:
    """What *view* renders of the session, from the *start*-th token (None: as many last
    tokens as *text* has), reads *text*."""
    tokens = notation(text)
    def check(s: Session) -> None:
        seen = view(s)
        first = len(seen) - len(tokens) if start is None else start
        assert seen[first:first + len(tokens)] == tokens, seen
    return check


def trace_from(text: str) -> Check:
    """The trace, from the first output *text* names on, reads *text*."""
    tokens = notation(text)
    def check(s: Session) -> None:
        trace = s.trace()
        assert trace[trace.index(tokens[0]):] == tokens, trace
    return check


def effects(kind: str, count: int) -> Check:
    """*count* effects of *kind* were requested."""
    def check(s: Session) -> None:
        assert len(s.effects(kind)) == count, s.effects(kind)
    return check


def requests(*messages: Sequence[str], first: bool = False) -> Check:
    """The model requests' message lists (with *first*, the first ones) read *messages*."""
    def check(s: Session) -> None:
        made = s.requests()[:len(messages)] if first else s.requests()
        assert made == [list(m) for m in messages], s.requests()
    return check


def pending(*, steering: int | None = None, context: int | None = None) -> Check:
    """Steering and context retained for the next turn."""
    def check(s: Session) -> None:
        assert steering is None or s.core.pending_steering == steering
        assert context is None or s.core.pending_context == context
    return check


def aborts(*kinds: str) -> Check:
    """The abort controls' reasons, in order."""
    def check(s: Session) -> None:
        found = [o.to_json() for o in s.outputs if o.to_json().get("out") == "abort"]
        assert [a["reason"] for a in found] == [{"kind": k} for k in kinds], found
    return check


def next_turn(prompt: str, text: str) -> Check:
    """Then the prompt *prompt*: the turn it runs starts with *text* (what it took first).
    This check plays on, so the cell's vector holds that turn too."""
    tokens = notation(text)
    def check(s: Session) -> None:
        before = len(s.log())
        s.followup(prompt)
        s.run()
        assert s.log()[before:before + len(tokens)] == tokens, s.log()
    return check


def teardown(s: Session) -> None:
    assert s.live()[-2:] == ["agent/disposed", "session/disposed"], s.live()
    assert s.core.disposed


# --------------------------------------------------------------------------
# Row 1: a wake is pending
# --------------------------------------------------------------------------

ENQ_GO = live("agent/inbox/enqueue")
STEERED_TURNS = TWO_TURNS.replace("'F'", "'S'")  # a steer queued: a turn of its own

cells(
    Cell(1, "steer", "queued; a turn of its own, in queue order", ["R5.3", "R6.1", "R6.3"],
         basic(ENQ_GO), STEERED_TURNS,
         [live_slice(0, "enq(go,q) enq(S,q)"), effects("tick", 1), statuses("running idle")]),
    Cell(1, "inject", "appended now, ahead of those turns", ["R5.2", "R6.3"],
         basic(ENQ_GO), "UM('C';plugin:test) " + ONE_TURN),
    Cell(1, "followup", "queued; a turn of its own", ["R5.3", "R6.1"],
         basic(ENQ_GO), TWO_TURNS, [statuses("running idle")]),
    Cell(1, "cancel", "discards all queued items, the new one too; the wake claims nothing; no "
         "status output", ["R16.1", "R16.2", "R16.4", "R6.2"],
         basic(ENQ_GO), NOTHING, [live_is("enq(go,q) cancel-req(user) disc[go]")], ["cancel"]),
    Cell(1, "dispose", "discards the item without cancel-requested; the wake claims nothing; "
         "teardown", ["R17.1", "R17.4", "R16.2", "R6.2"],
         basic(ENQ_GO), NOTHING, [live_is("enq(go,q) disc[go] agent/disposed session/disposed")],
         ["dispose"]),
)


# --------------------------------------------------------------------------
# Rows 2 and 3: admission
# --------------------------------------------------------------------------

RUNNING = live("agent/status", status="running")
DEQ_GO = live("agent/inbox/dequeue", placement="queued")
PROMPT_SUBMIT = effect("prompt-submit")
RUN_START_STEER = ("TS(1,msg:user) UM('go') STM(1;'S';user) SS(1.1) RH(initial) CH… AM(1.1;'one') "
                   "SE(1.1) TE(1,completed)")
RUN_START_INJECT = ("TS(1,msg:user) UM('go') UM('C';plugin:test) SS(1.1) RH(initial) CH… "
                    "AM(1.1;'one') SE(1.1) TE(1,completed)")
NO_ADMISSION = [effects("prompt-submit", 0), effects("flush", 0)]

cells(
    Cell(2, "steer", "steering; rest drain after the prompt", ["R5.3", "R7.3", "R7.4", "R8.3"],
         basic(RUNNING), RUN_START_STEER, [live_has("enq(S,s)")]),
    Cell(2, "inject", "staged; rest drain after the prompt", ["R5.2", "R7.3", "R8.3"],
         basic(RUNNING), RUN_START_INJECT),
    Cell(2, "followup", "queued; a later turn of its own in the same interval", ["R5.3", "R12.7"],
         basic(RUNNING), TWO_TURNS, [statuses("running idle")]),
    Cell(2, "cancel", "aborts ahead of {prompt-submit}, which is never requested; the dequeue is "
         "still emitted; rejected; no warning; no turn", ["R7.5", "R7.10", "R16.4", "P15"],
         basic(RUNNING), NOTHING,
         [*NO_ADMISSION, live_is("enq(go,q) running cancel-req(user) deq(go,q) idle")], ["cancel"]),
    Cell(2, "dispose", "aborts ahead of {prompt-submit}; no turn; teardown",
         ["R17.1", "R7.5", "P15"],
         basic(RUNNING), NOTHING,
         [*NO_ADMISSION, live_is("enq(go,q) running deq(go,q) idle agent/disposed session/disposed")],
         ["dispose"]),
    Cell(3, "steer", "(during prompt-submit) steering; rest drain after the prompt",
         ["R5.3", "R8.3", "R11.2"],
         basic(PROMPT_SUBMIT), RUN_START_STEER),
    Cell(3, "inject", "(at the claimed item's dequeue) staged; appended after the prompt",
         ["R5.2", "R7.6", "R8.3"],
         basic(DEQ_GO), RUN_START_INJECT),
    Cell(3, "followup", "(during prompt-submit) queued; its own turn after this one",
         ["R5.3", "R12.7"],
         basic(PROMPT_SUBMIT), TWO_TURNS),
    Cell(3, "cancel", "(during prompt-submit) aborts the admission; the decision is disregarded; "
         "rejected; no warning; no turn", ["R7.7", "R7.10", "R16.4"],
         basic(PROMPT_SUBMIT), NOTHING,
         [live_is("enq(go,q) running cancel-req(user) deq(go,q) idle")], ["cancel"]),
    Cell(3, "dispose", "(at the claimed item's dequeue) aborts the admission; no turn; teardown",
         ["R17.1", "R7.7"],
         basic(DEQ_GO), NOTHING,
         [teardown, live_ends("deq(go,q) idle agent/disposed session/disposed"),
          statuses("running idle"), effects("prompt-submit", 1), live_is("", "agent/settled"),
          effects("flush", 0)], ["dispose"]),
)


# --------------------------------------------------------------------------
# Row 4: the warning of a failed admission
# --------------------------------------------------------------------------

WARNING = live("agent/warning")


def failed_admission(*, second: bool = False) -> Play:
    """The admission of 'go' fails (its hook raises); the command is issued at the warning;
    with *second*, a second prompt is queued behind it."""
    def play(command: str) -> Session:
        s = Session("one", "two")
        s.handle("prompt-submit", lambda e: ("raise", error("admission broke")), times=1)
        at(s, WARNING, command)
        s.followup("go")
        if second:
            s.followup("second")
        s.run()
        assert "warn('prompt admission failed: admission broke')" in s.live()
        return s
    return play


cells(
    Cell(4, "steer", "steering, retained (a rejected admission keeps an outbox that holds "
         "steering); the next admitted turn takes it ahead of its prompt",
         ["R7.8", "R7.10", "R11.3", "R8.3", "R0.8"],
         failed_admission(), NOTHING,
         [pending(steering=1), next_turn("later", "TS(1,msg:user) STM(1;'S';user) UM('later')")]),
    Cell(4, "inject", "staged; written between turns (no steering staged)",
         ["R7.8", "R7.10", "R11.2"],
         failed_admission(), "UM('C';plugin:test)"),
    Cell(4, "followup", "queued; claimed at continue-or-idle", ["R7.10", "R12.7"],
         failed_admission(), ONE_TURN.replace("'go'", "'F'"), [statuses("running idle")]),
    Cell(4, "cancel", "(a second prompt queued) discards it; aborts the admission controller; "
         "still rejected", ["R7.8", "R16.2", "R16.4"],
         failed_admission(second=True), NOTHING,
         [trace_from("warn('prompt admission failed: admission broke') cancel-req(user) "
                     "disc[second] abort(user) tick(rejected-admission) idle")], ["cancel"]),
)


# --------------------------------------------------------------------------
# Rows 5, 6, 7: turn/start and the run-start drains
# --------------------------------------------------------------------------

TURN_START = durable("turn/start")
PROMPT_UM = durable("user/message", id="m1")
NO_CANCEL_REQUESTED = live_is("", "agent/cancel-requested")


def failing(position: Predicate, *, retry: bool, replies: Sequence[Any] = ("ok",), nth: int = 1
            ) -> Play:
    """The first model call fails (recovery authorizes a retry if *retry*); the command is
    issued at the *nth* output matching *position*."""
    def play(command: str) -> Session:
        s = Session(FAILURE, *replies)
        if retry:
            s.handle("request-error", lambda e: RETRY, times=1)
        at(s, position, command, nth=nth)
        s.followup("go")
        s.run()
        return s
    return play


def with_decision_context(command: str) -> Session:
    """The admission adds a decision context, still to write when the command is issued at the
    prompt's user/message."""
    s = Session("one")
    s.handle("prompt-submit", lambda e: ("resolve", {"kind": "allow", "additionalContexts": [
        s.msg("decision context", "plugin:gate")]}))
    at(s, PROMPT_UM, command)
    s.followup("go")
    s.run()
    return s


def rest_drain(command: str) -> Session:
    """Steering staged during admission, written by the rest drain; the command is issued at
    that steering/message."""
    s = Session("one", "two")
    def admission(e: Effect) -> None:
        s.steer("R")
    s.handle("prompt-submit", admission, times=1)
    at(s, durable("steering/message"), command)
    s.followup("go")
    s.run()
    return s


SECOND_TURN_F = "TS(2,msg:user) UM('F') SS(2.1) CH… AM(2.1;'two') SE(2.1) TE(2,completed)"

cells(
    Cell(5, "steer", "steering; rest drain, after the prompt", ["R8.3", "R11.2"],
         basic(TURN_START), RUN_START_STEER),
    Cell(5, "steer-retry", "(at a retry's turn/start) steering; right after turn/start",
         ["R8.3", "R13.3", "R11.2"],
         failing(TURN_START, retry=True, nth=2),
         "TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error) TS(2,retry) "
         "STM(2;'S';user) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed)"),
    Cell(5, "inject", "staged; rest drain, like steer", ["R8.3", "R11.2"],
         basic(TURN_START), RUN_START_INJECT),
    Cell(5, "followup", "queued; a later turn of its own", ["R5.3"],
         basic(TURN_START), TWO_TURNS, [statuses("running idle")]),
    Cell(5, "cancel", "the prompt is still written; turn/end aborted with no step",
         ["R8.3", "R15.1", "R16.4"],
         basic(TURN_START), "TS(1,msg:user) UM('go') TE(1,aborted)",
         [live_is("cancel-req(user)", "agent/cancel-requested")], ["cancel"]),
    Cell(5, "dispose", "the prompt is still written; turn/end disposed with no step; teardown",
         ["R8.3", "R17.1", "R15.1"],
         basic(TURN_START), "TS(1,msg:user) UM('go') TE(1,disposed)",
         [NO_CANCEL_REQUESTED, teardown], ["dispose"]),
    Cell(6, "steer", "(at the prompt's user/message) taken by the rest drain",
         ["R8.3", "R11.1"],
         basic(PROMPT_UM), RUN_START_STEER),
    Cell(6, "inject", "(at the prompt's user/message) taken by the rest drain",
         ["R8.3", "R11.1"],
         basic(PROMPT_UM), RUN_START_INJECT),
    Cell(6, "followup", "queued", ["R5.3"],
         basic(PROMPT_UM), TWO_TURNS),
    Cell(6, "cancel", "(at the prompt, a decision context still to write) the remaining "
         "admitted messages are still written; turn/end aborted with no step",
         ["R8.3", "R7.7", "R15.1"],
         with_decision_context,
         "TS(1,msg:user) UM('go') UM('decision context';plugin:gate) TE(1,aborted)", tags=["cancel"]),
    Cell(7, "steer", "(at the rest drain's steering/message) taken by this drain (D3)",
         ["R8.3", "R11.1", "D3"],
         rest_drain,
         "TS(1,msg:user) UM('go') STM(1;'R';user) STM(1;'S';user) SS(1.1) RH(initial) CH… "
         "AM(1.1;'one') SE(1.1) TE(1,completed)", tags=["differs-from-original", "D3"]),
    Cell(7, "inject", "taken by this drain (D3)", ["R8.3", "R11.1", "D3"],
         rest_drain,
         "TS(1,msg:user) UM('go') STM(1;'R';user) UM('C';plugin:test) SS(1.1) RH(initial) "
         "CH… AM(1.1;'one') SE(1.1) TE(1,completed)", tags=["differs-from-original", "D3"]),
    Cell(7, "followup", "queued", ["R5.3"],
         rest_drain, checks=[log_slice(None, SECOND_TURN_F)]),
    Cell(7, "cancel", "{step} is still requested; its check ends the turn aborted; no step/start",
         ["R9.1", "R8.3", "R15.1"],
         rest_drain, "TS(1,msg:user) UM('go') STM(1;'R';user) TE(1,aborted)",
         [effects("step", 1)], ["cancel"]),
)


# --------------------------------------------------------------------------
# Rows 8, 9, 10: the step hook, the top-of-step drain, the system prompt
# --------------------------------------------------------------------------

STEP = effect("step")
SYSTEM_PROMPT = effect("system-prompt")
#: Context injected during {step}, written by the top-of-step drain; the command is issued at
#: that user/message.
top_drain = context_from("step", "T", "plugin:top")

cells(
    Cell(8, "steer", "top-of-step drain; this request; no extra step", ["R9.2", "R11.2"],
         basic(STEP), RUN_START_STEER, [requests(["'go'", "'S'"])]),
    Cell(8, "inject", "top-of-step drain; this request", ["R9.2", "R11.2"],
         basic(STEP), RUN_START_INJECT, [requests(["'go'", "'C';plugin:test"])]),
    Cell(8, "followup", "queued", ["R5.3"],
         basic(STEP), TWO_TURNS),
    Cell(8, "cancel", "R9.1's check ends the turn aborted; no step/start", ["R9.1", "R15.1"],
         basic(STEP), "TS(1,msg:user) UM('go') TE(1,aborted)", tags=["cancel"]),
    Cell(8, "dispose", "the turn ends disposed with no step/start; teardown",
         ["R9.1", "R17.1", "R15.1"],
         basic(STEP), "TS(1,msg:user) UM('go') TE(1,disposed)", [teardown], ["dispose"]),
    Cell(9, "steer", "(at the top drain's user/message) taken by this drain; this request",
         ["R9.2", "R11.1", "D3"],
         top_drain,
         "TS(1,msg:user) UM('go') UM('T';plugin:top) STM(1;'S';user) SS(1.1) RH(initial) "
         "CH… AM(1.1;'one') SE(1.1) TE(1,completed)",
         [requests(["'go'", "'T';plugin:top", "'S'"])], ["differs-from-original", "D3"]),
    Cell(9, "inject", "taken by this drain; this request", ["R9.2", "R11.1", "D3"],
         top_drain,
         "TS(1,msg:user) UM('go') UM('T';plugin:top) UM('C';plugin:test) SS(1.1) "
         "RH(initial) CH… AM(1.1;'one') SE(1.1) TE(1,completed)",
         tags=["differs-from-original", "D3"]),
    Cell(9, "followup", "queued", ["R5.3"],
         top_drain, checks=[log_slice(None, SECOND_TURN_F)]),
    Cell(9, "cancel", "{system-prompt} is still requested; turn/end aborted; no step/start",
         ["R9.3", "R15.1"],
         top_drain, "TS(1,msg:user) UM('go') UM('T';plugin:top) TE(1,aborted)",
         [effects("system-prompt", 1)], ["cancel"]),
    Cell(10, "steer", "end-of-step drain (the next request); causes another step",
         ["R9.10", "R11.2", "R8.4"],
         basic(SYSTEM_PROMPT), TWO_STEPS, [requests(["'go'"], first=True)]),
    Cell(10, "inject", "end-of-step drain (the next request); no extra step", ["R9.10", "R11.2"],
         basic(SYSTEM_PROMPT), CONTEXT_AT_END),
    Cell(10, "followup", "queued", ["R5.3"],
         basic(SYSTEM_PROMPT), TWO_TURNS),
    Cell(10, "cancel", "R9.3's check ends the turn aborted; no step/start", ["R9.3", "R15.1"],
         basic(SYSTEM_PROMPT), "TS(1,msg:user) UM('go') TE(1,aborted)", tags=["cancel"]),
)


# --------------------------------------------------------------------------
# Rows 11 and 12: inside the step
# --------------------------------------------------------------------------

STEP_START = durable("step/start")
REQUEST = effect("request")
HEADER = durable("request/header")
CHUNK = durable("assistant/chunk")
MODEL = effect("model")
NO_REPLY_ABORTED = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)"


def late_chunk(command: str) -> Session:
    """The command issued during the model call; a chunk arrives after it."""
    s = held("model", MODEL, command)
    model = s.held("model")
    s.core.chunk(model.id, {"type": "text", "text": "late"})
    s.run()
    trace = s.trace()
    assert trace[trace.index("abort(user)"):trace.index("[SE(1.1)]")] == ["abort(user)", "release"], trace
    assert not s.driver.held
    return s


def late_model_failure(command: str) -> Session:
    """The command issued during the model call; the call fails after it."""
    s = held("model", MODEL, command)
    s.fail_model(FAILURE)
    s.run()
    return s


def inside_step(row: int, steer_at: tuple[str, Predicate], staged_at: tuple[str, Predicate],
                staged_rule: str) -> tuple[Cell, Cell, Cell]:
    """A row inside the step: a steer is drained at the step's end and causes another step;
    an inject is drained there with no extra step; a followup is queued for the next turn."""
    (steer_where, steer_point), (where, point) = steer_at, staged_at
    return (Cell(row, "steer", f"({steer_where}) end-of-step drain; causes another step",
                 ["R9.10", "R11.2", "R8.4"], basic(steer_point), TWO_STEPS),
            Cell(row, "inject", f"({where}) end-of-step drain; no extra step",
                 ["R9.10", "R11.2", staged_rule], basic(point), CONTEXT_AT_END),
            Cell(row, "followup", f"({where}) queued", ["R5.3"], basic(point), TWO_TURNS))


cells(
    *inside_step(11, ("at step/start", STEP_START), ("during the request hook", REQUEST), "R9.6"),
    Cell(11, "cancel", "(during the request hook) step/end, turn/end aborted; no request/header",
         ["R9.6", "R8.6", "R15.1"],
         basic(REQUEST), "TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,aborted)",
         [effects("model", 0)], ["cancel"]),
    Cell(11, "cancel-at-step-start", "step/end, turn/end aborted; no request", ["R9.5", "R15.1"],
         basic(STEP_START), "TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,aborted)",
         [effects("request", 0)], ["cancel"]),
    *inside_step(12, ("at request/header", HEADER), ("at the first assistant/chunk", CHUNK),
                 "R9.7"),
    Cell(12, "cancel", "(during the model call) the next chunk's check releases the stream; no "
         "assistant/message; step/end, turn/end aborted", ["R9.7", "R8.6", "R15.1", "P5"],
         late_chunk, NO_REPLY_ABORTED, tags=["cancel"]),
    Cell(12, "cancel-model-failure", "(during the model call) a model failure after the abort "
         "skips recovery; turn/end aborted", ["R13.2", "R15.1", "R9.7"],
         late_model_failure, NO_REPLY_ABORTED, [effects("request-error", 0)], ["cancel"]),
    Cell(12, "dispose", "(at request/header) step/end, turn/end disposed; teardown",
         ["R9.7", "R17.1", "R15.1"],
         basic(HEADER), "TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,disposed)",
         [teardown], ["dispose"]),
)


# --------------------------------------------------------------------------
# Row 13: the tool batch
# --------------------------------------------------------------------------

TOOL_TURN = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
             "TR(1.1;c1;ok) {} SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) TE(1,completed)")
CALL = calls(("c1", "t"))


def two_calls_with_contexts(command: str) -> Session:
    """Two calls, each finalized with a context; the command is issued during the second's body."""
    s = Session(calls(("c1", "t"), ("c2", "t")))
    s.handle("tool-finalize", lambda e: ("resolve", result(contexts=[
        s.msg(f"ctx-{e.payload['callId']}", "plugin:p")])))
    at(s, effect("tool-execute", callId="c2"), command)
    s.followup("go")
    s.run()
    return s


cells(
    Cell(13, "steer", "(during the tool body) end-of-step drain after the last result; causes "
         "another step", ["R10.5", "R9.10", "R8.4"],
         basic(effect("tool-execute"), CALL, "done"), TOOL_TURN.format("STM(1;'S';user)"),
         tags=["tools"]),
    Cell(13, "inject", "(at tool/result) end-of-step drain after the last result",
         ["R10.5", "R9.10"],
         basic(durable("tool/result"), CALL, "done"), TOOL_TURN.format("UM('C';plugin:test)"),
         tags=["tools"]),
    Cell(13, "followup", "(at tool/call) queued", ["R5.3"],
         basic(durable("tool/call"), CALL, "done", "two"),
         TOOL_TURN.format("") + " " + SECOND_TURN_F, tags=["tools"]),
    Cell(13, "cancel", "(during the second call's body) the late body commits ABORTED; the tool "
         "context staged before is discarded and reported; the context finalized afterwards is "
         "kept; turn/end aborted", ["R10.7", "R10.11", "R16.2", "D6", "R10.4"],
         two_calls_with_contexts,
         "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
         "TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ERR ABORTED) UM('ctx-c2';plugin:p) "
         "SE(1.1) TE(1,aborted)",
         [live_has("ctxdisc[ctx-c1]")], ["tools", "cancel", "differs-from-original", "D6"]),
    Cell(13, "dispose", "(at assistant/message) the call gets a synthetic pair; turn/end "
         "disposed; teardown", ["R10.7", "R10.10", "R17.1"],
         basic(durable("assistant/message"), CALL),
         "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
         "TR(1.1;c1;ERR ABD) SE(1.1) TE(1,disposed)", [teardown], ["tools", "dispose"]),
)


# --------------------------------------------------------------------------
# Row 14: outputs of the end-of-step drain
# --------------------------------------------------------------------------

#: Context injected during the request hook, written by the end-of-step drain; the command is
#: issued at that user/message.
late_context = context_from("request", "late", "plugin:test")
LATE_STEP = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') "
             "UM('late';plugin:test)")

cells(
    Cell(14, "steer", "taken by this drain (D3); causes another step",
         ["R11.1", "R9.10", "D3"],
         late_context,
         LATE_STEP + " STM(1;'S';user) SE(1.1) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)",
         tags=["differs-from-original", "D3"]),
    Cell(14, "inject", "taken by this drain (D3)", ["R11.1", "R9.10", "D3"],
         late_context, LATE_STEP + " UM('C';plugin:test) SE(1.1) TE(1,completed)",
         tags=["differs-from-original", "D3"]),
    Cell(14, "followup", "queued", ["R5.3"],
         late_context, LATE_STEP + " SE(1.1) TE(1,completed) " + SECOND_TURN_F),
    Cell(14, "cancel", "step/end is still written; turn/end aborted at the next check",
         ["R9.10", "R8.5", "R15.1"],
         late_context, LATE_STEP + " SE(1.1) TE(1,aborted)", tags=["cancel"]),
)


# --------------------------------------------------------------------------
# Rows 15 and 16: step/end and turn-stopping
# --------------------------------------------------------------------------

STEP_END = durable("step/end")
TURN_STOPPING = effect("turn-stopping")
FIRST_STEP = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1)"
STEERED_ON = FIRST_STEP + " STM(1;'S';user) SS(1.2) CH… AM(1.2;'two') SE(1.2) TE(1,completed)"
CONCLUDED = ("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
             "TR(1.1;c1;ok) SE(1.1) TE(1,completed)")


def concluding_tool(*replies: Any) -> Play:
    """A step whose tool result concludes the turn; the command is issued at its step/end."""
    def play(command: str) -> Session:
        s = Session(CALL, *replies)
        s.handle("tool-execute", lambda e: ("resolve", result(concludesTurn=True)))
        at(s, STEP_END, command)
        s.followup("go")
        s.run()
        return s
    return play


def turn_stopping_after_steps(s: Session) -> None:
    trace = s.trace()
    assert trace.index("⟨turn-stopping 1⟩") > trace.index("[SE(1.2)]")


cells(
    Cell(15, "steer", "the next step, skipping turn-stopping", ["R8.4", "R9.2"],
         basic(STEP_END), STEERED_ON, [effects("turn-stopping", 1), turn_stopping_after_steps]),
    Cell(15, "inject", "the turn does not go on: the turn-stopping drain, inside the turn",
         ["R8.5", "R11.2"],
         basic(STEP_END), FIRST_STEP + " UM('C';plugin:test) TE(1,completed)"),
    Cell(15, "inject-continuing", "(a step with a tool call) the next step's top-of-step drain",
         ["R9.2", "R11.2"],
         basic(STEP_END, CALL, "done"),
         "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
         "TR(1.1;c1;ok) SE(1.1) UM('C';plugin:test) SS(1.2) CH… AM(1.2;'done') SE(1.2) "
         "TE(1,completed)", tags=["tools"]),
    Cell(15, "followup", "queued", ["R5.3"],
         basic(STEP_END), TWO_TURNS),
    Cell(15, "cancel", "aborts at the next check", ["R8.5", "R15.1"],
         basic(STEP_END), FIRST_STEP + " TE(1,aborted)", tags=["cancel"]),
    Cell(15, "cancel-after-concluding", "(a step whose result concluded the turn) effective (its "
         "notice, its abort), but the turn ends at once, with no signal check: its reason stays "
         "completed, as in the original", ["R8.4", "R10.6", "R16.2"],
         concluding_tool(), CONCLUDED, [live_has("cancel-req(user)", "settled(1,completed)")],
         ["tools", "cancel"]),
    Cell(15, "steer-retained", "(a step whose result concluded the turn) retained; the next "
         "admitted turn's inherited drain takes it ahead of its prompt",
         ["R11.3", "R10.6", "R8.3", "R7.2", "R8.4"],
         concluding_tool("next reply"), CONCLUDED,
         [pending(steering=1), effects("turn-stopping", 0),
          next_turn("next", "TS(2,msg:user) STM(2;'S';user) UM('next') SS(2.1) CH… "
                    "AM(2.1;'next reply') SE(2.1) TE(2,completed)")], ["tools"]),
    Cell(16, "steer", "another step", ["R8.5"],
         basic(TURN_STOPPING), STEERED_ON),
    Cell(16, "inject", "written inside the turn after the final step/end; no step", ["R8.5"],
         basic(TURN_STOPPING), FIRST_STEP + " UM('C';plugin:test) TE(1,completed)"),
    Cell(16, "followup", "queued", ["R5.3"],
         basic(TURN_STOPPING), TWO_TURNS),
    Cell(16, "cancel", "turn/end aborted; no further step", ["R8.5", "R15.1"],
         basic(TURN_STOPPING), FIRST_STEP + " TE(1,aborted)", tags=["cancel"]),
    Cell(16, "cancel-in-drain", "(at an output of the turn-stopping drain that took no steering) "
         "effective, but no signal check follows that drain: the turn ends completed, as in the "
         "original", ["R8.5", "R16.2"],
         context_from("turn-stopping", "stop-time", "plugin:test", "one"),
         FIRST_STEP + " UM('stop-time';plugin:test) TE(1,completed)",
         [live_has("cancel-req(user)", "settled(1,completed)")], ["cancel"]),
)


# --------------------------------------------------------------------------
# Rows 17 and 18: recovery and agent/error
# --------------------------------------------------------------------------

REQUEST_ERROR = effect("request-error")
FAILED_TURN = "TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error)"
AGENT_ERROR = live("agent/error")
RETRIED = FAILED_TURN + " TS(2,retry) SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed)"


def failing_recovery(command: str) -> Session:
    """The model call fails and so does its recovery hook; the command is issued at the
    'request recovery failed' warning."""
    s = Session(FAILURE)
    s.handle("request-error", lambda e: ("raise", error("recovery broke")))
    at(s, WARNING, command)
    s.followup("go")
    s.run()
    return s


cells(
    Cell(17, "steer", "(retry authorized) retained; taken when the retry starts",
         ["R13.3", "R11.3", "R11.2"],
         failing(REQUEST_ERROR, retry=True),
         FAILED_TURN + " TS(2,retry) STM(2;'S';user) SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
         "TE(2,completed)", [reports("settled", "settled(2,completed)")]),
    Cell(17, "inject", "(no retry) retained; the next admitted turn takes it ahead of its prompt",
         ["R11.3", "R8.3", "R13.2"],
         failing(REQUEST_ERROR, retry=False), FAILED_TURN,
         [pending(context=1), next_turn("next", "TS(2,msg:user) UM('C';plugin:test) UM('next')")]),
    Cell(17, "followup", "(retry authorized) queued; claimed once the chain is over",
         ["R12.8", "R13.3"],
         failing(REQUEST_ERROR, retry=True, replies=("ok", "two")),
         RETRIED + " TS(3,msg:user) UM('F') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)"),
    Cell(17, "cancel", "no retry even though recovery authorizes one; turn/end aborted",
         ["R13.2", "R13.5", "R15.1"],
         failing(REQUEST_ERROR, retry=True), NO_REPLY_ABORTED,
         [live_has("settled(1,aborted)"), reports("error", "")], ["cancel"]),
    Cell(17, "cancel-at-warning", "(at the 'request recovery failed' warning) turn/end aborted",
         ["R13.2", "R15.1", "R0.8"],
         failing_recovery, NO_REPLY_ABORTED, tags=["cancel"]),
    Cell(18, "steer", "(no retry) retained; the next admitted turn takes it ahead of its prompt",
         ["R11.3", "R8.3"],
         failing(AGENT_ERROR, retry=False), FAILED_TURN,
         [next_turn("next", "TS(2,msg:user) STM(2;'S';user) UM('next')")]),
    Cell(18, "inject", "(retry authorized) retained; taken when the retry starts",
         ["R11.3", "R13.3"],
         failing(AGENT_ERROR, retry=True),
         FAILED_TURN + " TS(2,retry) UM('C';plugin:test) SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
         "TE(2,completed)"),
    Cell(18, "followup", "queued; claimed once the chain is over", ["R12.8", "R13.3"],
         failing(AGENT_ERROR, retry=True, replies=("ok", "two")),
         RETRIED + " TS(3,msg:user) UM('F') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)"),
    Cell(18, "cancel", "(retry authorized) the error reason stays; the pending retry is dropped",
         ["R13.5", "R16.2"],
         failing(AGENT_ERROR, retry=True), FAILED_TURN, [live_has("settled(1,error)")],
         ["cancel"]),
)


# --------------------------------------------------------------------------
# Rows 19, 20, 21: turn/end, the post-turn flush, agent/settled
# --------------------------------------------------------------------------

TURN_END = durable("turn/end")
FLUSH = effect("flush")
SETTLED = live("agent/settled")
CONTEXT_AFTER = ONE_TURN + " UM('C';plugin:test)"
ONE_INTERVAL = [statuses("running idle"), effects("tick", 1)]  # claimed with no idle between


def failed_flush(command: str) -> Session:
    """The first flush fails; the command is issued at its agent/error."""
    s = Session("one", "two")
    s.handle("flush", lambda e: ("raise", error("disk unavailable")), times=1)
    at(s, AGENT_ERROR, command)
    s.followup("go")
    s.run()
    return s


def flush_with_queue(command: Callable[[Session], None]) -> Play:
    """A failed turn (retry authorized) with a prompt 'Q' queued during it; *command* is issued
    during its flush."""
    def play(_: str) -> Session:
        s = Session(FAILURE, "ok", "queued reply")
        s.handle("request-error", lambda e: RETRY, times=1)
        s.on(MODEL, lambda o: s.followup("Q"))
        s.on(FLUSH, lambda o: command(s))
        s.followup("go")
        s.run()
        return s
    return play


def second_queued(position: Predicate) -> Play:
    """The prompt 'go' and a second one queued; the command is issued at *position*."""
    def play(command: str) -> Session:
        s = Session("one")
        at(s, position, command)
        s.followup("go")
        s.followup("second")
        s.run()
        return s
    return play


cells(
    Cell(19, "steer", "queued without a wake; claimed after the flush with no idle in between",
         ["R12.1", "R12.7"],
         basic(TURN_END), STEERED_TURNS, ONE_INTERVAL),
    Cell(19, "inject", "appended right after turn/end (D4)", ["R12.3", "R5.2", "R0.6", "D4"],
         basic(TURN_END), CONTEXT_AFTER, tags=["differs-from-original", "D4"]),
    Cell(19, "followup", "queued; claimed after the flush", ["R12.1", "R12.7"],
         basic(TURN_END), TWO_TURNS, ONE_INTERVAL),
    Cell(19, "cancel", "(failed turn, retry authorized) effective: cancel-requested, the retry is "
         "dropped, abort for the finished controller; the reason stays",
         ["R12.2", "R13.5", "R4.4"],
         failing(TURN_END, retry=True), FAILED_TURN,
         [trace_from("[TE(1,error)] cancel-req(user) abort(user) flush(1) settled(1,error) idle")],
         ["cancel"]),
    Cell(19, "dispose", "the reason stays; the turn settles completed; teardown",
         ["R12.2", "R17.1"],
         basic(TURN_END), ONE_TURN,
         [live_ends("settled(1,completed) idle agent/disposed session/disposed"),
          NO_CANCEL_REQUESTED], ["dispose"]),
    Cell(20, "steer", "(retry pending) queued without a wake; claimed after the flush and the "
         "retry chain (D1)", ["R12.4", "R12.8", "R6.1", "D1"],
         failing(FLUSH, retry=True, replies=("ok", "two")),
         RETRIED + " TS(3,msg:user) UM('S') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)",
         ONE_INTERVAL, ["differs-from-original", "D1"]),
    Cell(20, "inject", "appended now", ["R12.4", "R5.2"],
         basic(FLUSH), CONTEXT_AFTER),
    Cell(20, "followup", "queued without a wake; claimed right after the flush",
         ["R12.4", "R6.1", "D1"],
         basic(FLUSH), TWO_TURNS, [effects("tick", 1)], ["differs-from-original", "D1"]),
    Cell(20, "followup-at-failed-flush", "(at a failed flush's agent/error) queued without a "
         "wake (D1); claimed right after the flush", ["R12.4", "R6.1", "D1"],
         failed_flush, TWO_TURNS, tags=["differs-from-original", "D1"]),
    Cell(20, "cancel", "(retry pending, a prompt queued) discards the prompt and drops the retry "
         "(D2)", ["R12.4", "R13.5", "R16.4", "R4.9", "D2"],
         flush_with_queue(lambda s: s.cancel()), FAILED_TURN,
         [live_ends("cancel-req(user) disc[Q] settled(1,error) idle")],
         ["cancel", "differs-from-original", "D2"]),
    Cell(20, "cancel-keep-inbox", "(retry pending, a prompt queued) keepInbox only drops the "
         "retry; the queued prompt runs next", ["R12.4", "R16.5", "D2"],
         flush_with_queue(lambda s: s.cancel(keep_inbox=True)),
         FAILED_TURN + " TS(2,msg:user) UM('Q') SS(2.1) CH… AM(2.1;'ok') SE(2.1) TE(2,completed)",
         [live_has("settled(1,error)"), reports("disc", "")],
         ["cancel", "differs-from-original", "D2"]),
    Cell(20, "dispose", "(retry pending) disposal drops the retry; the failed turn settles; "
         "teardown", ["R17.2", "R13.5", "D2"],
         failing(FLUSH, retry=True), FAILED_TURN,
         [live_ends("settled(1,error) idle agent/disposed session/disposed")],
         ["dispose", "differs-from-original", "D2"]),
    Cell(21, "steer", "queued without a wake (D1); claimed right away by continue-or-idle",
         ["R12.7", "R6.1", "D1"],
         basic(SETTLED), STEERED_TURNS, ONE_INTERVAL, ["differs-from-original", "D1"]),
    Cell(21, "inject", "appended now", ["R5.2"],
         basic(SETTLED), CONTEXT_AFTER),
    Cell(21, "followup", "queued without a wake (D1); claimed right away", ["R12.7", "D1"],
         basic(SETTLED), TWO_TURNS, ONE_INTERVAL, ["differs-from-original", "D1"]),
    Cell(21, "cancel", "(a second prompt queued) discards, nothing more", ["R16.4"],
         second_queued(SETTLED), ONE_TURN,
         [live_ends("settled(1,completed) cancel-req(user) disc[second] idle")], ["cancel"]),
    Cell(21, "dispose", "(a second prompt queued) discards it; idle; teardown", ["R17.1"],
         second_queued(SETTLED), ONE_TURN,
         [live_ends("settled(1,completed) disc[second] idle agent/disposed session/disposed")],
         ["dispose"]),
)


# --------------------------------------------------------------------------
# Rows 22 and 23: the rejected tail, agent/status idle
# --------------------------------------------------------------------------

TAIL_TICK = effect("tick", purpose="rejected-admission")
IDLE = live("agent/status", status="idle")
STAGED = "UM('staged';plugin:test)"


def rejected(position: Predicate, *, second: bool = False) -> Play:
    """A prompt 'blocked' (and, with *second*, a second one queued) whose admission blocks
    after context was staged; the command is issued at *position*."""
    def play(command: str) -> Session:
        s = Session("one", "two")
        s.hold("prompt-submit")
        at(s, position, command)
        s.followup("blocked")
        if second:
            s.followup("second")
        s.run()
        s.inject("staged", "plugin:test")
        block(s)
        return s
    return play


cells(
    Cell(22, "steer", "(during its tick) queued; claimed at continue-or-idle without a wake (D1)",
         ["R7.10", "R6.1", "D1"],
         rejected(TAIL_TICK),
         STAGED + " TS(1,msg:user) UM('S') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
         "TE(1,completed)", [effects("tick", 2), statuses("running idle")],
         ["differs-from-original", "D1"]),
    Cell(22, "inject", "(at its context append) appended now, right after that event (D4)",
         ["R7.10", "R5.2", "R0.6", "D4"],
         rejected(durable("user/message")), STAGED + " UM('C';plugin:test)",
         tags=["differs-from-original", "D4"]),
    Cell(22, "followup", "(during its tick) queued without a wake (D1); claimed at "
         "continue-or-idle", ["R7.10", "R12.7", "D1"],
         rejected(TAIL_TICK), checks=[log_slice(0, STAGED + " TS(1,msg:user) UM('F')")],
         tags=["differs-from-original", "D1"]),
    Cell(22, "cancel", "(during its tick, a prompt queued) discards, nothing more",
         ["R16.4", "R7.10"],
         rejected(TAIL_TICK, second=True), STAGED,
         [live_ends("cancel-req(user) disc[second] idle")], ["cancel"]),
    Cell(22, "dispose", "(during its tick, a prompt queued) discards it; idle; teardown",
         ["R17.1", "R7.10"],
         rejected(TAIL_TICK, second=True), STAGED,
         [live_ends("disc[second] idle agent/disposed session/disposed")], ["dispose"]),
    Cell(23, "steer", "queued plus a wake: a new interval", ["R6.1", "R4.2"],
         basic(IDLE), STEERED_TURNS, [statuses("running idle running idle"), effects("tick", 2)]),
    Cell(23, "inject", "appended now", ["R5.2"],
         basic(IDLE), CONTEXT_AFTER, [statuses("running idle")]),
    Cell(23, "followup", "queued plus a wake: a new interval", ["R6.1", "R4.2"],
         basic(IDLE), TWO_TURNS, [statuses("running idle running idle")]),
    Cell(23, "cancel", "with nothing pending: a no-op", ["R16.1"],
         basic(IDLE), ONE_TURN, [live_ends("idle"), reports("cancel-req", "")], ["cancel"]),
    Cell(23, "dispose", "teardown right after idle", ["R17.1"],
         basic(IDLE), ONE_TURN, [live_ends("idle agent/disposed session/disposed")], ["dispose"]),
)


# --------------------------------------------------------------------------
# Rows 24 and 25: agent/cancel-requested; discard and abort outputs
# --------------------------------------------------------------------------

CANCEL_REQ = live("agent/cancel-requested")
ABORT_SIGNAL = control("abort")
DISCARD = live("agent/inbox/discard")


def cancelled_stream(position: Predicate, *replies: Any, queued: str | None = None) -> Play:
    """A streaming turn cancelled by the user (a prompt *queued* first), the stream then
    aborting; the command is issued at *position*."""
    def play(command: str) -> Session:
        s = held("model", position, command, *replies)
        if queued is not None:
            s.followup(queued)
        s.cancel()
        s.run()
        s.fail_model(ABORT)
        s.run()
        return s
    return play


def cancelled_while_streaming(observer: Callable[[Session], None], *, times: int | None = 1,
                              keep_inbox: bool = False, steer: bool = False) -> Play:
    """A streaming turn cancelled (by a user cancel), *observer* acting at its
    agent/cancel-requested (the first *times* of them), then the stream aborting."""
    def play(_: str) -> Session:
        s = Session()
        s.hold("model")
        s.on(CANCEL_REQ, lambda o: observer(s), times=times)
        s.followup("go")
        s.run()
        if steer:
            s.steer("S")
        s.cancel(keep_inbox=keep_inbox)
        s.run()
        s.fail_model(ABORT)
        s.run()
        return s
    return play


def queue_then_cancel(s: Session) -> None:
    s.followup("F")
    s.cancel("parent")


def and_then_idle_cancel(s: Session, *, settle: bool = True) -> None:
    """Then, idle, a quiet item parked (and *settle*d): a cancel is effective."""
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    if settle:
        s.run()
    s.cancel()
    s.run()


def quiet_item_cancelled(position: Predicate, *, settle: bool = True) -> Play:
    """Idle, a quiet item parked and cancelled; the command is issued at *position*."""
    def play(command: str) -> Session:
        s = Session()
        at(s, position, command)
        and_then_idle_cancel(s, settle=settle)
        return s
    return play


def aborted_tool_body(command: str) -> Session:
    """A tool body outstanding when the user cancels; the command is issued at the abort."""
    s = held("tool-execute", ABORT_SIGNAL, command, CALL)
    s.cancel()
    s.run()
    s.resolve("tool-execute", result())
    s.run()
    return s


QUIET_CANCELLED = "enq(quiet,q) cancel-req(user) disc[quiet]"

cells(
    Cell(24, "steer", "swept into that cancel's reports (P7)", ["R16.2", "P7"],
         cancelled_stream(CANCEL_REQ), NO_REPLY_ABORTED,
         [live_slice(3, "cancel-req(user) enq(S,s) disc[S]")], ["cancel"]),
    Cell(24, "inject", "(window open) staged, then swept into its context report (D6)",
         ["R16.2", "P7", "D6"],
         cancelled_stream(CANCEL_REQ), NO_REPLY_ABORTED,
         [live_slice(3, "cancel-req(user) ctxdisc[C]")], ["cancel", "differs-from-original", "D6"]),
    Cell(24, "inject-window-closed", "(idle, a quiet item parked) appended now, kept",
         ["R16.2", "R5.2"],
         quiet_item_cancelled(CANCEL_REQ), "UM('C';plugin:test)", [live_is(QUIET_CANCELLED)],
         ["cancel"]),
    Cell(24, "followup", "swept into that cancel's reports (P7)", ["R16.2", "P7"],
         cancelled_stream(CANCEL_REQ), NO_REPLY_ABORTED,
         [live_slice(3, "cancel-req(user) enq(F,q) disc[F]")], ["cancel"]),
    Cell(24, "cancel", "joins that cancel (D9): with nothing new to clear it does nothing, so no "
         "second cancel-requested, and the first cause is the reason", ["R16.3", "P7", "D9"],
         cancelled_while_streaming(lambda s: s.cancel("parent")),
         checks=[reports("cancel-req", "cancel-req(user)"), aborts("user")],
         tags=["cancel", "differs-from-original", "D9"]),
    Cell(24, "cancel-with-new-input", "joins that cancel with new input to clear: "
         "cancel-requested again, the input is swept into the same reports, and the joined "
         "cancel aborts first: its cause is the abort's reason and the turn's",
         ["R16.3", "P7", "R16.2"],
         cancelled_while_streaming(queue_then_cancel),
         NO_REPLY_ABORTED,
         [reports(("cancel-req", "enq", "disc"),
                        "enq(go,q) cancel-req(user) enq(F,q) cancel-req(parent) disc[F]"),
          aborts("parent")],
         tags=["cancel"]),
    Cell(24, "cancel-every-notice", "an observer that cancels on every cancel-requested stops "
         "(D9): its first cancel joins with nothing new to clear and does nothing; the same "
         "holds with keepInbox, and on an idle core with one quiet item", ["R16.1", "P7", "D9"],
         cancelled_while_streaming(lambda s: s.cancel("parent"), times=None),
         checks=[and_then_idle_cancel,
                 reports("cancel-req", "cancel-req(user) cancel-req(user)"),
                 live_has("disc[quiet]")],
         tags=["cancel", "differs-from-original", "D9"]),
    Cell(24, "cancel-keep-inbox-every-notice", "(keepInbox cancels) an observer that cancels "
         "with keepInbox on every cancel-requested stops (D9): a joined keepInbox cancel clears "
         "nothing and does nothing; the staged steering is retained", ["R16.5", "P7", "D9"],
         cancelled_while_streaming(lambda s: s.cancel("parent", keep_inbox=True), times=None,
                                   keep_inbox=True, steer=True),
         NO_REPLY_ABORTED,
         [reports(("cancel-req", "disc"), "cancel-req(user)"), pending(steering=1)],
         ["cancel", "differs-from-original", "D9"]),
    Cell(24, "cancel-joins-keep-inbox", "(a keepInbox cancel being announced) a joined cancel "
         "without keepInbox clears what is pending into reports queued ahead of the abort, and "
         "aborts first: its cause is the reason", ["R16.3", "R16.5", "P7"],
         cancelled_while_streaming(lambda s: s.cancel("parent"), keep_inbox=True, steer=True),
         checks=[reports(("cancel-req", "disc"),
                               "cancel-req(user) cancel-req(parent) disc[S]"),
                 aborts("parent"), pending(steering=0)], tags=["cancel"]),
    Cell(25, "steer", "(at abort, during a tool body) kept: staged and written by the "
         "end-of-step drain after the aborted batch", ["R16.2", "R10.8", "R11.1"],
         aborted_tool_body,
         "TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
         "TR(1.1;c1;ERR ABORTED) STM(1;'S';user) SE(1.1) TE(1,aborted)", tags=["cancel", "tools"]),
    Cell(25, "inject", "(at the inbox discard, while streaming) kept: staged, retained after "
         "the aborted turn, taken by the next admitted turn", ["R16.2", "R11.3"],
         cancelled_stream(DISCARD, "later reply", queued="Q"), NO_REPLY_ABORTED,
         [live_lacks("ctxdisc[C]"), pending(context=1),
          next_turn("later", "TS(2,msg:user) UM('C';plugin:test) UM('later')")], ["cancel"]),
    Cell(25, "followup", "(at abort, while streaming) kept; queued and next to run",
         ["R16.2", "R12.7"],
         cancelled_stream(ABORT_SIGNAL, "two"), NO_REPLY_ABORTED + " " + SECOND_TURN_F,
         tags=["cancel"]),
    Cell(25, "cancel", "(at the inbox discard, idle) nothing is pending again and no owner: a "
         "no-op", ["R16.1"],
         quiet_item_cancelled(DISCARD, settle=False), checks=[live_is(QUIET_CANCELLED)], tags=["cancel"]),
)


# --------------------------------------------------------------------------
# Row 26: publication; row 27: after teardown
# --------------------------------------------------------------------------

SESSION_START = live("agent/session-start")


def at_start(position: Predicate = SESSION_START) -> Play:
    """No prompt; the command is issued at *position*, while the agent is being published."""
    def play(command: str) -> Session:
        s = Session("one")
        at(s, position, command)
        s.run()
        return s
    return play


def nothing_at_all(s: Session) -> None:
    assert s.log() == [] and s.live() == [] and s.caught == []


def after_teardown(_: str) -> Session:
    """Every command, after a disposal."""
    s = Session()
    s.dispose()
    s.run()
    assert s.live() == ["agent/disposed", "session/disposed"]
    for command in (lambda: s.steer("S"), lambda: s.inject("C"), lambda: s.followup("F"),
                    lambda: s.cancel(), lambda: s.core.followup({"not": "a message"}),
                    lambda: s.core.cancel({"kind": "bogus"})):
        problem = s.attempt(command)
        assert problem is not None and "disposed" in problem, problem
    s.dispose()
    s.run()
    assert s.live() == ["agent/disposed", "session/disposed"] and s.log() == []
    return s


cells(
    Cell(26, "steer", "queued plus a wake", ["R5.3", "R6.1", "P11"],
         at_start(), ONE_TURN.replace("'go'", "'S'")),
    Cell(26, "inject", "(at agent/created) appended now, before the first turn", ["R5.2", "P11"],
         at_start(live("agent/created")), "UM('C';plugin:test)"),
    Cell(26, "followup", "(at session/created) queued plus a wake", ["R5.3", "R6.1", "P11"],
         at_start(live("session/created")), ONE_TURN.replace("'go'", "'F'")),
    Cell(26, "cancel", "never raises; does nothing with nothing pending", ["R16.1", "P11"],
         at_start(), checks=[nothing_at_all], tags=["cancel"]),
    Cell(27, "all", "every command but dispose raises DisposedError with no effect, ahead of "
         "validation; dispose() does nothing (D10)", ["R17.3", "P10", "D10"],
         after_teardown, tags=["dispose", "differs-from-original", "D10"]),
)
