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

import inspect
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, TypeVar, overload

from machine.errors import ValidationError
from machine.runtime.hooks import JsonValue
from machine.runtime.signal import Signal
from machine.vocabulary import ToolResult

__all__ = ["ApprovalPolicy", "Tool", "ToolArgumentError", "ToolCall", "ToolMode", "ToolOutput",
           "ToolRegistry", "tool"]

ToolMode: TypeAlias = Literal["exclusive", "parallel"]

T = TypeVar("T")
D = TypeVar("D")


class ToolArgumentError(ValidationError):
    """A tool's arguments are not what it needs (raised by `ToolCall.arg` and
    `ToolCall.params`). From a body it becomes an error result the model can read."""

    code = "INVALID_TOOL_ARGUMENTS"


class _Missing:
    __slots__ = ()


_MISSING: Final = _Missing()


def _type_name(kind: type) -> str:
    return {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
            list: "an array", dict: "an object"}.get(kind, f"a {kind.__name__}")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One planned call (reference §10.1): ``arguments`` is the parsed JSON value of the
    model's argument text (``{}`` for empty text, the raw string if it is not JSON), as plain
    lists and dicts.

    `arg` and `params` read it with types a type checker understands::

        path = call.arg("path", str)              # a str, or ToolArgumentError
        limit = call.arg("limit", int, 100)       # an int, 100 when absent
    """

    call_id: str
    name: str
    arguments: JsonValue
    turn: int
    step: int
    signal: Signal

    @property
    def params(self) -> Mapping[str, JsonValue]:
        """The arguments as a JSON object; `ToolArgumentError` if they are anything else."""
        arguments = self.arguments
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError("arguments", "must be a JSON object, not "
                                    f"{type(arguments).__name__} {arguments!r:.80}")
        return arguments

    @overload
    def arg(self, name: str, kind: type[T]) -> T: ...

    @overload
    def arg(self, name: str, kind: type[T], default: D) -> T | D: ...

    def arg(self, name: str, kind: type[T], default: object = _MISSING) -> object:
        """The argument *name*, checked to be of JSON type *kind* (``str``, ``int``,
        ``float``, ``bool``, ``list`` or ``dict``); *default* when it is absent (or null),
        else `ToolArgumentError` naming what is wrong. ``float`` accepts integers too
        (returned as floats); ``int`` and ``float`` refuse booleans."""
        value = self.params.get(name)
        if value is None:
            if default is not _MISSING:
                return default
            raise ToolArgumentError(f"arguments.{name}", "is required")
        if kind is float and type(value) is int:
            return float(value)
        if isinstance(value, kind) and not (isinstance(value, bool) and kind in (int, float)):
            return value
        raise ToolArgumentError(f"arguments.{name}", f"must be {_type_name(kind)}, not "
                                f"{type(value).__name__} {value!r:.80}")


class _Verbatim:
    """A stage result passed to the core exactly as given (used by script replay)."""

    __slots__ = ("value",)

    def __init__(self, value: JsonValue) -> None:
        self.value = value


ToolOutput: TypeAlias = "ToolResult | str | Mapping[str, JsonValue] | _Verbatim"
#: Whether one call needs the application's approval (RT25).
ApprovalPolicy: TypeAlias = "Callable[[ToolCall], bool]"
Body: TypeAlias = Callable[[ToolCall], Awaitable[ToolOutput]]
Prepare: TypeAlias = Callable[[ToolCall], Awaitable["ToolOutput | None"]]
Finalize: TypeAlias = Callable[[ToolCall, ToolResult], Awaitable[ToolOutput]]


@dataclass(frozen=True, slots=True)
class Tool:
    """A tool the model can call (see the module docstring).

    ``validate_arguments`` (typed tools, RT22) checks a call's arguments without running
    anything: it raises `ToolArgumentError` naming what is wrong. ``requires_approval``
    (RT25): each call is held until the application approves or denies it; a function of
    the call decides per call (called when the model's message arrives: keep it quick)."""

    name: str
    run: Body
    mode: ToolMode = "exclusive"
    description: str | None = None
    parameters: Mapping[str, JsonValue] | None = None
    prepare: Prepare | None = None
    finalize: Finalize | None = None
    validate_arguments: Callable[[JsonValue], object] | None = None
    requires_approval: bool | ApprovalPolicy = False

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


@overload
def tool(name: Callable[..., Awaitable[Any]] | Callable[..., Any], /) -> Tool: ...


@overload
def tool(name: str | None = None, /, *, mode: ToolMode = "exclusive",
         description: str | None = None, parameters: Mapping[str, JsonValue] | None = None,
         requires_approval: bool | ApprovalPolicy = False,
         ) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(name: str | Callable[..., Any] | None = None, /, *, mode: ToolMode = "exclusive",
         description: str | None = None, parameters: Mapping[str, JsonValue] | None = None,
         requires_approval: bool | ApprovalPolicy = False,
         ) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Decorator: make a `Tool` of a function (``@tool`` or ``@tool(...)``); the name and
    description default to the function's name and docstring.

    * A *typed* function (RT22: typed parameters, any return value) gets its parameters'
      JSON Schema from its signature and docstring and its arguments validated before it
      runs; it needs the ``[typed]`` extra (pydantic).
    * A body of one `ToolCall` (its one parameter annotated ``ToolCall``, or an
      unannotated one named ``call``), or any function given *parameters*, is used as it
      is: *parameters* is the hand-written JSON Schema, advertised, not enforced.

    *requires_approval* holds each call for the application's decision (RT25)."""

    def make(body: Callable[..., Any]) -> Tool:
        tool_name = name if isinstance(name, str) else body.__name__
        if parameters is None and takes_typed_arguments(body):
            from machine.runtime.typed import typed_tool  # the [typed] extra
            return typed_tool(body, name=tool_name, mode=mode, description=description,
                              requires_approval=requires_approval)
        doc = description if description is not None else (body.__doc__ or "").strip() or None
        return Tool(tool_name, body, mode, doc, parameters, requires_approval=requires_approval)
    if callable(name):
        return make(name)
    return make


def takes_typed_arguments(function: Callable[..., object]) -> bool:
    """Whether *function* is a typed tool (RT22) rather than a body of one `ToolCall`: a
    body has exactly one parameter, annotated ``ToolCall``, or unannotated and named
    ``call``."""
    parameters = list(inspect.signature(function).parameters.values())
    if len(parameters) != 1:
        return True
    annotation = parameters[0].annotation
    if annotation is inspect.Parameter.empty:
        return parameters[0].name != "call"
    if isinstance(annotation, str):          # `from __future__ import annotations`
        return annotation.rsplit(".", 1)[-1] != "ToolCall"
    return annotation is not ToolCall


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
        self._specs: tuple[JsonValue, ...] | None = None

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
        """The tool specs a request header advertises (a new list)."""
        return list(self.spec_tuple())

    def spec_tuple(self) -> tuple[JsonValue, ...]:
        """`specs` as a tuple computed once (the registry's tools never change)."""
        specs = self._specs
        if specs is None:
            specs = self._specs = tuple(item.spec() for item in self._tools.values())
        return specs


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


async def run_body(found: Tool, call: ToolCall) -> JsonValue:
    """Run the body of *found*. An `Exception` is reported to the core as the stage's raise,
    and the core turns it into the error result ``Error: <message>`` (R10.12), as the
    original's tool runner does; a `BaseException` that is not an `Exception` is the
    runtime's business (RT18)."""
    return result_json(await found.run(call))
