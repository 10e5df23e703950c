"""The loop, declared (rules R4.10, R4.13): its activities as records, and each kind's graph.

The core's loop is a stack of activities in progress (R4.10), outermost first: a running
interval, the claim of a prompt, a run, its steps, one step, a tool batch, a drain, ...
Each activity is a record here (a `Frame`: its phase and its locals), and each kind of
activity declares, as data (`KINDS`, the way the machines declare their tables): its
phases, which phases each may go to, which activities it may start (the frame waits at
the phase it set until that activity ends and hands back its result), whether it waits
for a completion there, and whether the activity may end there. The modules of the core
(`machine.core.admission`, ``run``, ``step``, ``tools``, ``drains``, ``failures``) write
one function per phase and bind it to its name with `phase`; `verify` checks that the
functions and the declaration name the same phases.

How the loop runs (`machine.core.state.CoreState.next_output`): the top frame's phase is
called with the core, the frame and what it receives (the completion it waited for, the
result of the activity it started, or None). It returns an *action*: an output to hand
out, a `Wait` for completions, a new `Frame` (the activity it starts, pushed and run at
once) or `DONE` (its activity ends; the frame below receives its ``result``). Before it
returns, a phase sets ``frame.phase`` to where its activity goes on (`goto` sets it and
runs that phase at once). A failure a phase raises unwinds the stack to the nearest frame
with a ``handler`` armed (R8.6), which goes to that phase.

Checking the graph (R4.13): `check_phase_changes` makes every phase change of every frame
in this process go through a check against the declaration, and the loop then checks
each start, wait and end; what breaks the graph is kept in `violations`, which the
invariant monitor (`machine.checking.invariants.InvariantMonitor`) reports. Until it is asked for,
a phase change is a plain slot write and the check costs nothing.

``turnstile diagrams`` draws the graph (`to_dot`) and writes its table (`table_markdown`)
into specs/machines/loop.md.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Literal, TypeAlias

from machine.core.records import Controller, Failure, TurnFailure, Wait
from machine.io import Live, Output
from machine.jsonvalue import Frozen, FrozenDict
from machine.vocabulary import (
    ErrorInfo,
    LlmFailure,
    Message,
    SettleReason,
    ToolResult,
    TurnEndReason,
    TurnTrigger,
)

# ---------------------------------------------------------------------------------------
# Actions and frames
# ---------------------------------------------------------------------------------------


class _Done:
    """The action of a phase that ends its activity; the frame's ``result`` is its value."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "DONE"


DONE: Final = _Done()

#: What a phase gives: an output to hand out, a wait for completions (`Wait`), an activity
#: to start (its `Frame`), or `DONE`.
Action: TypeAlias = "Output | Wait | Frame | _Done"

#: A phase: called with the core, the activity's frame and what the phase receives (the
#: completion waited for, a finished sub-activity's result, a failure for a handler, or None).
Phase: TypeAlias = Callable[[Any, Any, Any], Action]


@dataclass(slots=True, kw_only=True)
class Frame:
    """One activity of the loop in progress (R4.10), as data: its phase (the function that
    runs when the loop next advances it), its locals (the subclass's fields), its result
    once done, and the handler phase armed for the failures it catches (R8.6)."""

    KIND: ClassVar[str] = ""

    phase: Phase
    result: Any = None
    handler: Phase | None = None


# The activities, outermost first (the rules each implements in its kind's declaration).


@dataclass(slots=True, kw_only=True)
class IntervalFrame(Frame):
    """A running interval: claims of the inbox's head until none wakes."""

    KIND: ClassVar[str] = "interval"


@dataclass(slots=True, kw_only=True)
class ClaimFrame(Frame):
    """A claimed prompt's admission: the message, the staged context it inherits, its
    controller, its inbox/dequeue notice, the prompt-submit effect and what it admitted."""

    KIND: ClassVar[str] = "claim"

    message: Message | None = None
    inherited: int = 0
    ctrl: Controller | None = None
    dequeue: Live | None = None
    effect: int = -1
    admitted: tuple[Message, ...] | None = None


@dataclass(slots=True, kw_only=True)
class RejectFrame(Frame):
    """A rejected admission's staged context being appended."""

    KIND: ClassVar[str] = "reject"

    flushing: bool = False


@dataclass(slots=True, kw_only=True)
class TickFrame(Frame):
    """The rejected admission's tick, waited for."""

    KIND: ClassVar[str] = "tick"

    effect: int = -1


@dataclass(slots=True, kw_only=True)
class RunFrame(Frame):
    """A run and its retries: what started it (its trigger, the admitted messages and how
    much staged context it inherited), how many admitted messages are appended, its turn,
    and the flush effect and its failure."""

    KIND: ClassVar[str] = "run"

    trigger: TurnTrigger
    admitted: tuple[Message, ...]
    inherited: int
    appended: int = 0
    turn: int = 0
    flush: int = -1
    flush_error: ErrorInfo | None = None


@dataclass(slots=True, kw_only=True)
class StepsFrame(Frame):
    """The step loop of one turn; ``stopping`` is the turn-stopping effect."""

    KIND: ClassVar[str] = "steps"

    stopping: int = -1


#: What the model stream is folded into (P12): content blocks, and for a run of text or
#: reasoning chunks a list [kind, piece, piece, ...] joined into one block at the end.
Folded: TypeAlias = "FrozenDict | list[str]"


@dataclass(slots=True, kw_only=True)
class StepFrame(Frame):
    """One step: its turn, step and signal, the effect it waits for, the system prompt and
    request header it prepared, the model stream and what it folded so far (P12), and the
    outcome."""

    KIND: ClassVar[str] = "step"

    turn: int
    step: int
    signal: int
    effect: int = -1                  # the hook, system prompt or request effect waited for
    system: Frozen = None
    history_end: int = 0
    header: FrozenDict | None = None
    # R9.6: the prepared request's {retryPolicy} when its preparation named one (R13.2 passes
    # it on; absent stays absent, as every optional field of a payload)
    prepared: FrozenDict | None = None
    model: int = -1
    awaiting: Wait | None = None
    folded: list[Folded] = field(default_factory=list)
    open_kind: str | None = None      # P12: the run of text or reasoning chunks being folded
    chunk_seqs: list[int] = field(default_factory=list)
    chunk: FrozenDict | None = None   # the chunk just appended, folded when the loop goes on
    finish: FrozenDict | None = None
    usage: Frozen = None              # R9.8: the last usage chunk's figures
    failure: Failure | None = None    # raised once its release notice is out
    interrupted: bool = False         # D15: the abort stopped the stream; keep what it delivered
    calls: list[FrozenDict] = field(default_factory=list)   # R9.9: the message's tool calls
    concluded: bool = False
    took_steering: bool = False
    max_tokens: bool = False


@dataclass(slots=True, kw_only=True)
class RequestFailedFrame(Frame):
    """A failed model request: step/end, recovery, classification."""

    KIND: ClassVar[str] = "request-failed"

    error: ErrorInfo
    facts: LlmFailure
    prepared: FrozenDict | None = None
    effect: int = -1
    failure_json: FrozenDict | None = None


@dataclass(slots=True)
class Call:
    """One planned tool call of a batch."""

    index: int
    call_id: str
    name: str
    arguments: Frozen
    call_seq: int = -1
    #: pending: not started; running: executing; settled: has its result; failed: a stage's
    #: value did not validate (R10.9)
    outcome: Literal["pending", "running", "settled", "failed"] = "pending"
    result: ToolResult | None = None
    needs_finalize: bool = False     # R10.4.1: its result still goes through finalize
    dispatched: bool = False         # its execute was requested (R10.11 vs R10.10)
    error: ErrorInfo | None = None


@dataclass(slots=True)
class Batch:
    """One tool batch in progress: its calls, the dispatched calls not yet taken (by execute
    effect id, in start order), and how far starting and committing have come."""

    calls: list[Call]
    in_flight: dict[int, Call] = field(default_factory=dict)
    next_start: int = 0
    commit_from: int = 0
    failed_at: int | None = None
    concluded: bool = False

    def running(self) -> frozenset[int]:
        """The execute effects of dispatched calls still waiting for their settlement."""
        return frozenset(e for e, c in self.in_flight.items() if c.outcome == "running")

    def note(self, call: Call) -> None:
        """R10.9: a failing call (the first in model order) stops the batch."""
        if call.outcome == "failed" and (self.failed_at is None or call.index < self.failed_at):
            self.failed_at = call.index


@dataclass(slots=True, kw_only=True)
class BatchFrame(Frame):
    """A tool batch in progress: the batch, and the group being started: its first call,
    whether it is a parallel pool, its limit, whether it still takes calls, and the call
    just started. Its result says whether a committed result concluded the turn."""

    KIND: ClassVar[str] = "batch"

    batch: Batch
    first: Call | None = None
    pool: bool = False
    limit: int = 1
    group_open: bool = False
    call: Call | None = None
    synthetic: int = 0


@dataclass(slots=True, kw_only=True)
class StartCallFrame(Frame):
    """One call being started: its tool/call, prepare, then dispatch (or not)."""

    KIND: ClassVar[str] = "start-call"

    batch: Batch
    call: Call
    effect: int = -1


@dataclass(slots=True, kw_only=True)
class CommitReadyFrame(Frame):
    """Settled calls being committed in model order; ``call`` is the one in commit."""

    KIND: ClassVar[str] = "commit-ready"

    batch: Batch
    call: Call | None = None


@dataclass(slots=True, kw_only=True)
class CommitCallFrame(Frame):
    """One call's commit: finalize, validate, append, stage; its result says whether it
    concludes the turn."""

    KIND: ClassVar[str] = "commit-call"

    batch: Batch
    call: Call
    effect: int = -1
    committed: ToolResult | None = None


@dataclass(slots=True, kw_only=True)
class DrainFrame(Frame):
    """A drain in progress: how many items it may still take, whether it took steering (its
    result), and the steering message whose append comes next."""

    KIND: ClassVar[str] = "drain"

    limit: int | None = None
    taken: int = 0
    steering: Message | None = None


@dataclass(slots=True, kw_only=True)
class FailTurnFrame(Frame):
    """A failed turn being closed: its open step's end, then the classification."""

    KIND: ClassVar[str] = "fail-turn"

    turn: int
    failure: TurnFailure


@dataclass(slots=True, kw_only=True)
class ClosingFrame(Frame):
    """An append that closes the turn (``type`` is step/end or turn/end)."""

    KIND: ClassVar[str] = "closing"

    type: str
    turn: int


@dataclass(slots=True, kw_only=True)
class ClassifyFrame(Frame):
    """A failure being classified; ``reasons`` are set once its report is out."""

    KIND: ClassVar[str] = "classify"

    failure: TurnFailure
    reasons: tuple[TurnEndReason, SettleReason] | None = None

# ---------------------------------------------------------------------------------------
# The graph
# ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Step:
    """One phase of an activity: where it may go next (*goes*), the activities it may start
    (*starts*: the frame waits at the phase it set for their result), whether the loop waits
    for a completion before it runs (*waits*: its input is that completion), whether the
    activity may end there (*ends*), and its rules."""

    name: str
    goes: tuple[str, ...] = ()
    starts: tuple[str, ...] = ()
    waits: bool = False
    ends: bool = False
    rules: str = ""


def P(name: str, *goes: str, starts: tuple[str, ...] = (), waits: bool = False,
      ends: bool = False, rules: str = "") -> Step:
    """A row of a declaration: phase *name* may go to each of *goes*."""
    return Step(name, goes, starts, waits, ends, rules)


@dataclass(frozen=True, slots=True)
class Kind:
    """A kind of activity: its frame record, what it does, its rules, its phases (the first
    is where it starts), and the phase a caught failure goes to (its handler, R8.6)."""

    name: str
    frame: type[Frame]
    about: str
    rules: str
    phases: tuple[Step, ...]
    handler: str | None = None

    @property
    def entry(self) -> str:
        return self.phases[0].name

    def step(self, name: str) -> Step:
        return next(p for p in self.phases if p.name == name)


#: The loop's graph. Every phase names where it may go; ``finished`` is the phase of an
#: activity whose last output is out (it ends).
KINDS: Final[tuple[Kind, ...]] = (
    Kind("interval", IntervalFrame, "a running interval: claims while a waking item is queued, "
         "then idle", "R4.2, R6.2, R12.7", (
             P("claim", "claimed", starts=("claim",), rules="R7.1"),
             P("claimed", "claim", "finished", rules="R12.7, R17.4"),
             P("finished", ends=True),
         )),
    Kind("claim", ClaimFrame, "the claim of the inbox's head and its admission", "R7", (
        P("begin", "submit", rules="R7.2-R7.4"),
        P("submit", "dequeue", "early_dequeue", starts=("reject",), rules="R7.5"),
        P("early_dequeue", "tick", rules="R7.5, P15"),
        P("dequeue", "await_decision", rules="R7.6"),
        P("await_decision", "decided"),
        P("decided", "admit", waits=True, rules="R7.7, R7.11"),
        P("admit", "finished", "tick", starts=("run", "reject"), rules="R7.8-R7.10"),
        P("tick", "finished", starts=("tick",), rules="R7.10.3"),
        P("finished", ends=True),
    )),
    Kind("reject", RejectFrame, "a rejected admission: the window closes, staged context is "
         "appended", "R7.10.1-R7.10.2", (
             P("begin", "append", rules="R7.10.1"),
             P("append", "finished", ends=True, rules="R7.10.2, P16"),
             P("finished", ends=True),
         )),
    Kind("tick", TickFrame, "the rejected admission's tick", "R7.10.3", (
        P("request", "await_tick"),
        P("await_tick", "ticked"),
        P("ticked", waits=True, ends=True),
    )),
    Kind("run", RunFrame, "a run: its turn, the flush, settlement, and a retry as a new turn",
         "R8, R12.4-R12.6, R13.3", (
             P("turn", "inherited", "finished", rules="R8.1-R8.2, P16"),
             P("inherited", "admitted", starts=("drain",), rules="R8.3.1"),
             P("admitted", "steps", "failed", starts=("drain",), rules="R8.3.2-R8.3.4"),
             P("steps", "close", starts=("steps",), rules="R8.4-R8.5"),
             P("failed", "close", starts=("fail-turn",), rules="R8.6"),
             P("close", "flush", "failed", starts=("closing",), rules="R8.7"),
             P("flush", "await_flush", rules="R12.4"),
             P("await_flush", "flushed"),
             P("flushed", "flush_failed", "settle", waits=True, rules="R12.4"),
             P("flush_failed", "settle", rules="R12.4"),
             P("settle", "turn", "finished", rules="R12.5-R12.6, R13.3"),
             P("finished", ends=True),
         ), handler="failed"),
    Kind("steps", StepsFrame, "the steps of one turn, and turn-stopping", "R8.4-R8.5", (
        P("begin", "stepped", starts=("step",), rules="R8.4"),
        P("stepped", "begin", "await_stopping", ends=True, rules="R8.4-R8.5, R13.4, R14.3"),
        P("await_stopping", "stopped", rules="R8.5"),
        P("stopped", "stop_drained", starts=("drain",), waits=True, rules="R8.5"),
        P("stop_drained", "begin", ends=True, rules="R8.5"),
    )),
    Kind("step", StepFrame, "one step: hooks, the request, the model stream, the assistant "
         "message, the tool batch, the step's end", "R9, R14, P12, P13", (
             P("begin", "await_hook", rules="R9.1"),
             P("await_hook", "hooked"),
             P("hooked", "assemble", starts=("drain",), waits=True, rules="R9.1-R9.2"),
             P("assemble", "await_system", rules="R9.3"),
             P("await_system", "system"),
             P("system", "started", waits=True, rules="R9.3-R9.5"),
             P("started", "await_request", rules="R9.6"),
             P("await_request", "header"),
             P("header", "stream", waits=True, rules="R9.6"),
             P("stream", "stream_wait", rules="R9.7"),
             P("stream_wait", "stream_mail", rules="R9.7, P12"),
             P("stream_mail", "stream_wait", "interrupted", "request_failed", "streamed",
               starts=("request-failed",), waits=True, rules="R9.7, R9.7.1, P5, D5, D15"),
             P("interrupted", rules="R9.7.1, D15"),
             P("streamed", "request_failed", "tools", starts=("request-failed",),
               rules="R9.7-R9.8, R14.1"),
             P("tools", "tools_done", starts=("batch",), rules="R9.9"),
             P("tools_done", "drained", starts=("drain",), rules="R9.10"),
             P("drained", "ended", rules="R9.10"),
             P("ended", ends=True),
             P("request_failed", ends=True, rules="R13.2"),
         )),
    Kind("request-failed", RequestFailedFrame, "a failed model request: step/end, recovery, "
         "classification", "R13.2", (
             P("begin", "recover", rules="R13.2.1"),
             P("recover", "await_recovery", "classify", rules="R13.2.2"),
             P("await_recovery", "answered"),
             P("answered", "classify", waits=True, rules="R13.2.3"),
             P("classify", "done", starts=("classify",), rules="R13.2.4"),
             P("done", ends=True, rules="R13.2.5"),
         )),
    Kind("batch", BatchFrame, "the tool batch: calls in exclusive and parallel groups, "
         "settlements as they come, commits in model order", "R10", (
             P("group", "fill", "end", rules="R10.2"),
             P("fill", "started", "take", starts=("start-call",), rules="R10.2-R10.3"),
             P("started", "fill", starts=("commit-ready",), rules="R10.4"),
             P("take", "group", "settled", "taken", rules="R10.2, P6"),
             P("settled", "taken", waits=True, rules="R10.3.5, P6"),
             P("taken", "fill", starts=("commit-ready",), rules="R10.2, R10.4"),
             P("end", "synthetic_call", ends=True, rules="R10.7, R10.9"),
             P("synthetic_call", "synthetic_result", ends=True, rules="R10.7"),
             P("synthetic_result", "synthetic_call", rules="R10.7"),
         )),
    Kind("start-call", StartCallFrame, "one call started: tool/call, prepare, dispatch",
         "R10.3", (
             P("begin", "prepare", rules="R10.3.1"),
             P("prepare", "await_prepare", ends=True, rules="R10.3.2"),
             P("await_prepare", "prepared", rules="P6"),
             P("prepared", "await_prepare", "finished", waits=True, ends=True,
               rules="R10.3.3-R10.3.4, P6"),
             P("finished", ends=True),
         )),
    Kind("commit-ready", CommitReadyFrame, "settled calls committed in model order", "R10.4", (
        P("next", "committed", starts=("commit-call",), ends=True),
        P("committed", "next", ends=True),
    )),
    Kind("commit-call", CommitCallFrame, "one call's commit: finalize, append, stage",
         "R10.4, R10.6", (
             P("begin", "await_finalize", "staged", rules="R10.4.1"),
             P("await_finalize", "finalized", rules="P6"),
             P("finalized", "await_finalize", "staged", waits=True, ends=True,
               rules="R10.4.1-R10.4.3, P6"),
             P("staged", ends=True, rules="R10.4.4, R10.6"),
         )),
    Kind("drain", DrainFrame, "a drain of the outbox's front", "R11", (
        P("next", "steering", ends=True, rules="R11.1"),
        P("steering", "next", rules="R11.1"),
    )),
    Kind("fail-turn", FailTurnFrame, "a failed turn: its open step's end, then its "
         "classification", "R8.6", (
             P("begin", "classify", starts=("closing",)),
             P("classify", "finished", starts=("classify",)),
             P("finished", ends=True),
         )),
    Kind("closing", ClosingFrame, "an append that closes the turn, tried again once after a "
         "refusal", "P16", (
             P("begin", "again", "finished", starts=("classify",)),
             P("again", "finished"),
             P("finished", ends=True),
         )),
    Kind("classify", ClassifyFrame, "a failure classified into the turn's reasons", "R15", (
        P("begin", "reasons", ends=True, rules="R15.1-R15.3"),
        P("reasons", ends=True, rules="R15.2-R15.3"),
    )),
)

KIND_OF: Final[dict[str, Kind]] = {kind.name: kind for kind in KINDS}

# ---------------------------------------------------------------------------------------
# Binding the phases, and checking the graph
# ---------------------------------------------------------------------------------------

#: The functions bound to the declared phases: (kind, phase) -> function.
_bound: dict[tuple[str, str], Phase] = {}


def phase(kind: str, name: str) -> Callable[[Phase], Phase]:
    """Bind the decorated function as phase *name* of the activity *kind*."""
    def bind(function: Phase) -> Phase:
        if (kind, name) in _bound:
            raise ValueError(f"phase {name!r} of {kind!r} is bound twice")
        _bound[(kind, name)] = function
        return function
    return bind


def finished(_core: object, _frame: Frame, _sent: object) -> Action:
    """The phase of an activity whose last output is out: it ends."""
    return DONE


def wait_for(frame: Frame, then: Phase, effect: int) -> Wait:
    """Wait for the completion of *effect*: phase *then* receives it (P6)."""
    frame.phase = then
    return Wait(frozenset((effect,)))


def goto(core: Any, frame: Frame, to: Phase, sent: object = None) -> Action:
    """Go to phase *to* and run it at once (the frame's next phase is *to*)."""
    frame.phase = to
    if CHECKING:
        running(frame, to)
    return to(core, frame, sent)


@dataclass(slots=True)
class _Graph:
    """The declaration compiled for one frame class: its phases' names by function, the
    allowed changes and the phases that wait or end, by function, and the kinds it starts."""

    kind: Kind
    names: dict[Phase, str]
    changes: frozenset[tuple[Phase, Phase]]
    waits: frozenset[Phase]
    ends: frozenset[Phase]
    starts: frozenset[type[Frame]]


_graphs: dict[type[Frame], _Graph] = {}


def bound(kind: str, name: str) -> Phase:
    """The function bound to phase *name* of *kind*."""
    if name == "finished":
        return finished
    return _bound[(kind, name)]


def verify() -> None:
    """Check that every declared phase has its function and every bound function a declared
    phase, that every edge and start names a declared phase or kind, and compile the graph
    for the checks (`check_phase_changes`). Raises `ValueError` naming what is wrong."""
    problems: list[str] = []
    for kind in KINDS:
        names = {p.name for p in kind.phases}
        if kind.handler is not None and kind.handler not in names:
            problems.append(f"{kind.name}: its handler {kind.handler!r} is not a phase")
        for p in kind.phases:
            if p.name != "finished" and (kind.name, p.name) not in _bound:
                problems.append(f"{kind.name}: phase {p.name!r} has no function")
            problems += [f"{kind.name}: {p.name} goes to {to!r}, not a phase"
                         for to in p.goes if to not in names]
            problems += [f"{kind.name}: {p.name} starts {to!r}, not a kind"
                         for to in p.starts if to not in KIND_OF]
        if kind.name != kind.frame.KIND:
            problems.append(f"{kind.frame.__name__}.KIND is {kind.frame.KIND!r}, not {kind.name!r}")
    problems += [f"{kind}: {name!r} is bound but not declared"
                 for kind, name in _bound if kind not in KIND_OF
                 or name not in {p.name for p in KIND_OF[kind].phases}]
    qualnames = [function.__qualname__ for function in _bound.values()]
    problems += [f"two phases are called {name!r} (a state's key names a phase so)"
                 for name in sorted({n for n in qualnames if qualnames.count(n) > 1})]
    if problems:
        raise ValueError("the loop's graph and its functions disagree: " + "; ".join(problems))
    for kind in KINDS:
        function = {p.name: bound(kind.name, p.name) for p in kind.phases}
        changes = {(function[p.name], function[to]) for p in kind.phases for to in p.goes}
        _graphs[kind.frame] = _Graph(
            kind, {f: name for name, f in function.items()}, frozenset(changes),
            frozenset(function[p.name] for p in kind.phases if p.waits),
            frozenset(function[p.name] for p in kind.phases if p.ends),
            frozenset(KIND_OF[k].frame for p in kind.phases for k in p.starts))


#: True once `check_phase_changes` is called: the loop then checks starts, waits and ends.
CHECKING = False

#: What broke the declared graph since the last `take_violations` (R4.13).
violations: list[str] = []

#: The frame whose phase runs now, and that phase (kept while the check is on): a phase
#: change must start from the phase that runs (a phase that sets a second phase without
#: running the first one skips it).
_running: tuple[Frame, Phase] | None = None


def running(frame: Frame, phase: Phase) -> None:
    """The loop runs *phase* of *frame* now (called only while the check is on)."""
    global _running
    _running = (frame, phase)


#: While not None (and the check is on): what of the declared graph the loop took, as
#: (kind, "a -> b" | "starts k" | "waits at a" | "ends at a"), so that a test can show that
#: each declared change, start, wait and end is one the loop makes (`declared_steps`).
seen: set[tuple[str, str]] | None = None

_SLOT: Final = Frame.__dict__["phase"]     # the slot a phase is stored in


def _name(frame: Frame, function: object) -> str:
    graph = _graphs.get(type(frame))
    name = graph.names.get(function) if graph is not None and callable(function) else None
    return name if name is not None else f"<{getattr(function, '__qualname__', function)}>"


_get_slot: Final = _SLOT.__get__
_set_slot: Final = _SLOT.__set__


def _set_phase(frame: Frame, new: Phase) -> None:
    """The checked write of a phase: a change must follow a declared edge (R4.13)."""
    try:
        old = _get_slot(frame)
    except AttributeError:          # a new frame (or one being copied): any of its phases
        old = None
    if old is not new:
        graph = _graphs.get(type(frame))
        try:
            declared = graph is not None and (old, new) in graph.changes
        except TypeError:           # not a phase at all (unhashable)
            declared = False
        now = _running
        if declared and now is not None and now[0] is frame and now[1] is not old:
            violations.append(f"{graph.kind.name}: {_name(frame, old)} -> {_name(frame, new)} "  # type: ignore[union-attr]
                              f"while {_name(frame, now[1])} runs (it skips "
                              f"{_name(frame, old)})")
        elif not declared:
            _judge(frame, old, new)
        elif seen is not None:
            assert graph is not None
            seen.add((graph.kind.name, f"{graph.names[old]} -> {graph.names[new]}"))
    _set_slot(frame, new)


def _judge(frame: Frame, old: object, new: object) -> None:
    """A phase write that is not a declared change: a new frame's first phase (or a copy's)
    must be one of its kind's; anything else is a violation."""
    graph = _graphs.get(type(frame))
    if graph is None:
        violations.append(f"a {type(frame).__name__} is not a declared activity")
    elif old is None:
        if not callable(new) or new not in graph.names:
            violations.append(f"{graph.kind.name}: {_name(frame, new)} is not one of its phases")
    else:
        violations.append(f"{graph.kind.name}: {_name(frame, old)} -> {_name(frame, new)} is "
                          "not a declared phase change")


def check_phase_changes() -> None:
    """From now on, check every phase change of every frame in this process, and every start,
    wait and end of an activity, against the declared graph; what breaks it is kept in
    `violations`. Idempotent. (For tests and checkers: it costs a function call per change.)"""
    global CHECKING
    if not _graphs:
        verify()
    if not CHECKING:
        # Why the slot's own getter: a read (several per output) stays a C call.
        Frame.phase = property(_get_slot, _set_phase)  # type: ignore[assignment,misc]
        CHECKING = True


def check_start(frame: Frame, started: object) -> None:
    """The loop starts activity *started* from *frame*: its kind must declare that start."""
    graph = _graphs.get(type(frame))
    if graph is not None and type(started) not in graph.starts:
        violations.append(f"{graph.kind.name}: at {_name(frame, frame.phase)} it starts a "
                          f"{type(started).__name__}, which it does not declare")
    elif graph is not None and seen is not None:
        seen.add((graph.kind.name, f"starts {started.KIND}"))  # type: ignore[attr-defined]


def check_wait(frame: Frame) -> None:
    """A phase of *frame* waits for completions: its phase must be declared as waiting."""
    graph = _graphs.get(type(frame))
    if graph is not None and frame.phase not in graph.waits:
        violations.append(f"{graph.kind.name}: it waits at {_name(frame, frame.phase)}, "
                          "which is not declared as waiting")
    elif graph is not None and seen is not None:
        seen.add((graph.kind.name, f"waits at {graph.names[frame.phase]}"))


def check_end(frame: Frame) -> None:
    """*frame*'s activity ends: its phase must be declared as one it may end at."""
    graph = _graphs.get(type(frame))
    if graph is not None and frame.phase not in graph.ends:
        violations.append(f"{graph.kind.name}: it ends at {_name(frame, frame.phase)}, "
                          "which is not declared as an end")
    elif graph is not None and seen is not None:
        seen.add((graph.kind.name, f"ends at {graph.names[frame.phase]}"))


def rebound(kind: str, name: str, function: Phase) -> dict[type[Frame], _Graph]:
    """The graph compiled with *function* bound as phase *name* of *kind* in place of the
    function bound now (for a test that plants a bug in a phase): give it to the loop as
    ``_graphs`` (and *function* to the module whose frames name the phase) while it runs."""
    saved = dict(_bound), dict(_graphs)
    try:
        _bound[(kind, name)] = function
        _graphs.clear()
        verify()
        return dict(_graphs)
    finally:
        _bound.clear()
        _bound.update(saved[0])
        _graphs.clear()
        _graphs.update(saved[1])


def declared_steps() -> set[tuple[str, str]]:
    """Everything the graph declares, in the form `seen` records it."""
    steps: set[tuple[str, str]] = set()
    for kind in KINDS:
        for p in kind.phases:
            steps |= {(kind.name, f"{p.name} -> {to}") for to in p.goes}
            steps |= {(kind.name, f"starts {to}") for to in p.starts}
            if p.waits:
                steps.add((kind.name, f"waits at {p.name}"))
            if p.ends:
                steps.add((kind.name, f"ends at {p.name}"))
    return steps


def take_violations() -> list[str]:
    """What broke the declared graph since the last call (and forget it)."""
    taken = list(violations)
    violations.clear()
    return taken


# ---------------------------------------------------------------------------------------
# Drawing it
# ---------------------------------------------------------------------------------------


def to_dot() -> str:
    """Graphviz DOT source of the loop's graph: one cluster per activity, its phases and
    their changes; a dashed edge for each activity a phase starts, a double circle where an
    activity may end, a phase that waits for a completion drawn bold."""
    lines = ['digraph "loop" {', "  rankdir=TB;", "  compound=true;",
             '  node [shape=box, style=rounded, fontname="Helvetica", fontsize=10];',
             '  edge [fontname="Helvetica", fontsize=9];']
    for kind in KINDS:
        cluster = kind.name.replace("-", "_")
        lines.append(f'  subgraph "cluster_{cluster}" {{')
        lines.append(f'    label="{kind.name} ({kind.rules})"; fontname="Helvetica"; '
                     'fontsize=11; style=rounded;')
        for p in kind.phases:
            style = "rounded,bold" if p.waits else "rounded"
            shape = ", peripheries=2" if p.ends else ""
            lines.append(f'    "{kind.name}.{p.name}" [label="{p.name}", style="{style}"{shape}];')
        lines.append("  }")
    for kind in KINDS:
        for p in kind.phases:
            lines += [f'  "{kind.name}.{p.name}" -> "{kind.name}.{to}";' for to in p.goes]
            lines += [f'  "{kind.name}.{p.name}" -> "{to}.{KIND_OF[to].entry}" '
                      '[style=dashed, arrowhead=empty];' for to in p.starts]
        if kind.handler is not None:
            lines.append(f'  "{kind.name}.{kind.handler}" [color=red];')
    lines.append("}")
    return "\n".join(lines) + "\n"


def table_markdown() -> str:
    """The graph as Markdown tables, one per activity (for specs/machines/loop.md)."""
    out: list[str] = []
    for kind in KINDS:
        out.append(f"### {kind.name} ({kind.rules})")
        out.append("")
        out.append(f"{kind.about[0].upper()}{kind.about[1:]}. Starts at `{kind.entry}`"
                   + (f"; a failure caught here goes to `{kind.handler}` (R8.6)."
                      if kind.handler else "."))
        out.append("")
        out.append("| phase | goes to | starts | waits | may end | rules |")
        out.append("|---|---|---|---|---|---|")
        for p in kind.phases:
            out.append("| `{}` | {} | {} | {} | {} | {} |".format(
                p.name, ", ".join(f"`{to}`" for to in p.goes) or "",
                ", ".join(p.starts), "yes" if p.waits else "", "yes" if p.ends else "",
                p.rules))
        out.append("")
    return "\n".join(out)


__all__ = [
    "DONE",
    "KINDS",
    "KIND_OF",
    "Action",
    "Batch",
    "BatchFrame",
    "Call",
    "ClaimFrame",
    "ClassifyFrame",
    "ClosingFrame",
    "CommitCallFrame",
    "CommitReadyFrame",
    "DrainFrame",
    "FailTurnFrame",
    "Folded",
    "Frame",
    "IntervalFrame",
    "Kind",
    "Phase",
    "RejectFrame",
    "RequestFailedFrame",
    "RunFrame",
    "StartCallFrame",
    "Step",
    "StepFrame",
    "StepsFrame",
    "TickFrame",
    "Wait",
    "check_end",
    "check_phase_changes",
    "check_start",
    "check_wait",
    "finished",
    "goto",
    "phase",
    "table_markdown",
    "take_violations",
    "to_dot",
    "verify",
    "violations",
]
