"""What a run reaches: the R19 row of every position, and the rule families exercised.

Two observers of one agent's inputs and outputs, for checks that want to *measure*
their reach rather than hope for it (ASSURANCE §1, §2):

* `PositionTracker` names the row of the reentrancy matrix (R19) that the current
  position belongs to, from the output stream alone plus two read-only views of the
  agent (``wake_pending`` and ``staged()``), so a harness can count which commands
  it has issued at which rows (`command_kind`);
* `FamilyTracker` records which rule families (`FAMILIES`: the wake, admission,
  rejected admission, tool batch, parallel pool, aborted calls, retries, the first
  cause of two cancels, keepInbox, …) a run exercised.

Neither judges the agent: they are meters. Both work with any implementation
that has the core's outputs and read-only state (the reference model included).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final, Protocol

from machine import events as ev
from machine.errors import ValidationError
from machine.io import (
    FLUSH,
    MODEL,
    PROMPT_SUBMIT,
    REQUEST,
    REQUEST_ERROR,
    STEP_HOOK,
    SYSTEM_PROMPT,
    TICK,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    TURN_STOPPING,
    Cancel,
    Control,
    Dispose,
    Durable,
    Effect,
    Input,
    Live,
    Output,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import FrozenDict, FrozenList
from machine.vocabulary import CancelCause, SendOptions

__all__ = [
    "COMMAND_KINDS", "FAMILIES", "MATRIX_COMMANDS", "ROWS", "FamilyTracker", "PositionTracker",
    "command_kind",
]

#: The rows of R19, by number, with the short name a report uses.
ROWS: Final[dict[int, str]] = {
    1: "wake pending", 2: "status running", 3: "prompt-submit / dequeue",
    4: "admission warning", 5: "turn/start", 6: "inherited drain / prompt",
    7: "rest drain", 8: "step outstanding", 9: "top-of-step drain",
    10: "system-prompt outstanding", 11: "step/start / request", 12: "header / model stream",
    13: "assistant/message / tool batch", 14: "end-of-step drain", 15: "step/end",
    16: "turn-stopping / its drain", 17: "request-error / its warning", 18: "agent/error in a turn",
    19: "turn/end", 20: "flush / flush failure", 21: "agent/settled", 22: "rejected tail",
    23: "status idle", 24: "cancel-requested", 25: "discard / abort", 26: "publication",
    27: "disposed",
}

#: Every command a harness can issue at a position, as `command_kind` names it.
COMMAND_KINDS: Final = ("steer", "inject", "followup", "quiet", "cancel", "cancel-keepInbox",
                        "dispose")
#: The matrix columns (R19) plus the dispose, keepInbox and quiet variants.
MATRIX_COMMANDS: Final = COMMAND_KINDS


def command_kind(item: Input) -> str | None:
    """The matrix column of a command (`COMMAND_KINDS`), or None for an append, a completion
    or a command whose options or cause are malformed (it does nothing)."""
    if isinstance(item, Send):
        try:
            options = SendOptions.from_json(item.options)
        except ValidationError:
            return None
        if options.target == "next-step":
            return "steer" if options.wakeup else "inject"
        return "followup" if options.wakeup else "quiet"
    if isinstance(item, Cancel):
        try:
            CancelCause.from_json(item.cause)
        except ValidationError:
            return None
        if not isinstance(item.keep_inbox, bool):
            return None
        return "cancel-keepInbox" if item.keep_inbox else "cancel"
    if isinstance(item, Dispose):
        return "dispose"
    return None


class _Agent(Protocol):
    @property
    def wake_pending(self) -> bool: ...
    def staged(self) -> tuple[tuple[str, bool], ...]: ...


_EFFECT_ROWS: Final[dict[str, int]] = {
    PROMPT_SUBMIT: 3, STEP_HOOK: 8, SYSTEM_PROMPT: 10, REQUEST: 11, MODEL: 12,
    TOOL_PREPARE: 13, TOOL_EXECUTE: 13, TOOL_FINALIZE: 13, TURN_STOPPING: 16,
    REQUEST_ERROR: 17, FLUSH: 20,
}
_EVENT_ROWS: Final[dict[str, int]] = {
    ev.TURN_START: 5, ev.STEP_START: 11, ev.REQUEST_HEADER: 12, ev.ASSISTANT_CHUNK: 12,
    ev.ASSISTANT_MESSAGE: 13, ev.TOOL_CALL: 13, ev.TOOL_RESULT: 13, ev.STEP_END: 15,
    ev.TURN_END: 19,
}
_FIXED_LIVE_ROWS: Final[dict[str, int]] = {
    ev.CANCEL_REQUESTED: 24, ev.INBOX_DISCARD: 25, ev.CONTEXT_DISCARD: 25,
    ev.SESSION_CREATED: 26, ev.AGENT_CREATED: 26, ev.SESSION_START: 26,
    ev.AGENT_DISPOSED: 27, ev.SESSION_DISPOSED: 27,
}
# The loop phase whose drain a drained item belongs to -> its row.
_DRAIN_ROWS: Final[dict[str, int]] = {"step": 9, "after-message": 14, "stopping": 16,
                                      "admission": 22}


class PositionTracker:
    """The R19 row of the current position of one agent.

    Call `output` with every output pulled, in order; `row` is then the row of the
    position just after it (None before the first output). A command's own outputs (an
    enqueue, an append made at once, a direct append) leave the row of the position the
    command was issued at, except the rows that name them (1, 24, 25). The tracker tells
    a drained item from an append made by a command by the agent's ``staged()`` view,
    read after every output; call `command` after each accepted command so that view is
    read after inputs too.
    """

    def __init__(self, agent: _Agent) -> None:
        self.agent = agent
        self.row: int | None = None
        self._phase = "idle"           # the loop phase, from the loop's own outputs
        self._claimed: str | None = None
        self._prompt_seen = False
        self._staged: frozenset[str] = frozenset()

    def command(self, _item: Input) -> None:
        """After an accepted input: note what is staged now (its outputs come next)."""
        self._staged = frozenset(message_id for message_id, _ in self.agent.staged())

    def output(self, output: Output) -> int | None:
        row = self._classify(output)
        if row is not None:
            self.row = row
        if self.row not in (24, 25, 26, 27) and self.agent.wake_pending:
            self.row = 1
        self._staged = frozenset(message_id for message_id, _ in self.agent.staged())
        return self.row

    def _drained(self) -> int:
        if self._phase == "run-start":
            return 7 if self._prompt_seen else 6
        return _DRAIN_ROWS.get(self._phase, self.row or 0)

    def _classify(self, output: Output) -> int | None:
        if isinstance(output, Effect):
            if output.kind == TICK:
                if output.payload.get("purpose") == "wake":
                    return 1
                self._phase = "rejected"
                return 22
            row = _EFFECT_ROWS.get(output.kind)
            self._phase = {STEP_HOOK: "step", SYSTEM_PROMPT: "assembly", TURN_STOPPING: "stopping",
                           FLUSH: "flush", PROMPT_SUBMIT: "admission"}.get(output.kind, self._phase)
            return row
        if isinstance(output, Control):
            return 25 if output.kind == "abort" else 12
        if isinstance(output, Live):
            return self._live(output.event.type, output.event.payload)
        return self._durable(output)

    def _live(self, kind: str, payload: FrozenDict) -> int | None:
        if kind in _FIXED_LIVE_ROWS:
            return _FIXED_LIVE_ROWS[kind]
        if kind == ev.STATUS:
            if payload.get("status") == "running":
                self._phase = "admission"
                return 2
            self._phase = "idle"
            return 23
        if kind == ev.INBOX_DEQUEUE:
            message = payload.get("message")
            if payload.get("placement") == "queued":
                self._phase = "admission"
                self._claimed = str(message.get("id")) if isinstance(message, FrozenDict) else None
                return 3
            return self._drained()
        if kind == ev.WARNING:
            text = str(payload.get("text", ""))
            if text.startswith("prompt admission"):
                return 4
            if text.startswith("request recovery"):
                return 17
            return 20
        if kind == ev.ERROR:
            return 20 if self._phase in ("flush", "closed") else 18
        if kind == ev.SETTLED:
            self._phase = "settled"
            return 21
        return None                    # an enqueue: the position it was issued at

    def _durable(self, output: Durable) -> int | None:
        event = output.event
        kind = event.type
        if kind == ev.TURN_START:
            trigger = event.data.get("trigger")
            self._phase = "run-start"
            self._prompt_seen = isinstance(trigger, FrozenDict) and trigger.get("kind") == "retry"
            return 5
        if kind in _EVENT_ROWS:
            self._phase = {ev.ASSISTANT_MESSAGE: "after-message", ev.STEP_END: "after-step",
                           ev.TURN_END: "closed", ev.STEP_START: "request"}.get(kind, self._phase)
            return _EVENT_ROWS[kind]
        if kind == ev.STEERING_MESSAGE:
            return self._drained()
        if kind != ev.USER_MESSAGE:
            return None                # a direct append of another type
        message_id = str(event.data.get("id"))
        if message_id in self._staged:
            return self._drained()
        if self._phase == "run-start" and not self._prompt_seen and message_id == self._claimed:
            self._prompt_seen = True   # the prompt (R8.3.2)
            return 6
        if self._phase == "run-start" and self._prompt_seen and self._claimed is not None \
                and self.row == 6:
            return 6                   # a context of the decision, right after the prompt
        return None                    # an append made by a command


# --------------------------------------------------------------------------
# Rule families
# --------------------------------------------------------------------------

#: Rule families a run can exercise, with what shows that it did.
FAMILIES: Final[dict[str, str]] = {
    "R5.2-staged": "an inject staged while the window is open",
    "R5.2-now": "an inject appended at once while the window is closed",
    "R5.3": "a steer staged as steering",
    "R5.7": "a quiet item queued",
    "R6": "a wake requested",
    "R7": "an admission (prompt-submit)",
    "R7.10": "a rejected admission's tail",
    "R8": "a turn",
    "R8.3-after-rejection": "a run started after a rejected admission of its busy interval, "
                            "draining the steering that admission kept staged",
    "R9": "a step",
    "R9.6-resume": "a first header written with reason resume (seeded log)",
    "R10": "a tool batch",
    "R10.2": "two tool bodies executing at once (a parallel pool)",
    "R10.2-limit": "a parallel pool larger than max_parallel_tool_calls",
    "R10.7": "a synthetic aborted-before-dispatch result",
    "R10.9": "a tool stage that raised",
    "R10.11": "a dispatched call committed as ABORTED",
    "R10.4-contexts": "a tool result committed with additional contexts (staged as context)",
    "R11": "a steering item drained into a turn",
    "R12": "a flush",
    "R12.4": "a failed flush",
    "R12.5": "a settlement",
    "R13": "recovery from a request failure",
    "R13.2.3": "a retry authorized after a cancel aborted the failed step's signal",
    "R13.3": "a retry run",
    "R13.4-chain": "a failure chain: a request failure of a retry run, recovered with the "
                   "earlier failure as a prior failure",
    "R13.5-flush": "an effective cancel while a failed turn's flush is outstanding and its "
                   "retry pending (D2)",
    "R14": "a max-tokens step",
    "R15.1": "a turn ended aborted or disposed",
    "R15.2": "a request failure classified",
    "R16": "an effective cancel",
    "R16.3": "a second effective cancel of one activity (the first cause stays)",
    "R16.3-dispose": "a cancel of an activity a dispose aborted (the dispose's cause stays)",
    "R16.5": "an effective keepInbox cancel",
    "R17": "a teardown",
}


class FamilyTracker:
    """Records which `FAMILIES` one run exercised. Feed it every accepted input (`input`,
    with whether the window was open when it was issued) and every output pulled
    (`output`); `reached` is the set of family ids. *tool_modes* and *max_parallel* are
    the agent's configuration (P11), needed to see a pool larger than its limit."""

    def __init__(self, *, tool_modes: Mapping[str, str] | None = None, max_parallel: int = 1) -> None:
        self.tool_modes = dict(tool_modes or {})
        self.max_parallel = max_parallel
        self.reached: set[str] = set()
        self._effects: dict[int, str] = {}
        self._executing: set[int] = set()
        self._beyond_limit: set[str] = set()   # call ids placed past the limit of their pool
        self._aborted = False                  # the current owner has been aborted
        self._aborted_by: object = None        # the kind of the cause it was aborted with
        self._keep_inbox = False               # the last cancel issued had keepInbox
        self._rejected = False                 # a rejected admission in this busy interval
        self._after_rejection = False          # a run start after one, until its first step
        self._retry_pending = False            # a failed turn's retry authorized, not aborted
        self._flushing: int | None = None      # the flush effect outstanding
        self._contexts = False                 # a finalized result with contexts to commit

    def input(self, item: Input, *, window_open: bool) -> None:
        kind = command_kind(item)
        if kind == "inject":
            self.reached.add("R5.2-staged" if window_open else "R5.2-now")
        elif kind == "quiet":
            self.reached.add("R5.7")
        elif kind in ("cancel", "cancel-keepInbox"):
            self._keep_inbox = kind == "cancel-keepInbox"
        if isinstance(item, (Resolve, Raise)):
            self._executing.discard(item.effect)
            effect = self._effects.get(item.effect, "")
            if item.effect == self._flushing:
                self._flushing = None
            if isinstance(item, Raise) and effect.startswith("tool-"):
                self.reached.add("R10.9")
            elif isinstance(item, Resolve) and effect == REQUEST_ERROR \
                    and _field(item.value, "kind") == "retry":
                if self._aborted:
                    self.reached.add("R13.2.3")
                self._retry_pending = not self._aborted
            elif isinstance(item, Resolve) and effect == TOOL_FINALIZE:
                self._contexts = bool(_field(item.value, "additionalContexts"))

    def output(self, output: Output) -> None:
        if isinstance(output, Effect):
            self._effect(output)
        elif isinstance(output, Control):
            if output.kind == "abort":
                if not self._aborted:
                    self._aborted_by = _field(output.payload.get("reason"), "kind")
                self._aborted = True
        elif isinstance(output, Live):
            self._live(output.event.type, output.event.payload)
        else:
            self._durable(output)

    def _effect(self, output: Effect) -> None:
        add = self.reached.add
        self._effects[output.id] = output.kind
        kind = output.kind
        if kind == TICK:
            if output.payload.get("purpose") == "wake":
                add("R6")
            else:
                add("R7.10")
                self._aborted = False          # the admission owner is gone (R7.8)
                self._rejected = True
        elif kind == PROMPT_SUBMIT:
            add("R7")
        elif kind == TOOL_EXECUTE:
            self._executing.add(output.id)
            if len(self._executing) >= 2:
                add("R10.2")
            if str(output.payload.get("callId")) in self._beyond_limit:
                add("R10.2-limit")
        elif kind == REQUEST_ERROR:
            add("R13")
            prior = output.payload.get("priorFailures")
            if isinstance(prior, FrozenList) and prior:
                add("R13.4-chain")
        elif kind == FLUSH:
            add("R12")
            self._aborted = False              # the run owner is gone (R8.7)
            self._flushing = output.id

    def _live(self, kind: str, payload: FrozenDict) -> None:
        add = self.reached.add
        if kind == ev.INBOX_ENQUEUE and payload.get("placement") == "steering":
            add("R5.3")
        elif kind == ev.INBOX_DEQUEUE and payload.get("placement") == "queued":
            self._aborted = False              # a fresh admission controller (R7.3)
        elif kind == ev.CANCEL_REQUESTED:
            add("R16")
            if self._aborted:
                add("R16.3")
                if self._aborted_by == "disposed":
                    add("R16.3-dispose")
            if self._keep_inbox:
                add("R16.5")
            if self._retry_pending and self._flushing is not None:
                add("R13.5-flush")
            self._retry_pending = False        # an effective cancel removes it (R13.5)
        elif kind == ev.WARNING and str(payload.get("text", "")).startswith("session flush"):
            add("R12.4")
        elif kind == ev.SETTLED:
            add("R12.5")
        elif kind == ev.STATUS and payload.get("status") == "idle":
            self._rejected = False             # the busy interval ended
        elif kind == ev.AGENT_DISPOSED:
            add("R17")

    def _durable(self, output: Durable) -> None:
        add = self.reached.add
        event = output.event
        data = event.data
        kind = event.type
        if kind == ev.TURN_START:
            add("R8")
            self._aborted = False              # a fresh run controller (R8.1)
            self._retry_pending = False
            trigger = data.get("trigger")
            if isinstance(trigger, FrozenDict) and trigger.get("kind") == "retry":
                add("R13.3")
            self._after_rejection = self._rejected and not (
                isinstance(trigger, FrozenDict) and trigger.get("kind") == "retry")
        elif kind == ev.STEP_START:
            add("R9")
            self._after_rejection = False
        elif kind == ev.REQUEST_HEADER and data.get("reason") == "resume":
            add("R9.6-resume")
        elif kind == ev.ASSISTANT_MESSAGE:
            self._plan_pools(data.get("message"))
        elif kind == ev.TOOL_CALL:
            add("R10")
        elif kind == ev.TOOL_RESULT:
            if self._contexts:
                add("R10.4-contexts")
                self._contexts = False
            error = data.get("error")
            code = error.get("code") if isinstance(error, FrozenDict) else None
            if code == "ABORTED_BEFORE_DISPATCH":
                add("R10.7")
            elif code == "ABORTED":
                add("R10.11")
        elif kind == ev.STEERING_MESSAGE:
            add("R11")
            if self._after_rejection:
                add("R8.3-after-rejection")
        elif kind == ev.ASSISTANT_CHUNK:
            chunk = data.get("chunk")
            if isinstance(chunk, FrozenDict) and chunk.get("type") == "finish" \
                    and chunk.get("kind") == "max-tokens":
                add("R14")
        elif kind == ev.TURN_END:
            reason = data.get("reason")
            reason_kind = reason.get("kind") if isinstance(reason, FrozenDict) else None
            if reason_kind in ("aborted", "disposed"):
                add("R15.1")
            elif isinstance(reason, FrozenDict) and reason_kind == "error" and "failure" in reason:
                add("R15.2")

    def _plan_pools(self, message: object) -> None:
        """R10.2: the runs of parallel calls of a message; the calls past a pool's limit."""
        self._beyond_limit = set()
        if not isinstance(message, FrozenDict):
            return
        content = message.get("content")
        position = 0
        for block in content if isinstance(content, FrozenList) else ():
            if not isinstance(block, FrozenDict) or block.get("type") != "tool-call":
                continue
            if self.tool_modes.get(str(block.get("name"))) == "parallel":
                if position >= self.max_parallel:
                    self._beyond_limit.add(str(block.get("id")))
                position += 1
            else:
                position = 0

    def missing(self, families: Iterable[str] = FAMILIES) -> list[str]:
        return [family for family in families if family not in self.reached]


def _field(value: object, name: str) -> object:
    """The field *name* of a completion's value or of a payload's part in their JSON form
    (a mapping); None for anything else."""
    return value.get(name) if isinstance(value, Mapping) else None
