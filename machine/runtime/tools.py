"""Tools for the asyncio runtime (reference §10; specs/runtime.md RT10).

A `Tool` has a name, a mode (``exclusive`` or ``parallel``: the core groups
parallel-safe calls into pools of at most ``max_parallel_tool_calls``), a
body (``run``) and two optional stages around it:

* ``prepare(call)`` runs before dispatch, one call at a time in start order;
  returning a result makes it the call's final result (the body and finalize
  are skipped); returning ``None`` dispatches the body;
* ``run(call)`` is the body; bodies of one pool overlap. An exception from any
  stage is reported to the core as a raise, and the core turns it into the
  error result ``Error: <message>`` (R10.12), as the original's tool runner
  does: the batch goes on and the model sees the failure;
* ``finalize(call, result)`` post-processes the body's result (default: as is).

A result is a `ToolResult`, a plain string (one text block) or the JSON form
``{content, isError?, error?, additionalContexts?, concludesTurn?, meta?}``.
Contexts are pushed to the outbox after the result and drained after every
result of the step; ``concludesTurn`` ends the turn after the step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal, TypeAlias

from machine.runtime.hooks import JsonValue
from machine.runtime.signal import Signal
from machine.vocabulary import ToolResult

__all__ = ["Tool", "ToolCall", "ToolMode", "ToolOutput", "ToolRegistry", "tool"]

ToolMode: TypeAlias = Literal["exclusive", "parallel"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One planned call (reference §10.1): ``arguments`` is the parsed JSON value of the
    model's argument text (``{}`` for empty text, the raw string if it is not JSON)."""

    call_id: str
    name: str
    arguments: JsonValue
    turn: int
    step: int
    signal: Signal


class _Verbatim:
    """A stage result passed to the core exactly as given (used by script replay)."""

    __slots__ = ("value",)

    def __init__(self, value: JsonValue) -> None:
        self.value = value


ToolOutput: TypeAlias = "ToolResult | str | Mapping[str, JsonValue] | _Verbatim"
Body: TypeAlias = Callable[[ToolCall], Awaitable[ToolOutput]]
Prepare: TypeAlias = Callable[[ToolCall], Awaitable["ToolOutput | None"]]
Finalize: TypeAlias = Callable[[ToolCall, ToolResult], Awaitable[ToolOutput]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model can call (see the module docstring)."""

    name: str
    run: Body
    mode: ToolMode = "exclusive"
    description: str | None = None
    parameters: Mapping[str, JsonValue] | None = None
    prepare: Prepare | None = None
    finalize: Finalize | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError("a tool needs a non-empty string name")
        if self.mode not in ("exclusive", "parallel"):
            raise ValueError(f"tool {self.name!r}: mode must be 'exclusive' or 'parallel'")

    def spec(self) -> dict[str, JsonValue]:
        """What the request header advertises: ``{name, description?, parameters?}``."""
        out: dict[str, JsonValue] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        if self.parameters is not None:
            out["parameters"] = self.parameters
        return out


def tool(name: str | None = None, *, mode: ToolMode = "exclusive", description: str | None = None,
         parameters: Mapping[str, JsonValue] | None = None) -> Callable[[Body], Tool]:
    """Decorator: make a `Tool` from an async body (name and description default to the
    function's name and docstring)."""

    def make(body: Body) -> Tool:
        doc = description if description is not None else (body.__doc__ or "").strip() or None
        return Tool(name or body.__name__, body, mode, doc, parameters)
    return make


class ToolRegistry:
    """The tools of one agent, by name. *fallback* (optional) runs calls of unknown names;
    without it such a call gets an error result from the prepare stage."""

    def __init__(self, tools: Iterable[Tool] = (), *, fallback: Tool | None = None) -> None:
        self._tools: dict[str, Tool] = {}
        for item in tools:
            if item.name in self._tools:
                raise ValueError(f"duplicate tool name {item.name!r}")
            self._tools[item.name] = item
        self.fallback = fallback

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self._tools.values())

    def __len__(self) -> int:
        return len(self._tools)

    def get(self, name: str) -> Tool | None:
        return self._tools.get(name, self.fallback)

    def modes(self) -> dict[str, ToolMode]:
        return {name: item.mode for name, item in self._tools.items()}

    def specs(self) -> list[JsonValue]:
        return [item.spec() for item in self._tools.values()]


# --------------------------------------------------------------------------
# Stage runners (used by the agent)
# --------------------------------------------------------------------------


def result_json(output: ToolOutput | None) -> JsonValue:
    """The JSON form of a stage's result (the core validates it, R10.9)."""
    if output is None:
        return None
    if isinstance(output, _Verbatim):
        return output.value
    if isinstance(output, ToolResult):
        return output.to_json()
    if isinstance(output, str):
        return {"content": [{"type": "text", "text": output}]}
    return output


def unknown_tool_result(name: str) -> dict[str, JsonValue]:
    return {"content": [{"type": "text", "text": f"Error: unknown tool {name!r}"}], "isError": True,
            "error": {"name": "UnknownToolError", "message": f"unknown tool {name!r}",
                      "code": "UNKNOWN_TOOL"}}


async def run_prepare(registry: ToolRegistry, call: ToolCall) -> JsonValue:
    found = registry.get(call.name)
    if found is None:
        return unknown_tool_result(call.name)
    if found.prepare is None:
        return None
    return result_json(await found.prepare(call))


async def run_body(registry: ToolRegistry, call: ToolCall) -> JsonValue:
    found = registry.get(call.name)
    if found is None:
        return unknown_tool_result(call.name)
    return result_json(await found.run(call))  # an exception is a raise: R10.12


async def run_finalize(registry: ToolRegistry, call: ToolCall, result: JsonValue) -> JsonValue:
    found = registry.get(call.name)
    if found is None or found.finalize is None:
        return result
    return result_json(await found.finalize(call, ToolResult.from_json(result)))

