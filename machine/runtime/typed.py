"""Typed tools and typed values, on pydantic (specs/runtime.md RT22, RT23).

``pip install 'turnstile-agent[typed]'``. A tool written as a typed function::

    @tool
    async def read_file(path: str, limit: int = 4000) -> str:
        \"\"\"Read a text file.

        Args:
            path: the file to read.
            limit: at most this many characters.
        \"\"\"

gets its parameters' JSON Schema from the signature, the type hints (``Annotated[...,
Field(...)]`` constraints included) and the docstring (Google, NumPy or Sphinx style);
its arguments are validated before the function runs, and invalid ones become an
error result that names each problem (`ToolArgumentError`), which the model reads. A
parameter annotated `ToolCall` receives the call (its id, signal, turn and step) and is
not part of the schema. The function may be synchronous (it then runs in a worker
thread) and may return a `ToolResult`, a string, or any value pydantic can serialize
(sent as JSON text).

`OutputSpec` does the same for a run's structured output (RT23): the JSON Schema of a
type (a pydantic model, a dataclass, a TypedDict, or any type, wrapped in an object) and
its validation. The core never imports this module.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import re
import typing
from collections.abc import Callable, Mapping
from typing import Any, Final, Generic, TypeVar

from machine.runtime.hooks import JsonValue
from machine.runtime.tools import Tool, ToolArgumentError, ToolCall, ToolMode, ToolOutput
from machine.vocabulary import ToolResult

try:
    import pydantic
    import pydantic_core
except ImportError as missing:                # pragma: no cover - the extra is not installed
    raise ImportError("typed tools and structured output need pydantic: "
                      "pip install 'turnstile-agent[typed]'") from missing

__all__ = ["OutputSpec", "ToolSignature", "parse_docstring", "problems_text", "typed_tool"]

T = TypeVar("T")

_SECTION: Final = re.compile(
    r"^(\s*)(Args|Arguments|Parameters|Params|Keyword Args|Keyword Arguments|Other Parameters|"
    r"Returns|Return|Yields|Raises|Examples?|Notes?|Attributes|See Also|Warnings?|"
    r"References|Todo)\s*:?\s*$")
_PARAM_SECTIONS: Final = frozenset({"Args", "Arguments", "Parameters", "Params", "Keyword Args",
                                    "Keyword Arguments", "Other Parameters"})
_NUMPY_RULE: Final = re.compile(r"^\s*-{3,}\s*$")
_GOOGLE_PARAM: Final = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_NUMPY_PARAM: Final = re.compile(r"^(\w+)\s*(?::.*)?$")
_SPHINX_PARAM: Final = re.compile(r"^:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")
_SPHINX_FIELD: Final = re.compile(r"^:\w+")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def parse_docstring(doc: str | None) -> tuple[str | None, dict[str, str]]:
    """The description and the per-parameter texts of a docstring in Google style
    (``Args:`` then indented ``name: text`` lines), NumPy style (``Parameters`` underlined
    with dashes, then ``name : type`` lines and indented text) or Sphinx style (``:param
    name: text``). The description is the text before the first section or field."""
    if not doc:
        return None, {}
    lines = inspect.cleandoc(doc).splitlines()
    summary: list[str] = []
    params: dict[str, str] = {}
    described = False                       # a section or field has begun
    index = 0
    while index < len(lines):
        line = lines[index]
        stripped = line.strip()
        header = _SECTION.match(line)
        if header is not None:
            described = True
            numpy = index + 1 < len(lines) and _NUMPY_RULE.match(lines[index + 1]) is not None
            index += 2 if numpy else 1
            body, index = _section(lines, index, _indent(line), numpy)
            if header.group(2) in _PARAM_SECTIONS:
                params.update(_entries(body, numpy))
            continue
        if _SPHINX_FIELD.match(stripped):
            described = True
            texts = [stripped]
            index += 1
            while index < len(lines) and lines[index].strip() and not _SPHINX_FIELD.match(
                    lines[index].strip()) and _indent(lines[index]) > 0:
                texts.append(lines[index].strip())
                index += 1
            match = _SPHINX_PARAM.match(" ".join(texts))
            if match is not None:
                params[match.group(1)] = match.group(2).strip()
            continue
        if not described:
            summary.append(line)
        index += 1
    text = "\n".join(summary).strip()
    return text or None, {key: value for key, value in params.items() if value}


def _section(lines: list[str], index: int, indent: int, numpy: bool) -> tuple[list[str], int]:
    """The lines of the section that starts at *index* (its header at *indent*), and where
    the next one starts: Google sections are indented under their header, NumPy sections
    run to the next underlined header."""
    body: list[str] = []
    while index < len(lines):
        line = lines[index]
        if line.strip():
            if numpy and index + 1 < len(lines) and _NUMPY_RULE.match(lines[index + 1]):
                break
            if not numpy and (_indent(line) <= indent or _SPHINX_FIELD.match(line.strip())):
                break
        body.append(line)
        index += 1
    return body, index


def _entries(body: list[str], numpy: bool) -> dict[str, str]:
    """``name: text`` (Google) or ``name : type`` + indented text (NumPy) entries, an entry's
    continuation lines being indented deeper than its name."""
    entries: dict[str, str] = {}
    base = min((_indent(line) for line in body if line.strip()), default=0)
    name: str | None = None
    for line in body:
        if not line.strip():
            continue
        if _indent(line) == base:
            match = (_NUMPY_PARAM if numpy else _GOOGLE_PARAM).match(line.strip())
            name = match.group(1) if match is not None else None
            if name is not None:
                entries[name] = "" if numpy or match is None else match.group(2).strip()
        elif name is not None:
            entries[name] = f"{entries[name]} {line.strip()}".strip()
    return entries


def _problem(error: Mapping[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ())) or "(the value)"
    message = str(error.get("msg", "invalid"))
    given = error.get("input", None)
    shown = "" if error.get("type") == "missing" else f" (got {_shown(given)})"
    return f"{where}: {message}{shown}"


def _shown(value: object) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def problems_text(error: pydantic.ValidationError) -> str:
    """A pydantic validation error as one line per problem: where, what, what was given."""
    return "; ".join(_problem(item) for item in error.errors(include_url=False))


def _clean(schema: JsonValue) -> JsonValue:
    """The schema without pydantic's generated titles (noise for a model)."""
    if isinstance(schema, dict):
        out: dict[str, JsonValue] = {}
        for key, value in schema.items():
            if key == "title" and isinstance(value, str):
                continue
            if key in ("properties", "$defs") and isinstance(value, dict):
                out[key] = {name: _clean(item) for name, item in value.items()}
            else:
                out[key] = _clean(value)
        return out
    if isinstance(schema, list):
        return [_clean(item) for item in schema]
    return schema


def _hints(function: Callable[..., object], owner: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(function, include_extras=True)
    except Exception as error:
        raise TypeError(f"{owner}: its type hints cannot be resolved ({error}); define the "
                        "types it names at module level") from error


def _is_call(annotation: object) -> bool:
    return annotation is ToolCall or (typing.get_origin(annotation) is typing.Annotated
                                      and typing.get_args(annotation)[0] is ToolCall)


class ToolSignature:
    """What a typed function takes: its JSON Schema and a validator of the model's
    arguments (see the module docstring)."""

    def __init__(self, function: Callable[..., object], name: str) -> None:
        owner = f"tool {name!r}"
        signature = inspect.signature(function)
        hints = _hints(function, owner)
        description, documented = parse_docstring(function.__doc__)
        self.description = description
        self.call_parameter: str | None = None
        self._positional: list[str] = []
        fields: dict[str, Any] = {}
        for parameter in signature.parameters.values():
            if parameter.kind in (inspect.Parameter.VAR_POSITIONAL,
                                  inspect.Parameter.VAR_KEYWORD):
                raise TypeError(f"{owner}: *{parameter.name} and **{parameter.name} cannot "
                                "be described to a model; name each parameter")
            annotation = hints.get(parameter.name, Any)
            if _is_call(annotation):
                if self.call_parameter is not None:
                    raise TypeError(f"{owner}: only one parameter can take the ToolCall")
                self.call_parameter = parameter.name
                continue
            if parameter.kind is inspect.Parameter.POSITIONAL_ONLY:
                self._positional.append(parameter.name)
            default = (... if parameter.default is inspect.Parameter.empty
                       else parameter.default)
            info = pydantic.Field(default=default, description=documented.get(parameter.name))
            fields[parameter.name] = (annotation, info)
        config = pydantic.ConfigDict(extra="forbid", arbitrary_types_allowed=False)
        try:
            self.model: type[pydantic.BaseModel] = pydantic.create_model(
                f"{name}_arguments", __config__=config, **fields)
            schema = self.model.model_json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as error:
            raise TypeError(f"{owner}: its parameters cannot be described as JSON Schema: "
                            f"{error}") from error
        cleaned = _clean(schema)
        assert isinstance(cleaned, dict)
        cleaned.setdefault("properties", {})
        self.schema: dict[str, JsonValue] = cleaned

    def validate(self, arguments: JsonValue) -> dict[str, object]:
        """The validated arguments by parameter name; `ToolArgumentError` naming every
        problem when they do not fit."""
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError("arguments", "must be a JSON object, not "
                                    f"{type(arguments).__name__} {_shown(arguments)}")
        try:
            values = self.model.model_validate(dict(arguments))
        except pydantic.ValidationError as error:
            raise ToolArgumentError("arguments", problems_text(error)) from None
        return {name: getattr(values, name) for name in type(values).model_fields}

    def call(self, function: Callable[..., T], call: ToolCall, values: dict[str, object]) -> T:
        positional = [values.pop(name) for name in self._positional]
        if self.call_parameter is not None:
            values[self.call_parameter] = call
        return function(*positional, **values)


def _output(value: object) -> ToolOutput:
    """A typed function's return value as a tool result: a `ToolResult` or a string as
    they are, anything else as JSON text."""
    if isinstance(value, (ToolResult, str)):
        return value
    try:
        text = pydantic_core.to_json(value).decode()
    except pydantic_core.PydanticSerializationError as error:
        raise TypeError(f"the tool returned a value that cannot be sent as JSON: {error}"
                        ) from None
    return text


def typed_tool(function: Callable[..., object], *, name: str | None = None,
               mode: ToolMode = "exclusive", description: str | None = None,
               **options: Any) -> Tool:
    """A `Tool` from a typed function (see the module docstring); *options* are the other
    `Tool` fields."""
    tool_name = name or function.__name__
    signature = ToolSignature(function, tool_name)
    is_async = inspect.iscoroutinefunction(function)

    async def run(call: ToolCall) -> ToolOutput:
        values = signature.validate(call.arguments)
        if is_async:
            result = await signature.call(function, call, values)   # type: ignore[misc]
        else:
            result = await asyncio.to_thread(signature.call, function, call, values)
            if inspect.isawaitable(result):
                result = await result
        return _output(result)

    run.__name__ = run.__qualname__ = tool_name
    run.__doc__ = function.__doc__
    return Tool(tool_name, run, mode,
                description if description is not None else signature.description,
                signature.schema, validate_arguments=signature.validate, **options)


class OutputSpec(Generic[T]):
    """The structured output of a run (RT23): the JSON Schema of *output_type* and its
    validation. A type whose schema is not an object (``int``, ``list[str]``, a union) is
    wrapped in ``{"result": ...}``, since both the final-answer tool's parameters and the
    providers' structured output formats are objects. *name* names the final-answer tool
    and the provider's format."""

    def __init__(self, output_type: type[T], *, name: str = "final_result",
                 description: str | None = None) -> None:
        if not re.fullmatch(r"[A-Za-z0-9_-]{1,64}", name):
            raise ValueError(f"output name {name!r}: 1 to 64 letters, digits, '_' or '-'")
        self.output_type = output_type
        self.name = name
        try:
            self.adapter: pydantic.TypeAdapter[T] = pydantic.TypeAdapter(output_type)
            raw = self.adapter.json_schema()
        except (pydantic.PydanticSchemaGenerationError, pydantic.PydanticUserError) as error:
            raise TypeError(f"output_type {output_type!r} cannot be described as JSON "
                            f"Schema: {error}") from error
        schema = _clean(raw)
        assert isinstance(schema, dict)
        self.wrapped = schema.get("type") != "object"
        if self.wrapped:
            defs = schema.pop("$defs", None)
            schema = {"type": "object", "properties": {"result": schema},
                      "required": ["result"], "additionalProperties": False}
            if defs is not None:
                schema["$defs"] = defs
        self.schema: dict[str, JsonValue] = schema
        doc = description
        if doc is None and (dataclasses.is_dataclass(output_type) or (
                isinstance(output_type, type) and issubclass(output_type, pydantic.BaseModel))):
            doc = parse_docstring(getattr(output_type, "__doc__", None))[0]
        self.description = doc or "The final answer, in the required structure."

    def validate_arguments(self, arguments: JsonValue) -> T:
        """The final-answer tool's arguments as the output; `ToolArgumentError` naming
        every problem."""
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError("arguments", "must be a JSON object, not "
                                    f"{type(arguments).__name__} {_shown(arguments)}")
        return self._validate(dict(arguments))

    def validate_text(self, text: str) -> T:
        """A provider's structured-output text as the output: JSON first, then the type."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as error:
            raise ToolArgumentError("output", f"is not JSON: {error.msg} at character "
                                    f"{error.pos} (got {_shown(text)})") from None
        if not isinstance(value, dict):
            raise ToolArgumentError("output", f"must be a JSON object, not {_shown(value)}")
        return self._validate(value)

    def _validate(self, value: dict[str, object]) -> T:
        try:
            if self.wrapped:
                if set(value) != {"result"}:
                    raise ToolArgumentError("output", "must be {\"result\": ...}, not "
                                            f"{_shown(value)}")
                return self.adapter.validate_python(value["result"])
            return self.adapter.validate_python(value)
        except pydantic.ValidationError as error:
            raise ToolArgumentError("output", problems_text(error)) from None
