"""Run a JSON script of inputs through the core: ``turnstile run SCRIPT.json`` (specs/scripts.md).

A script is data: a configuration and a list of inputs in their JSON forms
(specs/protocol.md P9). Each input may say *where* it is applied, as an
observer position (P2):

* ``"when": PATTERN`` - pull outputs until one whose JSON contains the
  pattern (`matches`) has been pulled, then apply the input;
* ``"when": {"pulled": N, "drained"?: true}`` - pull until N outputs have been
  pulled in all (with ``drained``, then pull once more, which must find nothing:
  that pull lets the core consume buffered completions, P6), then apply it; this
  is an exact position, as recorded runs use;
* ``"when": "here"`` - apply it at the current position, pulling nothing
  (several inputs issued by one observer);
* no ``"when"`` - pull every available output first, then apply it.

A completion names its effect by integer id or by a *selector*, an object
matched against the JSON of the effects pulled so far and still outstanding:
the oldest match wins (``{"kind": "model"}`` = the oldest outstanding model
effect). After the last input every remaining output is pulled.

`load_script` and `parse_script` check a script's structure up front and raise
`ScriptError` naming the JSON path; `run_script` yields every output (and, on
request, every applied input) as a JSON value, and raises `ScriptError` when a
pattern is never matched, a selector matches nothing, or the core refuses an
input. The core runs on a fake clock (0, 1, 2, ...), so a run is
deterministic.
"""

from __future__ import annotations

import itertools
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, TypeAlias

from machine.core import AgentCore, CoreConfig
from machine.errors import CodecError, TurnstileError, ValidationError
from machine.io import EFFECT_KINDS, Effect, Input, Output, input_from_json
from machine.jsonvalue import JsonLike

__all__ = ["HERE", "SCRIPT_VERSION", "Script", "ScriptError", "ScriptInput", "load_script",
           "matches", "parse_script", "run_script"]

SCRIPT_VERSION: Final = 1
HERE: Final = "here"
OUTPUT_KINDS: Final = ("event", "live", "effect", "abort", "release")
COMPLETIONS: Final = frozenset({"resolve", "raise", "chunk", "end"})
#: JSON name -> CoreConfig field (rule P11)
CONFIG_FIELDS: Final = {"requestOptions": "request_options", "toolModes": "tool_modes",
                        "maxParallelToolCalls": "max_parallel_tool_calls",
                        "sessionStart": "session_start", "publish": "publish"}
TOP_LEVEL: Final = ("version", "description", "config", "inputs")

Pattern: TypeAlias = Mapping[str, Any]


class ScriptError(TurnstileError):
    """A script that cannot be run: malformed, or refused while running. Names the JSON path."""

    code = "INVALID_SCRIPT"

    def __init__(self, path: str, problem: str, *, code: str | None = None) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem, code=code)


@dataclass(frozen=True, slots=True)
class ScriptInput:
    """One entry of ``inputs``: the input's JSON (without ``when``/``note``) and where to apply it."""

    path: str
    value: Mapping[str, Any]
    when: Pattern | Literal["here"] | None = None
    selector: Pattern | None = None


@dataclass(frozen=True, slots=True)
class Script:
    config: CoreConfig
    inputs: tuple[ScriptInput, ...]
    description: str | None = None


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


def load_script(path: str | Path) -> Script:
    """Read and check a script file (``-`` reads standard input). Errors name the JSON path;
    the caller names the file."""
    try:
        text = sys.stdin.read() if str(path) == "-" else Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ScriptError("", "no such file") from None
    except IsADirectoryError:
        raise ScriptError("", "is a directory, not a script") from None
    except UnicodeDecodeError as error:
        raise ScriptError("", f"not UTF-8 text ({error.reason} at byte {error.start})") from None
    except OSError as error:
        raise ScriptError("", f"cannot read: {error.strerror or error}") from None
    return parse_script(text)


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in an object")
        out[key] = value
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def parse_script(text: str) -> Script:
    """Decode and check a script's structure (input *contents* are checked by the core)."""
    try:
        value = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise ScriptError("", f"invalid JSON: {error.msg} (line {error.lineno}, column {error.colno})"
                          ) from None
    except RecursionError:
        raise ScriptError("", "invalid JSON: nested too deeply") from None
    except ValueError as error:
        raise ScriptError("", f"invalid JSON: {error}") from None
    if not isinstance(value, dict):
        raise ScriptError("$", "a script is an object {version, config?, inputs, description?}")
    extra = sorted(set(value) - set(TOP_LEVEL))
    if extra:
        raise ScriptError("$", f"unexpected field(s) {extra}; a script has {list(TOP_LEVEL)}")
    if "version" not in value:
        raise ScriptError("version", f"is required (the script format version, {SCRIPT_VERSION})")
    if value["version"] != SCRIPT_VERSION or type(value["version"]) is not int:
        raise ScriptError("version", f"unsupported version {value['version']!r}; expected {SCRIPT_VERSION}")
    description = value.get("description")
    if description is not None and not isinstance(description, str):
        raise ScriptError("description", "must be a string")
    if "inputs" not in value:
        raise ScriptError("inputs", "is required (a list of inputs)")
    if not isinstance(value["inputs"], list):
        raise ScriptError("inputs", "must be a list of inputs")
    config = _config(value.get("config", {}))
    inputs = tuple(_script_input(entry, f"inputs[{n}]") for n, entry in enumerate(value["inputs"]))
    return Script(config, inputs, description)


def _config(value: Any) -> CoreConfig:
    if not isinstance(value, dict):
        raise ScriptError("config", f"must be an object with fields {list(CONFIG_FIELDS)}")
    extra = sorted(set(value) - set(CONFIG_FIELDS))
    if extra:
        raise ScriptError("config", f"unexpected field(s) {extra}; allowed: {list(CONFIG_FIELDS)}")
    try:
        return CoreConfig(**{CONFIG_FIELDS[key]: item for key, item in value.items()})
    except ValidationError as error:
        path = error.path
        for json_name, field_name in CONFIG_FIELDS.items():
            path = path.replace(f"config.{field_name}", f"config.{json_name}")
        raise ScriptError(path, error.problem) from None


def _script_input(entry: Any, path: str) -> ScriptInput:
    if not isinstance(entry, dict) or not isinstance(entry.get("in"), str):
        raise ScriptError(path, "must be an input object with a string 'in' (specs/protocol.md P9)")
    when: Pattern | Literal["here"] | None = None
    if "when" in entry:
        when = _when(entry["when"], f"{path}.when")
    if "note" in entry and not isinstance(entry["note"], str):
        raise ScriptError(f"{path}.note", "must be a string")
    body = {key: item for key, item in entry.items() if key not in ("when", "note")}
    selector: Pattern | None = None
    if entry["in"] in COMPLETIONS and isinstance(body.get("effect"), dict):
        selector = _selector(body["effect"], f"{path}.effect")
        body["effect"] = 0          # a placeholder, to check the rest of the input now
    try:
        input_from_json(body, path)
    except CodecError as error:
        raise ScriptError(error.path, error.problem) from None
    if selector is not None:
        del body["effect"]
    return ScriptInput(path, body, when, selector)


def _when(value: Any, path: str) -> Pattern | Literal["here"]:
    if value == HERE:
        return HERE
    if not isinstance(value, dict):
        raise ScriptError(path, f"must be an output pattern (an object) or {HERE!r}")
    if "pulled" in value:
        count = value["pulled"]
        if (not set(value) <= {"pulled", "drained"} or type(count) is not int or count < 0
                or value.get("drained", False) not in (True, False)):
            raise ScriptError(path, "a position is {\"pulled\": N, \"drained\"?: bool} with N a "
                                    "non-negative integer")
        return value
    out = value.get("out")
    if "out" in value and out not in OUTPUT_KINDS:
        raise ScriptError(f"{path}.out",
                          f"{out!r} is not an output kind; expected one of {list(OUTPUT_KINDS)}")
    return value


def _selector(value: dict[str, Any], path: str) -> Pattern:
    if not value:
        raise ScriptError(path, "an effect selector needs at least one field, e.g. {\"kind\": \"model\"}")
    for key in ("out", "effect"):
        if key in value:
            raise ScriptError(f"{path}.{key}", "is not a selector field; to name one effect, "
                                               "give its integer id as 'effect'")
    kind = value.get("kind")
    if "kind" in value and kind not in EFFECT_KINDS:
        raise ScriptError(f"{path}.kind", f"{kind!r} is not an effect kind; expected one of "
                                          f"{sorted(EFFECT_KINDS)}")
    return value


# --------------------------------------------------------------------------
# Matching
# --------------------------------------------------------------------------


def matches(pattern: Any, value: Any) -> bool:
    """Subset match of JSON values.

    An object pattern matches an object that has every key of the pattern with
    a matching value (other keys are ignored); a list matches a list of the
    same length element by element; scalars match equal scalars of the same
    JSON type (``true`` never matches ``1``; ``1`` matches ``1.0``).
    """
    if isinstance(pattern, dict):
        return isinstance(value, dict) and all(
            key in value and matches(item, value[key]) for key, item in pattern.items())
    if isinstance(pattern, list):
        return (isinstance(value, list) and len(pattern) == len(value)
                and all(matches(p, v) for p, v in zip(pattern, value, strict=True)))
    if isinstance(pattern, bool) or isinstance(value, bool):
        return pattern is value
    if isinstance(pattern, (int, float)) and isinstance(value, (int, float)):
        return pattern == value
    return type(pattern) is type(value) and bool(pattern == value)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# --------------------------------------------------------------------------
# Running
# --------------------------------------------------------------------------


def run_script(script: Script, *, echo_inputs: bool = False) -> Iterator[dict[str, JsonLike]]:
    """Run *script*; yield each output's JSON (and each applied input's, with *echo_inputs*).

    Raises `ScriptError` (after yielding everything pulled before the problem)
    when a ``when`` pattern is never matched, an effect selector matches no
    outstanding effect, or the core refuses an input.
    """
    clock = itertools.count()
    core = AgentCore(script.config, clock=lambda: next(clock))
    effects: dict[int, dict[str, JsonLike]] = {}     # every effect pulled so far, by id
    pulled = 0

    def pull() -> dict[str, JsonLike] | None:
        nonlocal pulled
        try:
            output: Output | None = core.next_output()
        except TurnstileError as error:   # the core broke its own rules: a bug, reported plainly
            raise ScriptError("", f"internal error after output {pulled}: {type(error).__name__}: "
                                  f"{error}", code=error.code) from None
        if output is None:
            return None
        pulled += 1
        value = output.to_json()
        if isinstance(output, Effect):
            effects[output.id] = value
        return value

    def outstanding() -> str:
        live = [f"{e} ({effects[e]['kind']})" for e in core.outstanding_effects if e in effects]
        return ", ".join(live) if live else "none"

    for item in script.inputs:
        if item.when is None:
            while (value := pull()) is not None:
                yield value
        elif item.when != HERE and "pulled" in item.when:
            target = item.when["pulled"]
            if target < pulled:
                raise ScriptError(f"{item.path}.when", f"position {target} is behind the current "
                                  f"one ({pulled} outputs already pulled)", code="WHEN_NEVER_MATCHED")
            while pulled < target:
                value = pull()
                if value is None:
                    raise ScriptError(f"{item.path}.when", f"position {target} was never reached: "
                                      f"the core waits for input after output {pulled} "
                                      f"(outstanding effects: {outstanding()})",
                                      code="WHEN_NEVER_MATCHED")
                yield value
            if item.when.get("drained", False):
                value = pull()      # P6: a pull that finds nothing lets the core advance
                if value is not None:
                    raise ScriptError(f"{item.path}.when", f"position {target} is not drained: "
                                      f"output {pulled} is {_compact(value)}",
                                      code="WHEN_NEVER_MATCHED")
        elif item.when != HERE:
            while True:
                value = pull()
                if value is None:
                    raise ScriptError(f"{item.path}.when", f"the pattern {_compact(item.when)} never "
                                      f"matched: the core waits for input after output {pulled} "
                                      f"(outstanding effects: {outstanding()})",
                                      code="WHEN_NEVER_MATCHED")
                yield value
                if matches(item.when, value):
                    break
        applied = _resolve(item, core, effects, outstanding)
        if echo_inputs:
            yield applied.to_json()
        try:
            core.feed(applied)
        except TurnstileError as error:
            raise ScriptError(item.path, f"refused by the core ({type(error).__name__}): {error}",
                              code=error.code) from None
    while (value := pull()) is not None:
        yield value


def _resolve(item: ScriptInput, core: AgentCore, effects: Mapping[int, Mapping[str, JsonLike]],
             outstanding: Callable[[], str]) -> Input:
    """The input to apply now: a selector becomes the oldest matching outstanding effect's id."""
    value = dict(item.value)
    if item.selector is not None:
        selector = item.selector
        chosen = next((e for e in core.outstanding_effects
                       if e in effects and matches(selector, effects[e])), None)
        if chosen is None:
            raise ScriptError(f"{item.path}.effect", f"no outstanding effect matches {_compact(selector)} "
                              f"(outstanding effects: {outstanding()})", code="NO_SUCH_EFFECT")
        value["effect"] = chosen
    try:
        return input_from_json(value, item.path)
    except CodecError as error:  # pragma: no cover - checked when the script was loaded
        raise ScriptError(error.path, error.problem) from None
