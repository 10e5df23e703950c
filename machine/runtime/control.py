"""What a run adds to its turns: structured output (RT23) and limits (RT24).

A `RunControl` belongs to one chain of turns (a prompt's turn and its retries, R13.3).
The agent installs it on its `Environment` at the chain's first ``turn/start`` and removes
it at ``agent/settled``; the environment asks it, at the effects of those turns, for:

* the request: the final-answer tool's spec (tool mode) or the provider's structured-output
  options (native mode) beside the request config;
* the final-answer tool itself, by name;
* at each ``{step}``: whether the turn must end (a limit reached, the output re-asks
  used up): it raises, and the core ends the turn with that error (R9.1, R15.3);
* at ``{turn-stopping}``: the validation of a native answer, or the reminder to call the
  final-answer tool, each a re-ask by steering (R8.5: steering there makes another step).

Everything here composes the core's existing semantics; nothing changes them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Final

from machine.errors import TurnstileError, ValidationError
from machine.jsonvalue import FrozenDict
from machine.runtime.hooks import JsonValue, TurnStopping
from machine.runtime.tools import Tool, ToolArgumentError, ToolCall
from machine.vocabulary import Message, ToolResult, user_message

if TYPE_CHECKING:
    from machine.runtime.run import _RunTracker
    from machine.runtime.typed import OutputSpec

__all__ = ["OUTPUT_SOURCE", "LimitExceededError", "Limits", "OutputInvalidError", "RunControl"]

#: The source of the runtime's re-ask messages (RT23): steering, labelled as context.
OUTPUT_SOURCE: Final = {"kind": "plugin", "plugin": "output"}
_ABSENT: Final = object()


class OutputInvalidError(TurnstileError):
    """The structured output failed validation once more than the run allows (RT23): the
    turn ends ``{kind:'error', code:'OUTPUT_INVALID'}``."""

    code = "OUTPUT_INVALID"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on the agent's turns (RT24); None: no bound.

    * ``steps``: model steps per turn;
    * ``tool_calls``: tool calls run per turn (a run's final-answer tool not counted);
    * ``turn_tokens``: tokens per turn (`Usage.total_tokens` of its assistant messages);
    * ``run_tokens``: tokens per run: a turn and its retry turns (R13.3).
    """

    steps: int | None = None
    tool_calls: int | None = None
    turn_tokens: int | None = None
    run_tokens: int | None = None

    def __post_init__(self) -> None:
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None and (type(value) is not int or value < 1):
                raise ValidationError(f"limits.{item.name}",
                                      f"must be a positive integer or None, not {value!r}")

    def over(self, base: Limits | None) -> Limits:
        """These limits, each one left None taken from *base*."""
        if base is None:
            return self
        return Limits(*(getattr(self, f.name) if getattr(self, f.name) is not None
                        else getattr(base, f.name) for f in fields(self)))

    @property
    def any(self) -> bool:
        return any(getattr(self, f.name) is not None for f in fields(self))


class LimitExceededError(TurnstileError):
    """A limit of RT24 ended the turn: ``turn/end {kind:'error', code}`` with the code of the
    limit (``STEP_LIMIT``, ``TOOL_CALL_LIMIT``, ``TURN_TOKEN_LIMIT``, ``RUN_TOKEN_LIMIT``)."""

    code = "LIMIT_EXCEEDED"


def _tool_limit_result(limit: int) -> dict[str, JsonValue]:
    message = f"tool call limit reached ({limit} per turn): this call was not run"
    return {"content": [{"type": "text", "text": f"Error: {message}"}], "isError": True,
            "error": {"name": "LimitExceededError", "message": message,
                      "code": "TOOL_CALL_LIMIT"}}


class RunControl:
    """What one chain's turns get from its run (see the module docstring). *spec* is the
    output type's description, *native* the adapter's options for it (None: the
    final-answer tool), *retries* how many failed answers are re-asked, *steer* the
    agent's ``steer``."""

    def __init__(self, tracker: _RunTracker[Any] | None, spec: OutputSpec[Any] | None,
                 native: Mapping[str, JsonValue] | None, retries: int,
                 steer: Callable[[Message], object], limits: Limits | None = None) -> None:
        assert spec is None or tracker is not None, "structured output belongs to a run"
        self.tracker = tracker
        self.spec = spec
        self.native = native
        self.retries = retries
        self._steer = steer
        self.failures = 0
        self.problems: list[str] = []
        self.limits = limits if limits is not None and limits.any else None
        self.turn_tokens = 0
        self.run_tokens = 0
        self.tool_calls = 0
        self.refused_calls = 0
        self.output_tool: Tool | None = None
        if spec is not None and native is None:
            self.output_tool = Tool(spec.name, self._accept, "exclusive", spec.description,
                                    spec.schema)
        self._tool_specs: tuple[JsonValue, ...] = (
            (self.output_tool.spec(),) if self.output_tool is not None else ())

    # -- the request ------------------------------------------------------------------

    @property
    def tool_specs(self) -> tuple[JsonValue, ...]:
        return self._tool_specs

    def tool(self, name: str) -> Tool | None:
        tool = self.output_tool
        return tool if tool is not None and tool.name == name else None

    # -- the loop's points ----------------------------------------------------------------

    def turn_started(self) -> None:
        """A turn of the chain starts (its first, or a retry): per-turn counts restart."""
        self.turn_tokens = 0
        self.tool_calls = 0
        self.refused_calls = 0

    def add_usage(self, usage: object) -> None:
        """An assistant message's ``usage`` (RT24 counts its tokens)."""
        if self.limits is None or not isinstance(usage, FrozenDict):
            return
        total = 0
        for key in ("inputTokens", "outputTokens", "cacheReadTokens", "cacheWriteTokens"):
            value = usage.get(key)
            if type(value) is int and value > 0:
                total += value
        self.turn_tokens += total
        self.run_tokens += total

    def check_step(self, turn: int, step: int) -> None:
        """At ``{step}``: raise to end the turn (R9.1) when the re-asks are used up or a
        limit is reached (RT24)."""
        if self.failures > self.retries:
            raise OutputInvalidError(self._exhausted())
        limits = self.limits
        if limits is None:
            return
        if limits.steps is not None and step > limits.steps:
            raise LimitExceededError(f"step limit reached: {limits.steps} steps per turn",
                                     code="STEP_LIMIT")
        if self.refused_calls:
            raise LimitExceededError(
                f"tool call limit reached: {limits.tool_calls} calls per turn, "
                f"{self.refused_calls} more refused", code="TOOL_CALL_LIMIT")
        if limits.turn_tokens is not None and self.turn_tokens >= limits.turn_tokens:
            raise LimitExceededError(
                f"token limit reached: {self.turn_tokens} tokens used of "
                f"{limits.turn_tokens} per turn", code="TURN_TOKEN_LIMIT")
        if limits.run_tokens is not None and self.run_tokens >= limits.run_tokens:
            raise LimitExceededError(
                f"token limit reached: {self.run_tokens} tokens used of "
                f"{limits.run_tokens} per run", code="RUN_TOKEN_LIMIT")

    def refuse_call(self, name: str) -> dict[str, JsonValue] | None:
        """At a call's ``{tool-prepare}``: its final error result when it is one call more
        than the turn allows (RT24), else None (the call goes on)."""
        limits = self.limits
        if limits is None or limits.tool_calls is None or self.tool(name) is not None:
            return None
        self.tool_calls += 1
        if self.tool_calls <= limits.tool_calls:
            return None
        self.refused_calls += 1
        return _tool_limit_result(limits.tool_calls)

    @property
    def stops_turn(self) -> bool:
        """Whether ``{turn-stopping}`` has work for this run."""
        return self.spec is not None

    async def turn_stopping(self, context: TurnStopping) -> None:
        """A completed step would end the turn (R8.5): the answer is checked, and a failed
        one re-asked by steering, or, when the re-asks are used up, the turn fails."""
        spec, tracker = self.spec, self.tracker
        if spec is None or tracker is None or tracker.has_output:
            return
        text = tracker.last_text
        if self.native is not None:
            try:
                tracker.set_output(spec.validate_text(text or ""))
                return
            except ToolArgumentError as error:
                self._failed(str(error), context.turn,
                             f"Your answer does not match the required JSON Schema: {error}. "
                             "Answer again with only the corrected JSON value.")
            return
        self._failed(f"the model answered in text instead of calling {spec.name}",
                     context.turn,
                     f"Give your final answer by calling the `{spec.name}` tool with it as "
                     "its arguments; a plain text answer is not accepted.")

    def _failed(self, problem: str, turn: int, ask: str) -> None:
        self._count(problem)
        if self.failures > self.retries:
            raise OutputInvalidError(self._exhausted())
        prompt = self.tracker.prompt_id if self.tracker is not None else "run"
        self._steer(user_message(f"{prompt}-output-{self.failures}", ask, OUTPUT_SOURCE))

    def _count(self, problem: str) -> None:
        self.failures += 1
        self.problems.append(problem)
        if self.tracker is not None:
            self.tracker.output_error = self._exhausted()
            self.tracker.output_problems = tuple(self.problems)

    def _exhausted(self) -> str:
        attempts = "attempt" if self.failures == 1 else "attempts"
        asks = "re-ask" if self.retries == 1 else "re-asks"
        return (f"the structured output failed validation ({self.failures} {attempts}, "
                f"{self.retries} {asks} allowed): {self.problems[-1]}")

    async def _accept(self, call: ToolCall) -> ToolResult:
        """The final-answer tool (tool mode): the first valid answer is the output and
        ends the turn; an invalid one is an error result the model reads (a re-ask)."""
        spec, tracker = self.spec, self.tracker
        assert spec is not None and tracker is not None
        try:
            value = spec.validate_arguments(call.arguments)
        except ToolArgumentError as error:
            self._count(str(error))
            raise
        if not tracker.has_output:
            tracker.set_output(value)
        return ToolResult.from_json({"content": [{"type": "text", "text": "Final answer accepted."}],
                                     "concludesTurn": True})


def merge_options(config: Mapping[str, JsonValue], options: Mapping[str, JsonValue],
                  managed: dict[str, tuple[object, JsonValue]]) -> dict[str, JsonValue]:
    """*config* with what an earlier run added (recorded in *managed*) taken back out and
    *options* put in (a mapping option is merged into a mapping already there, so the
    caller's ``output_config.effort`` stays beside ``format``). *managed* is updated."""
    out = dict(config)
    for key, (before, added) in managed.items():
        if key in out and out[key] == added:
            if before is _ABSENT:
                del out[key]
            else:
                out[key] = before        # type: ignore[assignment]  # what was there
    managed.clear()
    for key, value in options.items():
        before = out.get(key, _ABSENT)
        merged: JsonValue = value
        if isinstance(before, Mapping) and isinstance(value, Mapping):
            merged = {**dict(before), **value}
        out[key] = merged
        managed[key] = (before, merged)
    return out
