"""Record vectors from this implementation.

`RecordingCore` is an `AgentCore` that logs every input call (commands made
by a test script or by observers, completions made by a driver) and every
pulled output, in order, as vector steps. Run a scenario with the scripted
`machine.checking.scripted.Driver` over a `RecordingCore` and the recorded steps are
exactly what the driver saw, observer positions included (rule P2).

`record_draft` turns a *draft* (a vector whose outputs are left out and
replaced by ``{"pull": N}`` / ``{"pull": "all"}`` directives, see
specs/conformance/README.md) into a vector by running it here: this is
``turnstile record``.
"""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from machine.cli.terminal import read_text, shown
from machine.conformance import jsoncmp
from machine.conformance.jsonpos import line_of
from machine.conformance.subjects import fake_clock, raise_kind
from machine.conformance.vectors import (
    COMPLETIONS,
    ID_PATTERN,
    RULE_PATTERN,
    TAG_PATTERN,
    TOP_FIELDS,
    MalformedError,
    Step,
    Vector,
    _input_step,
    _Problem,
    _require,
    _string_list,
    config_from_json,
    decode_json,
    seed_events,
)
from machine.conformance.wording import loose_fields
from machine.core import AgentCore, CoreConfig
from machine.errors import TurnstileError, ValidationError
from machine.events import Event
from machine.io import Durable, Input, Output, input_from_json
from machine.jsonvalue import FrozenDict, FrozenList, JsonLike, thaw
from machine.log import SessionLog

__all__ = ["RecordingCore", "RecordingError", "config_to_json", "plain", "record_draft"]

T = TypeVar("T")


class RecordingError(Exception):
    """An input that has no JSON form (a vector cannot carry it)."""


def plain(value: Any) -> Any:
    """A detached plain-JSON copy of an argument (messages, options, frozen values...)."""
    if isinstance(value, (FrozenDict, FrozenList)):
        return thaw(value)
    if hasattr(value, "to_json") and not isinstance(value, (dict, list, str)):
        return plain(value.to_json())
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordingError(f"{value!r} has no JSON form")
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise RecordingError(f"a {type(value).__name__} has no JSON form")


def config_to_json(config: CoreConfig) -> dict[str, Any]:
    """The JSON form of a configuration (rule P11); ``publish`` only when false."""
    out: dict[str, Any] = {
        "requestOptions": thaw(config.request_options),  # type: ignore[arg-type]
        "toolModes": dict(config.tool_modes),
        "maxParallelToolCalls": config.max_parallel_tool_calls,
        "sessionStart": config.session_start,
    }
    if not config.publish:
        out["publish"] = False
    return out


def output_json(output: Output) -> dict[str, Any]:
    return output.to_json(with_time=False) if isinstance(output, Durable) else output.to_json()


class RecordingCore(AgentCore):
    """An AgentCore that records its inputs and pulled outputs as vector steps."""

    def __init__(self, config: CoreConfig | None = None, *, log: SessionLog | None = None,
                 seed: Sequence[Event] = ()) -> None:
        self.steps: list[Step] = []
        #: called with "input" after each accepted input and "wait" when a pull returns None
        self.listeners: list[Callable[[str], None]] = []
        self._depth = 0
        self._waiting = False
        self.seed_json = [e.to_json(with_time=False) for e in seed]
        super().__init__(config, log=log if log is not None else SessionLog(seed, clock=fake_clock))

    # -- recording --------------------------------------------------------------
    def _input(self, value: dict[str, Any], call: Callable[[], T]) -> T:
        if self._depth:
            return call()
        checked = json.loads(json.dumps(value, allow_nan=False))  # detached, JSON only
        index = len(self.steps)
        self.steps.append(Step("in", checked))
        self._waiting = False
        self._depth += 1
        try:
            outcome = call()
        except TurnstileError as error:
            kind = raise_kind(error, completion=checked.get("in") in COMPLETIONS)
            if kind is not None:
                self.steps[index] = Step("in", checked, raises=kind)
            raise
        finally:
            self._depth -= 1
        for listener in self.listeners:
            listener("input")
        return outcome

    def next_output(self) -> Output | None:
        output = super().next_output()
        if output is None:
            if not self._waiting:
                self.steps.append(Step("out", {"out": "none"}))
                self._waiting = True
            for listener in self.listeners:
                listener("wait")
            return None
        value = output_json(output)
        self.steps.append(Step("out", value, loose=loose_fields(value)))
        self._waiting = False
        return output

    # -- commands -----------------------------------------------------------------
    def send(self, message: JsonLike, options: JsonLike) -> None:
        value = {"in": "send", "message": plain(message), "options": plain(options)}
        self._input(value, lambda: super(RecordingCore, self).send(message, options))

    def followup(self, message: JsonLike) -> None:
        self._input({"in": "followup", "message": plain(message)},
                    lambda: super(RecordingCore, self).followup(message))

    def steer(self, message: JsonLike) -> None:
        self._input({"in": "steer", "message": plain(message)},
                    lambda: super(RecordingCore, self).steer(message))

    def inject(self, message: JsonLike) -> None:
        self._input({"in": "inject", "message": plain(message)},
                    lambda: super(RecordingCore, self).inject(message))

    def cancel(self, cause: JsonLike, keep_inbox: bool = False) -> None:
        value: dict[str, Any] = {"in": "cancel", "cause": plain(cause)}
        if keep_inbox is not False:
            value["keepInbox"] = plain(keep_inbox)
        self._input(value, lambda: super(RecordingCore, self).cancel(cause, keep_inbox))

    def dispose(self) -> None:
        self._input({"in": "dispose"}, lambda: super(RecordingCore, self).dispose())

    def append(self, type: str, data: JsonLike, *, surface_op: JsonLike = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
        value: dict[str, Any] = {"in": "append", "type": type, "data": plain(data)}
        if surface_op is not None:
            value["surfaceOp"] = plain(surface_op)
        if source_event_seqs is not None:
            value["sourceEventSeqs"] = list(source_event_seqs)
        if ignorable is not False:
            value["ignorable"] = plain(ignorable)
        return self._input(value, lambda: super(RecordingCore, self).append(
            type, data, surface_op=surface_op, source_event_seqs=source_event_seqs,
            ignorable=ignorable))

    # -- completions ----------------------------------------------------------------
    def resolve(self, effect: int, value: JsonLike = None) -> None:
        self._input({"in": "resolve", "effect": effect, "value": plain(value)},
                    lambda: super(RecordingCore, self).resolve(effect, value))

    def fail(self, effect: int, error: Any) -> None:
        self._input({"in": "raise", "effect": effect, "error": plain(error)},
                    lambda: super(RecordingCore, self).fail(effect, error))

    def chunk(self, effect: int, chunk: JsonLike) -> None:
        self._input({"in": "chunk", "effect": effect, "chunk": plain(chunk)},
                    lambda: super(RecordingCore, self).chunk(effect, chunk))

    def end(self, effect: int) -> None:
        self._input({"in": "end", "effect": effect}, lambda: super(RecordingCore, self).end(effect))

    def feed(self, item: Input) -> None:
        self._input(item.to_json(), lambda: super(RecordingCore, self).feed(item))

    def feed_json(self, value: dict[str, Any]) -> None:
        """Decode and apply one P9 input, recording it as given (refusals included)."""
        def apply() -> None:
            super(RecordingCore, self).feed(input_from_json(value))
        self._input(value, apply)

    # -- result ---------------------------------------------------------------------
    def pull_all(self) -> None:
        while self.next_output() is not None:
            pass

    def vector(self, id: str, title: str, rules: Sequence[str], tags: Sequence[str]) -> Vector:
        """The recorded vector (pulls whatever is still available first)."""
        self.pull_all()
        return Vector(id, title, tuple(rules), tuple(tags), config_to_json(self.config),
                      tuple(self.steps), tuple(self.seed_json))


# --------------------------------------------------------------------------
# Drafts (turnstile record)
# --------------------------------------------------------------------------


def _pull_count(value: Any, path: jsoncmp.Path) -> int | None:
    _require(value == "all" or (type(value) is int and value >= 1), path,
             'must be a positive number of outputs or "all"')
    return None if value == "all" else int(value)


def record_draft(path: str | Path) -> Vector:
    """Run a draft here (``-``: read from standard input) and return the recorded vector
    (MalformedError for a bad draft)."""
    name = shown(path)
    try:
        text = read_text(path)
    except OSError as error:
        raise MalformedError(name, None, "", f"cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise MalformedError(name, None, "", f"not UTF-8 text ({error.reason})") from None
    try:
        value = decode_json(text)
    except json.JSONDecodeError as error:
        raise MalformedError(name, error.lineno, "", f"invalid JSON: {error.msg} "
                                                     f"(column {error.colno})") from None
    except ValueError as error:
        raise MalformedError(name, None, "", f"invalid JSON: {error}") from None
    try:
        return _record(value)
    except _Problem as problem:
        raise MalformedError(name, line_of(text, problem.path), jsoncmp.pointer(problem.path),
                             problem.problem) from None
    except RecursionError:   # a value nested deeper than any walk of it can go
        raise MalformedError(name, None, "", "a value is nested too deeply") from None


def _record(value: Any) -> Vector:
    _require(isinstance(value, dict), (), "a draft must be a JSON object")
    for key in value:
        _require(key in TOP_FIELDS, (key,), f"unknown field; a draft has {', '.join(TOP_FIELDS)}")
    vector_id = value.get("id", "draft")
    _require(isinstance(vector_id, str) and ID_PATTERN.match(vector_id) is not None, ("id",),
             "must be a string of letters, digits, '.', '_' and '-'")
    title = value.get("title", vector_id)
    _require(isinstance(title, str) and title.strip() != "", ("title",), "must be a non-empty string")
    rules = _string_list(value.get("rules", ["P1"]), ("rules",), RULE_PATTERN, "rule ids",
                         nonempty=True)
    tags = _string_list(value.get("tags", []), ("tags",), TAG_PATTERN, "tags", nonempty=False)
    config_value = value.get("config", {})
    _require(isinstance(config_value, dict), ("config",), "must be an object (rule P11)")
    try:
        config = config_from_json(config_value)
    except ValidationError as error:
        raise _Problem(("config", *error.path.split(".")), error.problem) from None
    seed_value = value.get("seed", [])
    _require(isinstance(seed_value, list) and all(isinstance(e, dict) for e in seed_value),
             ("seed",), "must be an array of session events")
    try:
        seed = seed_events(seed_value)
        core = RecordingCore(config, seed=seed)
    except (ValidationError, TurnstileError) as error:
        raise _Problem(("seed",), str(error)) from None
    steps = value.get("steps", [])
    _require(isinstance(steps, list), ("steps",), "must be an array of steps")
    for index, raw in enumerate(steps):
        where = ("steps", index)
        _require(isinstance(raw, dict), where, 'a draft step is {"in": ...}, {"out": ...} or '
                                               '{"pull": N | "all"}')
        if "pull" in raw:
            _require(set(raw) <= {"pull", "note"}, where, 'a pull step has only "pull" (and "note")')
            count = _pull_count(raw["pull"], (*where, "pull"))
            pulled = 0
            while count is None or pulled < count:
                if core.next_output() is None:
                    break
                pulled += 1
        elif "out" in raw:
            core.next_output()   # an output step of an existing vector: pull it again
        else:
            _require("in" in raw, where, 'a draft step is {"in": ...}, {"out": ...} or {"pull": ...}')
            step = _input_step(raw, where, raw.get("note"))
            with contextlib.suppress(TurnstileError):   # a refusal is recorded
                core.feed_json(step.value)
    vector = core.vector(vector_id, title, rules, tags)
    return Vector(vector.id, vector.title, vector.rules, vector.tags, config_value or
                  vector.config, vector.steps, vector.seed)
