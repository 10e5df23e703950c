"""The run API: a prompt's outcome as a value (specs/runtime.md RT21).

``await agent.run(prompt)`` sends *prompt* as a follow-up and returns a `RunResult` once
what it started has ended: the prompt's turn and the retry turns of its chain (R13.3),
or its admission's rejection, or its discard. ``agent.stream(prompt)`` does the same and
yields the run's events as they are delivered. Nothing here adds semantics: a run is
read off the outputs the core emits (its prompt's fate, RT26, then its turns' events up
to ``agent/settled``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Final, Generic, Literal, TypeAlias, TypeVar

from machine import events as ev
from machine.errors import TurnstileError
from machine.events import Event, LiveEvent
from machine.jsonvalue import Frozen, FrozenDict
from machine.runtime.fates import MessageFate, _Entry
from machine.vocabulary import Message, TurnEndReason

__all__ = ["NoOutputError", "OutputValidationError", "RunEvent", "RunOutcome", "RunResult",
           "RunStream", "Sent", "Usage"]

OutputT = TypeVar("OutputT")

#: How a run ended (see `RunResult.outcome`).
RunOutcome: TypeAlias = Literal["completed", "max-tokens", "aborted", "disposed", "error",
                                "limit", "invalid-output", "blocked", "rejected", "discarded"]
#: What `Agent.stream` yields: the run's durable events and the notifications delivered
#: while it ran, in delivery order.
RunEvent: TypeAlias = "Event | LiveEvent"

#: The ``turn/end`` codes (RT24, RT23) that make a run's outcome ``limit`` or
#: ``invalid-output`` rather than ``error``.
LIMIT_CODES: Final = frozenset({"STEP_LIMIT", "TOOL_CALL_LIMIT", "TURN_TOKEN_LIMIT",
                                "RUN_TOKEN_LIMIT"})
OUTPUT_CODE: Final = "OUTPUT_INVALID"


def _count(usage: FrozenDict, key: str) -> int:
    value = usage.get(key)
    return value if type(value) is int and value > 0 else 0


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens, summed over model requests (the original's usage shape, V18: ``inputTokens``
    is the uncached input; cache reads and writes are counted apart). ``requests`` counts
    the requests that gave an assistant message (with or without usage figures)."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    requests: int = 0

    @property
    def total_tokens(self) -> int:
        """Every input token (uncached, cache reads, cache writes) plus the output."""
        return (self.input_tokens + self.cache_read_tokens + self.cache_write_tokens
                + self.output_tokens)

    def __add__(self, other: Usage) -> Usage:
        return Usage(self.input_tokens + other.input_tokens,
                     self.output_tokens + other.output_tokens,
                     self.cache_read_tokens + other.cache_read_tokens,
                     self.cache_write_tokens + other.cache_write_tokens,
                     self.reasoning_tokens + other.reasoning_tokens,
                     self.requests + other.requests)

    @classmethod
    def of(cls, usage: Frozen) -> Usage:
        """The usage of one ``assistant/message`` (its ``usage`` field; counts that are not
        non-negative integers count as 0): one request."""
        if not isinstance(usage, FrozenDict):
            return cls(requests=1)
        return cls(_count(usage, "inputTokens"), _count(usage, "outputTokens"),
                   _count(usage, "cacheReadTokens"), _count(usage, "cacheWriteTokens"),
                   _count(usage, "reasoningTokens"), 1)


class NoOutputError(TurnstileError):
    """`RunResult.output` of a run that has no output: its prompt was blocked, rejected or
    discarded, or its turn ended otherwise than ``completed``/``max-tokens``, or (with an
    ``output_type``) the structured output never validated. ``result`` is the run."""

    code = "NO_OUTPUT"

    def __init__(self, message: str, result: RunResult[object], *,
                 code: str | None = None) -> None:
        super().__init__(message, code=code)
        self.result = result


class OutputValidationError(NoOutputError):
    """`RunResult.output` of a run whose structured output never validated (RT23):
    ``problems`` are the validation failures, oldest first."""

    code = "OUTPUT_INVALID"

    def __init__(self, message: str, result: RunResult[object], problems: tuple[str, ...]
                 ) -> None:
        super().__init__(message, result)
        self.problems = problems


_Unset: Final = object()


@dataclass(frozen=True, slots=True)
class RunResult(Generic[OutputT]):
    """What one run came to (RT21).

    * ``outcome``: ``completed`` / ``max-tokens`` (the chain's last turn ended so, and any
      structured output validated), ``aborted`` / ``disposed`` (a cancel or dispose ended
      its turn), ``error`` (the turn failed: ``reason`` says how), ``limit`` (a limit of
      RT24 ended it), ``invalid-output`` (RT23: the structured output never validated);
      or, when no turn ran: ``blocked`` (a prompt-submit handler blocked it),
      ``rejected`` (its admission failed or was aborted) or ``discarded`` (a cancel or
      dispose dropped it while it was queued);
    * ``turns``: the turn of the prompt and its retry turns, in order (empty when no turn
      ran); ``turn`` is the first of them (None if none);
    * ``events``: the durable events from its ``turn/start`` to the chain's last
      ``turn/end``; ``messages``: the surface messages among them, in log order (the
      prompt, steering and context delivered into those turns, assistant messages, tool
      results);
    * ``usage``: summed over the assistant messages of those turns; ``text``: the text of
      the last assistant message (``""`` when there is none);
    * ``reason``: the last ``turn/end`` reason (None when no turn ran); ``fate``: the
      prompt's fate (RT26);
    * ``output``: the text, or the validated structured output of ``output_type``; reading
      it when there is none raises `NoOutputError` saying why (``output_error``).
    """

    prompt_id: str
    outcome: RunOutcome
    fate: MessageFate
    turns: tuple[int, ...] = ()
    events: tuple[Event, ...] = ()
    usage: Usage = field(default_factory=Usage)
    text: str = ""
    reason: TurnEndReason | None = None
    output_error: str | None = None
    output_code: str | None = None
    output_problems: tuple[str, ...] = ()
    _output: object = field(default=_Unset, repr=False)

    @property
    def turn(self) -> int | None:
        return self.turns[0] if self.turns else None

    @property
    def ok(self) -> bool:
        """Whether the run has its output (``output`` will not raise)."""
        return self._output is not _Unset

    @property
    def messages(self) -> tuple[Message, ...]:
        """The surface messages of the run's events, in log order (L13's projection)."""
        out: list[Message] = []
        for event in self.events:
            if event.type in ev.SURFACE_TYPES:
                message = event.message
                if message is not None:
                    out.append(message)
        return tuple(out)

    @property
    def output(self) -> OutputT:
        """The run's output (see the class docstring); `NoOutputError` when it has none
        (`OutputValidationError` when its structured output never validated)."""
        if self._output is _Unset:
            message = self.output_error or f"the run ended {self.outcome}"
            if self.outcome == "invalid-output":
                raise OutputValidationError(message, self,              # type: ignore[arg-type]
                                            self.output_problems)
            raise NoOutputError(message, self, code=self.output_code)   # type: ignore[arg-type]
        return self._output    # type: ignore[return-value]


def outcome_of(reason: TurnEndReason) -> RunOutcome:
    """The run outcome a chain's last ``turn/end`` reason gives."""
    if reason.kind == "error":
        if reason.code in LIMIT_CODES:
            return "limit"
        if reason.code == OUTPUT_CODE:
            return "invalid-output"
        return "error"
    if reason.kind in ("completed", "max-tokens", "aborted", "disposed"):
        return reason.kind
    return "error"                  # interrupted: only a crash repair writes it (S12)


def reason_text(reason: TurnEndReason) -> str:
    if reason.kind != "error":
        return f"the turn ended {reason.kind}"
    if reason.failure is not None:
        return f"the turn failed: {reason.failure.message} ({reason.failure.code})"
    code = f" ({reason.code})" if reason.code else ""
    return f"the turn failed: {reason.message}{code}"


class Sent(_Entry):
    """A message the agent accepted (returned by ``send``, ``followup``, ``steer`` and
    ``inject``): its ``id``, its ``fate`` now, and ``await sent.wait()`` for its decided
    fate (RT26). (It is the fate ledger's own record of the acceptance, so a command makes
    no second object.)"""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"Sent({self.message_id!r}, {self.view().describe()})"

    @property
    def id(self) -> str:
        return self.message_id

    @property
    def fate(self) -> MessageFate:
        """The message's fate now (``pending`` until decided)."""
        return self.view()

    async def wait(self) -> MessageFate:
        """Wait until the fate is decided and return it. A quiet prompt or retained input
        may stay pending until something else runs; bound the wait if that matters."""
        if self.kind != "pending":
            return self.view()
        waiter: asyncio.Future[MessageFate] = asyncio.get_running_loop().create_future()

        def decided(fate: MessageFate) -> None:
            if not waiter.done():
                waiter.set_result(fate)
        self.on_final(decided)
        return await waiter


class RunStream(Generic[OutputT]):
    """The events of one run as they are delivered (``async for``), then its result
    (``await stream.result()``). Events are buffered: a consumer that falls behind misses
    nothing; leaving the loop early does not cancel the run (``agent.cancel()`` does)."""

    def __init__(self, tracker: _RunTracker[OutputT]) -> None:
        self._tracker = tracker
        self._index = 0

    @property
    def prompt_id(self) -> str:
        return self._tracker.prompt_id

    def __aiter__(self) -> AsyncIterator[RunEvent]:
        return self._events()

    async def _events(self) -> AsyncIterator[RunEvent]:
        tracker = self._tracker
        while True:
            while self._index < len(tracker.stream_events):
                item = tracker.stream_events[self._index]
                self._index += 1
                yield item
            if tracker.done.done():
                return
            await tracker.wait_for_more()

    async def result(self) -> RunResult[OutputT]:
        """The run's result, once it has ended (whether or not the events were read)."""
        return await asyncio.shield(self._tracker.done)


class _RunTracker(Generic[OutputT]):
    """The agent's record of one run in progress: its prompt's acceptance, then the events
    of its chain (from its ``turn/start`` to ``agent/settled``)."""

    def __init__(self, entry: _Entry, loop: asyncio.AbstractEventLoop, *,
                 streaming: bool, finish: Callable[[_RunTracker[OutputT]], RunResult[OutputT]]
                 ) -> None:
        self.entry = entry
        self.prompt_id = entry.message_id
        self.turns: list[int] = []
        self.events: list[Event] = []
        self.reason: TurnEndReason | None = None
        self.streaming = streaming
        self.stream_events: list[RunEvent] = []
        self.done: asyncio.Future[RunResult[OutputT]] = loop.create_future()
        self._more: asyncio.Future[None] | None = None
        self._loop = loop
        self._finish = finish
        self.active = False
        #: The text of the current turn's last assistant message (RT23 validates it).
        self.last_text: str | None = None
        #: Set by structured output (RT23): the validated value, or why there is none.
        self.output: object = _Unset
        self.output_error: str | None = None
        self.output_problems: tuple[str, ...] = ()
        #: What the run adds to its turns (RT23, RT24), if anything.
        self.control: object = None

    @property
    def has_output(self) -> bool:
        return self.output is not _Unset

    def set_output(self, value: object) -> None:
        self.output = value

    # -- fed by the agent's delivery --------------------------------------------------

    def turn_started(self, event: Event) -> None:
        turn = event.data.get("turn")
        if type(turn) is int:
            self.turns.append(turn)
        self.active = True
        self.last_text = None

    def durable(self, event: Event) -> None:
        self.events.append(event)
        if event.type == ev.ASSISTANT_MESSAGE:
            message = event.message
            self.last_text = message.text if message is not None else None
        elif event.type == ev.TURN_END:
            reason = event.data.get("reason")
            try:
                self.reason = TurnEndReason.from_json(reason)
            except TurnstileError:
                self.reason = None
        if self.streaming:
            self._push(event)

    def live(self, event: LiveEvent) -> None:
        if self.streaming:
            self._push(event)

    def _push(self, item: RunEvent) -> None:
        self.stream_events.append(item)
        more = self._more
        if more is not None and not more.done():
            more.set_result(None)

    async def wait_for_more(self) -> None:
        """Until the next event is pushed or the run ends (`end` wakes it too)."""
        more = self._more
        if more is None or more.done():
            more = self._more = self._loop.create_future()
        await more

    def end(self) -> None:
        """The run is over (settled, rejected, discarded, or the agent was torn down)."""
        self.active = False
        if self.done.done():
            return
        self.done.set_result(self._finish(self))
        more = self._more
        if more is not None and not more.done():
            more.set_result(None)


def result_of(tracker: _RunTracker[OutputT], *, structured: bool) -> RunResult[OutputT]:
    """The `RunResult` of a finished run (see `RunResult`)."""
    fate = tracker.entry.view()
    usage = Usage()
    text = ""
    for event in tracker.events:
        if event.type == ev.ASSISTANT_MESSAGE:
            data = event.data
            usage += Usage.of(data.get("usage"))
            message = event.message
            if message is not None and message.text:
                text = message.text
    reason = tracker.reason
    if not tracker.turns:
        outcome: RunOutcome
        if fate.kind == "rejected":
            outcome = "blocked" if fate.rejection == "blocked" else "rejected"
            error = f"the prompt was {fate.describe()}"
        elif fate.kind == "discarded":
            outcome = "discarded"
            error = f"the prompt was {fate.describe()}"
        else:
            outcome = "rejected"
            error = "the prompt never ran: the agent stopped (P16) or was torn down first"
        return RunResult(tracker.prompt_id, outcome, fate, output_error=error,
                         output_code="PROMPT_" + outcome.upper())
    outcome = outcome_of(reason) if reason is not None else "error"
    events = tuple(tracker.events)
    turns = tuple(tracker.turns)
    if outcome not in ("completed", "max-tokens"):
        why = reason_text(reason) if reason is not None else "the turn never ended"
        if outcome == "invalid-output" and tracker.output_error:
            why = tracker.output_error
        return RunResult(tracker.prompt_id, outcome, fate, turns, events, usage, text, reason,
                         why, reason.code if reason is not None and reason.code
                         else "RUN_" + outcome.upper().replace("-", "_"),
                         tracker.output_problems)
    if structured:
        if tracker.output is _Unset:
            return RunResult(tracker.prompt_id, "invalid-output", fate, turns, events, usage,
                             text, reason, tracker.output_error or "the run gave no structured "
                             "output", OUTPUT_CODE, tracker.output_problems)
        return RunResult(tracker.prompt_id, outcome, fate, turns, events, usage, text, reason,
                         _output=tracker.output)
    return RunResult(tracker.prompt_id, outcome, fate, turns, events, usage, text, reason,
                     _output=text)
