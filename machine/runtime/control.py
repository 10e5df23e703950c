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
from typing import TYPE_CHECKING, Any, Final

from machine.errors import TurnstileError
from machine.runtime.hooks import JsonValue, TurnStopping
from machine.runtime.tools import Tool, ToolArgumentError, ToolCall
from machine.vocabulary import Message, ToolResult, user_message

if TYPE_CHECKING:
    from machine.runtime.run import _RunTracker
    from machine.runtime.typed import OutputSpec

__all__ = ["OUTPUT_SOURCE", "OutputInvalidError", "RunControl"]

#: The source of the runtime's re-ask messages (RT23): steering, labelled as context.
OUTPUT_SOURCE: Final = {"kind": "plugin", "plugin": "output"}
_ABSENT: Final = object()


class OutputInvalidError(TurnstileError):
    """The structured output failed validation once more than the run allows (RT23): the
    turn ends ``{kind:'error', code:'OUTPUT_INVALID'}``."""

    code = "OUTPUT_INVALID"


class RunControl:
    """What one chain's turns get from its run (see the module docstring). *spec* is the
    output type's description, *native* the adapter's options for it (None: the
    final-answer tool), *retries* how many failed answers are re-asked, *steer* the
    agent's ``steer``."""

    def __init__(self, tracker: _RunTracker[Any], spec: OutputSpec[Any] | None,
                 native: Mapping[str, JsonValue] | None, retries: int,
                 steer: Callable[[Message], object]) -> None:
        self.tracker = tracker
        self.spec = spec
        self.native = native
        self.retries = retries
        self._steer = steer
        self.failures = 0
        self.problems: list[str] = []
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

    def check_step(self, turn: int, step: int) -> None:
        """At ``{step}``: raise to end the turn (R9.1) when the re-asks are used up."""
        if self.failures > self.retries:
            raise OutputInvalidError(self._exhausted())

    @property
    def stops_turn(self) -> bool:
        """Whether ``{turn-stopping}`` has work for this run."""
        return self.spec is not None

    async def turn_stopping(self, context: TurnStopping) -> None:
        """A completed step would end the turn (R8.5): the answer is checked, and a failed
        one re-asked by steering, or, when the re-asks are used up, the turn fails."""
        spec = self.spec
        if spec is None or self.tracker.has_output:
            return
        text = self.tracker.last_text
        if self.native is not None:
            try:
                self.tracker.set_output(spec.validate_text(text or ""))
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
        self._steer(user_message(f"{self.tracker.prompt_id}-output-{self.failures}", ask,
                                 OUTPUT_SOURCE))

    def _count(self, problem: str) -> None:
        self.failures += 1
        self.problems.append(problem)
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
        spec = self.spec
        assert spec is not None
        try:
            value = spec.validate_arguments(call.arguments)
        except ToolArgumentError as error:
            self._count(str(error))
            raise
        if not self.tracker.has_output:
            self.tracker.set_output(value)
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
