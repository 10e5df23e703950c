"""Runtime invariants of the agent (spec R20.1), checkable at every input and output.

`InvariantMonitor` watches one core (or anything with the core's read-only
interface) from the outside: it is fed every output pulled and polled after
every input and output. It raises `AgentInvariantError` naming the rule at
the first violation. The pure helpers below it carry contracts that CrossHair
checks.

* R20.1a status alternation: ``agent/status`` never repeats its previous value
  and starts with ``running``; each interval has one running and one idle (D1).
* R20.1b inbox conservation: every message announced by
  ``agent/inbox/enqueue`` gets exactly one ``agent/inbox/dequeue`` or appears in
  exactly one ``agent/inbox/discard``, and never both.
* R20.1c context accounting: every context item that entered the outbox ends
  in exactly one of: a ``user/message`` append, an ``agent/context/discard``
  entry, or still staged.
* R20.1e window: ``accepts_next_step`` is false whenever the status is idle.
* R20.1g pool: no more ``{tool-execute}`` effects outstanding than the agent's
  ``max_parallel_tool_calls`` (R10.2, P11).
* R20.1h steering order: each ``steering/message`` the loop writes comes after that
  message's ``agent/inbox/dequeue`` (R11.1, R3.1); checked by a monitor that sees the
  inputs, which tells direct appends of ``steering/message`` apart.
* R4.11 couplings: for an agent that states them (``coupling_problems()``, as
  `machine.core.AgentCore` does), none is broken.
* R4.13 the loop's graph: a monitor turns on the check of every phase change of the core's
  loop against its declared graph (`machine.core.loop.check_phase_changes`), and reports
  the first change, start, wait or end off the graph.
* Accepted messages are never silently gone: at every moment each enqueued or
  staged message is logged, reported discarded, or pending.
* The ledger starts at the command (R20.1b, R20.1c, R5, R0.6): a monitor that sees
  the inputs (``sees_inputs``, fed through `InvariantMonitor.input`) also checks that
  every accepted send but an inject is announced by exactly one enqueue, and that every
  accepted inject, closed-window injects included, is appended, staged or reported
  discarded, exactly once.
* A claimed item (R7.2, R7.5, R7.6, R20.1b) is the head of the queue; it gets its
  dequeue before its admission ends (ahead of ``turn/start`` or of the rejected tail's
  tick), even when the admission was aborted before ``{prompt-submit}``, and it is
  never listed in a discard.
* R20.5 provider requests: every model request the agent asks for, and the continuation
  of its log after every surface event or header (what a fork or a resume there sends
  first), makes request bodies both adapters' providers accept (specs/providers.md W9,
  `machine.providers.check`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from machine import events as ev
from machine.core import loop
from machine.errors import TurnstileError, ValidationError
from machine.events import Event
from machine.io import Append, Durable, Effect, Input, Live, Output, Send
from machine.jsonvalue import FrozenDict, FrozenList
from machine.log import SessionLog
from machine.providers.check import RequestCheck
from machine.vocabulary import SendOptions

#: The durable events after which the continuation of the log is checked (R20.5): those that
#: change its derived history (L13) or its latest header.
_CONTINUATION_EVENTS = frozenset({ev.USER_MESSAGE, ev.STEERING_MESSAGE, ev.TOOL_RESULT,
                                  ev.ASSISTANT_MESSAGE, ev.REQUEST_HEADER})


class AgentInvariantError(TurnstileError):
    """A runtime invariant of R20.1 does not hold."""

    code = "AGENT_INVARIANT"

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {message}")


class _Observable(Protocol):
    @property
    def status(self) -> str: ...
    @property
    def accepts_next_step(self) -> bool: ...


class _HasBoxes(Protocol):
    def queued_ids(self) -> tuple[str, ...]: ...
    def staged(self) -> tuple[tuple[str, bool], ...]: ...


def next_status_ok(previous: str | None, new: str) -> bool:
    """R20.1a: a status notification differs from the previous one; the first is running.

    pre: previous in (None, 'idle', 'running')
    pre: new in ('idle', 'running')
    post: __return__ == (new == 'running' if previous is None else previous != new)
    """
    if previous is None:
        return new == "running"
    return previous != new


def window_ok(status: str, accepts_next_step: bool) -> bool:
    """R20.1e: the window is closed while idle.

    pre: status in ('idle', 'running')
    post: __return__ == (status == 'running' or not accepts_next_step)
    """
    return status == "running" or not accepts_next_step


def conservation_problem(enqueued: dict[str, int], dequeued: dict[str, int],
                         discarded: dict[str, int], pending: Iterable[str]) -> str | None:
    """R20.1b: each enqueued id is dequeued, discarded or pending — exactly once overall.

    Counts are per message id (a message may legitimately be sent twice).
    post: (__return__ is None) or ("message" in __return__)
    """
    pending_counts: dict[str, int] = {}
    for message_id in pending:
        pending_counts[message_id] = pending_counts.get(message_id, 0) + 1
    for key in sorted(set(enqueued) | set(dequeued) | set(discarded) | set(pending_counts)):
        accounted = dequeued.get(key, 0) + discarded.get(key, 0) + pending_counts.get(key, 0)
        if enqueued.get(key, 0) != accounted:
            return (f"message {key!r}: enqueued {enqueued.get(key, 0)} time(s), but dequeued "
                    f"{dequeued.get(key, 0)}, discarded {discarded.get(key, 0)}, pending "
                    f"{pending_counts.get(key, 0)}")
    return None


def _ids(messages: object) -> list[str]:
    if not isinstance(messages, FrozenList):
        return []
    return [str(m["id"]) for m in messages if isinstance(m, FrozenDict)]


class InvariantMonitor:
    """Checks R20.1 over the outputs of one agent.

    Feed every pulled output to `output`; call `poll` after every input, and
    `poll(quiet=True)` when the agent has no output to give. Between a state
    change and the output that reports it (a claim and its dequeue notice, a
    cancel and its discard reports) the accounts are open, so the exact
    balances are checked at quiet points; elsewhere nothing may be counted twice.
    """

    def __init__(self, agent: _Observable, boxes: _HasBoxes, *, sees_inputs: bool = False,
                 requests: RequestCheck | bool = True) -> None:
        loop.check_phase_changes()          # R4.13: from now on, every phase change is checked
        self.agent = agent
        self.boxes = boxes
        self.sees_inputs = sees_inputs
        #: R20.5: the provider-request check (shared by copies of the monitor), or None
        self.requests = RequestCheck() if requests is True else requests or None
        self.last_status: str | None = None
        self.enqueued: dict[str, int] = {}
        self.dequeued: dict[str, int] = {}
        self.discarded: dict[str, int] = {}
        self.contexts_seen: dict[str, int] = {}   # context ids seen staged
        self.contexts_logged: dict[str, int] = {}
        self.contexts_discarded: dict[str, int] = {}
        self._last_staged: dict[str, int] = {}
        # The command ledger (sees_inputs): accepted sends by id, injects apart.
        self.sent: dict[str, int] = {}
        self.injected: dict[str, int] = {}
        self.logged: dict[str, int] = {}          # user/message appends, by message id
        self.context_reports: dict[str, int] = {}  # agent/context/discard entries, by id
        # The claim in progress: the claimed id until its dequeue (R7.2-R7.6).
        self.claimed: str | None = None
        self._last_queued: tuple[str, ...] = tuple(boxes.queued_ids())
        # R20.1g: the tool-execute effects seen requested; R20.1h: steering dequeues and
        # the loop's steering records, by message id.
        self.executing: set[int] = set()
        self.steering_dequeued: dict[str, int] = {}
        self.steering_logged: dict[str, int] = {}
        self.steering_direct: dict[str, int] = {}   # direct appends of steering/message

    def input(self, item: Input, *, accepted: bool = True) -> None:
        """An input the agent was fed (call it before `poll`): an accepted send enters the
        command ledger. Only a monitor made with ``sees_inputs`` checks that ledger."""
        if accepted and isinstance(item, Append) and item.type == ev.STEERING_MESSAGE:
            data = item.data                    # a direct steering record (R20.1h)
            message = data.get("message") if isinstance(data, (dict, FrozenDict)) else None
            message_id = message.get("id") if isinstance(message, (dict, FrozenDict)) else None
            _bump(self.steering_direct, str(message_id))
        if not accepted or not isinstance(item, Send):
            return
        message = item.message
        message_id = message.get("id") if isinstance(message, (dict, FrozenDict)) else getattr(
            message, "id", None)
        try:
            options = SendOptions.from_json(item.options)
        except ValidationError:
            return
        if isinstance(message_id, str):
            inject = options.target == "next-step" and not options.wakeup
            _bump(self.injected if inject else self.sent, message_id)

    def ledger(self) -> tuple[object, ...]:
        """Everything the monitor has counted, canonically ordered: two monitors with equal
        ledgers judge every continuation alike (an explorer's state key includes it)."""
        counts = (self.enqueued, self.dequeued, self.discarded, self.contexts_seen,
                  self.contexts_logged, self.contexts_discarded, self._last_staged, self.sent,
                  self.injected, self.logged, self.context_reports, self.steering_dequeued,
                  self.steering_logged, self.steering_direct)
        # (`executing` is not in it: what it judges by, its ids still outstanding, is the
        # agent's own state.)
        return (self.last_status, self.claimed, self._last_queued,
                *(tuple(sorted(c.items())) for c in counts))

    def output(self, output: Output) -> None:
        _check_loop()
        if isinstance(output, Live):
            event = output.event
            payload = event.payload
            if event.type == ev.STATUS:
                status = str(payload["status"])
                if not next_status_ok(self.last_status, status):
                    raise AgentInvariantError("R20.1a", f"agent/status {status!r} after {self.last_status!r}")
                self.last_status = status
                if status == "running":
                    self._claim_seen()
            elif event.type == ev.INBOX_ENQUEUE:
                _bump(self.enqueued, str(_message_id(payload)))
            elif event.type == ev.INBOX_DEQUEUE:
                message_id = str(_message_id(payload))
                _bump(self.dequeued, message_id)
                if payload.get("placement") == "steering":
                    _bump(self.steering_dequeued, message_id)
                elif payload.get("placement") == "queued":
                    if self.claimed is not None and self.claimed != message_id:
                        raise AgentInvariantError("R20.1b", f"dequeue of {message_id!r}, but "
                                                  f"{self.claimed!r} was claimed")
                    self.claimed = None
            elif event.type == ev.INBOX_DISCARD:
                for message_id in _ids(payload.get("messages")):
                    if message_id == self.claimed:
                        raise AgentInvariantError("R20.1b", f"the claimed item {message_id!r} "
                                                  "is listed in a discard instead of its dequeue")
                    _bump(self.discarded, message_id)
            elif event.type == ev.CONTEXT_DISCARD:
                for message_id in _ids(payload.get("messages")):
                    _bump(self.context_reports, message_id)
                    if message_id in self.contexts_seen:
                        _bump(self.contexts_discarded, message_id)
        elif isinstance(output, Durable):
            if self.requests is not None and output.event.type in _CONTINUATION_EVENTS:
                log = getattr(self.agent, "log", None)
                if isinstance(log, SessionLog):
                    self.requests.log(log, f"the log after seq {output.event.seq} "
                                           f"({output.event.type})")
            if output.event.type == ev.USER_MESSAGE:
                message_id = str(output.event.data["id"])
                _bump(self.logged, message_id)
                if message_id in self.contexts_seen:
                    _bump(self.contexts_logged, message_id)
            elif output.event.type == ev.TURN_START:
                self._admission_over("turn/start")
            elif output.event.type == ev.STEERING_MESSAGE and self.sees_inputs:
                self._steering_logged(output.event)
        elif isinstance(output, Effect):
            if output.kind == "model" and self.requests is not None:
                header = output.payload.get("header")
                if isinstance(header, FrozenDict):
                    self.requests.request(header, output.history or (),
                                          f"model request {output.id}")
            if output.kind == "prompt-submit":
                message_id = str(_message_id(output.payload))
                if self.claimed is None:           # a chained claim: no running notice
                    self.claimed = message_id
                elif self.claimed != message_id:
                    raise AgentInvariantError("R20.1b", f"prompt-submit for {message_id!r}, "
                                              f"but {self.claimed!r} was claimed")
            elif output.kind == "tick" and output.payload.get("purpose") == "rejected-admission":
                self._admission_over("the rejected admission's tick")
            elif output.kind == "tool-execute":
                self._execute_requested(output.id)
        self.poll()

    def _execute_requested(self, effect: int) -> None:
        """R20.1g (R10.2, P11): a pool never has more calls in flight than its limit. The
        calls executing are the tool-execute effects requested and still outstanding (a
        settled call the batch has not taken yet is in flight too, so this count is never
        more than the batch's own)."""
        outstanding = getattr(self.agent, "outstanding_effects", None)
        config = getattr(self.agent, "config", None)
        limit = getattr(config, "max_parallel_tool_calls", None)
        if not isinstance(outstanding, tuple) or not isinstance(limit, int):
            return                              # an agent that does not show them
        self.executing.add(effect)
        self.executing &= set(outstanding)
        if len(self.executing) > limit:
            raise AgentInvariantError("R20.1g", f"{len(self.executing)} tool calls in flight "
                                      f"(effects {sorted(self.executing)}), but "
                                      f"max_parallel_tool_calls is {limit}")

    def _steering_logged(self, event: Event) -> None:
        """R20.1h (R11.1, R3.1): the loop appends a steering item after its dequeue notice.
        Extension code may append ``steering/message`` too (R20.4 does not refuse it), so
        only a monitor that sees the inputs tells the loop's records from direct ones."""
        message_id = str(_message_id(event.data))
        if self.steering_direct.get(message_id, 0) > 0:
            self.steering_direct[message_id] -= 1      # a direct append's record
            return
        _bump(self.steering_logged, message_id)
        if self.steering_logged[message_id] > self.steering_dequeued.get(message_id, 0):
            raise AgentInvariantError("R20.1h", f"steering/message of {message_id!r} (seq "
                                      f"{event.seq}) before its agent/inbox/dequeue")

    def _claim_seen(self) -> None:
        """R7.2: a claim takes the head of the queue as it was at the last poll (later items
        keep their order). The claimed id is noted only when that is what the queue shows;
        a monitor that started late, or a queue view it cannot follow, notes nothing."""
        before, now = self._last_queued, tuple(self.boxes.queued_ids())
        if before and now[:len(before) - 1] == before[1:]:
            self.claimed = before[0]

    def _admission_over(self, what: str) -> None:
        if self.claimed is not None:
            raise AgentInvariantError("R20.1b", f"the claimed item {self.claimed!r} got no "
                                      f"agent/inbox/dequeue before {what}")

    def poll(self, *, quiet: bool = False) -> None:
        _check_loop()
        if not window_ok(self.agent.status, self.agent.accepts_next_step):
            raise AgentInvariantError("R20.1e", "accepts_next_step is true while idle")
        couplings = getattr(self.agent, "coupling_problems", None)
        if couplings is not None:               # R4.11: an implementation that states them
            problems = couplings()
            if problems:
                raise AgentInvariantError("R4.11", "; ".join(problems))
        staged = self.boxes.staged()
        current: dict[str, int] = {}
        for message_id, steering in staged:
            if not steering:
                _bump(current, message_id)
        for message_id, count in current.items():
            grown = count - self._last_staged.get(message_id, 0)
            if grown > 0:
                self.contexts_seen[message_id] = self.contexts_seen.get(message_id, 0) + grown
        self._last_staged = current
        for message_id, seen in self.contexts_seen.items():
            done = self.contexts_logged.get(message_id, 0) + self.contexts_discarded.get(message_id, 0)
            accounted = done + current.get(message_id, 0)
            if done > seen or (quiet and accounted != seen):
                raise AgentInvariantError(
                    "R20.1c", f"context {message_id!r} staged {seen} time(s) but logged "
                    f"{self.contexts_logged.get(message_id, 0)}, discarded "
                    f"{self.contexts_discarded.get(message_id, 0)}, still staged "
                    f"{current.get(message_id, 0)}")
        for message_id in set(self.dequeued) | set(self.discarded):
            if self.dequeued.get(message_id, 0) + self.discarded.get(message_id, 0) > \
                    self.enqueued.get(message_id, 0):
                raise AgentInvariantError("R20.1b", f"message {message_id!r} was dequeued or "
                                          "discarded more often than it was enqueued")
        queued = tuple(self.boxes.queued_ids())
        self._last_queued = queued
        if quiet:
            pending = [*queued, *(m for m, steering in staged if steering)]
            problem = conservation_problem(self.enqueued, self.dequeued, self.discarded, pending)
            if problem is not None:
                raise AgentInvariantError("R20.1b", problem)
            if self.claimed is not None:
                raise AgentInvariantError("R20.1b", f"the claimed item {self.claimed!r} got no "
                                          "agent/inbox/dequeue")
            if self.sees_inputs:
                self._check_command_ledger(current)

    def _check_command_ledger(self, staged_contexts: dict[str, int]) -> None:
        """At a quiet point: each accepted send has its first fate (see the module docstring)."""
        for message_id, count in self.sent.items():
            if self.enqueued.get(message_id, 0) != count:
                raise AgentInvariantError(
                    "R20.1b", f"message {message_id!r}: accepted {count} time(s) by a send, but "
                    f"announced by {self.enqueued.get(message_id, 0)} agent/inbox/enqueue")
        for message_id, count in self.injected.items():
            if message_id in self.sent:
                continue                           # the id was also sent otherwise: ambiguous
            fates = (self.logged.get(message_id, 0), staged_contexts.get(message_id, 0),
                     self.context_reports.get(message_id, 0))
            if sum(fates) != count:
                raise AgentInvariantError(
                    "R20.1c", f"inject {message_id!r}: accepted {count} time(s), but appended "
                    f"{fates[0]}, still staged {fates[1]}, reported discarded {fates[2]}")


def _check_loop() -> None:
    """R4.13: what went off the loop's declared graph since the last check, as an error."""
    if loop.violations:
        raise AgentInvariantError("R4.13", "; ".join(loop.take_violations()))


def _message_id(payload: FrozenDict) -> object:
    message = payload.get("message")
    return message["id"] if isinstance(message, FrozenDict) else None


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1
