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
* Accepted messages are never silently gone: at every moment each enqueued or
  staged message is logged, reported discarded, or pending.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from machine import events as ev
from machine.errors import TurnstileError
from machine.io import Durable, Live, Output
from machine.jsonvalue import FrozenDict, FrozenList


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

    def __init__(self, agent: _Observable, boxes: _HasBoxes) -> None:
        self.agent = agent
        self.boxes = boxes
        self.last_status: str | None = None
        self.enqueued: dict[str, int] = {}
        self.dequeued: dict[str, int] = {}
        self.discarded: dict[str, int] = {}
        self.contexts_seen: dict[str, int] = {}   # context ids seen staged
        self.contexts_logged: dict[str, int] = {}
        self.contexts_discarded: dict[str, int] = {}
        self._last_staged: dict[str, int] = {}

    def output(self, output: Output) -> None:
        if isinstance(output, Live):
            event = output.event
            payload = event.payload
            if event.type == ev.STATUS:
                status = str(payload["status"])
                if not next_status_ok(self.last_status, status):
                    raise AgentInvariantError("R20.1a", f"agent/status {status!r} after {self.last_status!r}")
                self.last_status = status
            elif event.type == ev.INBOX_ENQUEUE:
                _bump(self.enqueued, str(_message_id(payload)))
            elif event.type == ev.INBOX_DEQUEUE:
                _bump(self.dequeued, str(_message_id(payload)))
            elif event.type == ev.INBOX_DISCARD:
                for message_id in _ids(payload.get("messages")):
                    _bump(self.discarded, message_id)
            elif event.type == ev.CONTEXT_DISCARD:
                for message_id in _ids(payload.get("messages")):
                    if message_id in self.contexts_seen:
                        _bump(self.contexts_discarded, message_id)
        elif isinstance(output, Durable) and output.event.type == ev.USER_MESSAGE:
            message_id = str(output.event.data["id"])
            if message_id in self.contexts_seen:
                _bump(self.contexts_logged, message_id)
        self.poll()

    def poll(self, *, quiet: bool = False) -> None:
        if not window_ok(self.agent.status, self.agent.accepts_next_step):
            raise AgentInvariantError("R20.1e", "accepts_next_step is true while idle")
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
        if quiet:
            pending = [*self.boxes.queued_ids(), *(m for m, steering in staged if steering)]
            problem = conservation_problem(self.enqueued, self.dequeued, self.discarded, pending)
            if problem is not None:
                raise AgentInvariantError("R20.1b", problem)


def _message_id(payload: FrozenDict) -> object:
    message = payload.get("message")
    return message["id"] if isinstance(message, FrozenDict) else None


def _bump(counts: dict[str, int], key: str) -> None:
    counts[key] = counts.get(key, 0) + 1
