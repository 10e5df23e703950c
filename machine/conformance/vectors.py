"""Conformance vectors: the model, the loader and the writer (specs/conformance/README.md).

A vector is one scenario as data: a configuration, an optional seeded log,
and a flat ordered list of *steps*. An input step ``{"in": ...}`` is applied
to the implementation (rule P9 JSON); an output step ``{"out": ...}`` is the
output the next pull must return (rule P1 JSON, durable events without
``time``), and ``{"out": "none"}`` says the pull must return nothing: the
implementation waits for an input. An input between two outputs is issued
at an observer position (rule P2).

`load_vector` checks a file completely before anything runs and raises
`MalformedError` naming the file, the line and the field (a JSON Pointer).
The checks here are the same as ``specs/conformance/vector.schema.json``,
plus the ones a schema cannot express (the configuration and the seeded log
are valid, loose pointers name existing fields, the id matches the file).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

from machine.cli.terminal import STDIN, read_text, shown
from machine.conformance import jsoncmp
from machine.conformance.jsonpos import line_of
from machine.core import CoreConfig
from machine.errors import InvariantError, ValidationError
from machine.events import Event
from machine.io import EFFECT_KINDS
from machine.log import SessionLog

__all__ = [
    "CONFIG_FIELDS", "INPUT_FIELDS", "OUTPUT_KINDS", "RAISE_KINDS", "VERSION", "MalformedError",
    "Step", "Vector", "config_from_json", "dump_vector", "find_vectors", "load_vector",
    "parse_vector", "seed_events", "vector_to_json",
]

VERSION: Final = 2
#: The fields of a vector's "original" (format 2): the step where the original departs, what it
#: does there and where in its code.
ORIGINAL_FIELDS: Final = frozenset({"step", "does", "where"})

#: Input kind -> (required fields, optional fields), besides ``in`` (rule P9).
INPUT_FIELDS: Final[dict[str, tuple[frozenset[str], frozenset[str]]]] = {
    "send": (frozenset({"message", "options"}), frozenset()),
    "followup": (frozenset({"message"}), frozenset()),
    "steer": (frozenset({"message"}), frozenset()),
    "inject": (frozenset({"message"}), frozenset()),
    "cancel": (frozenset({"cause"}), frozenset({"keepInbox"})),
    "dispose": (frozenset(), frozenset()),
    "append": (frozenset({"type", "data"}), frozenset({"surfaceOp", "sourceEventSeqs",
                                                        "ignorable"})),
    "observer": (frozenset({"action"}), frozenset()),
    "resolve": (frozenset({"effect"}), frozenset({"value"})),
    "raise": (frozenset({"effect", "error"}), frozenset()),
    "chunk": (frozenset({"effect", "chunk"}), frozenset()),
    "end": (frozenset({"effect"}), frozenset()),
}
COMPLETIONS: Final = frozenset({"resolve", "raise", "chunk", "end"})
#: How an input may be refused: ValidationError, ProtocolError, DisposedError, InvariantError.
RAISE_KINDS: Final = ("validation", "protocol", "disposed", "invariant")
OUTPUT_KINDS: Final = ("event", "live", "effect", "abort", "release", "none")
#: JSON name -> CoreConfig field (rule P11).
CONFIG_FIELDS: Final = {"requestOptions": "request_options", "toolModes": "tool_modes",
                        "maxParallelToolCalls": "max_parallel_tool_calls",
                        "sessionStart": "session_start", "publish": "publish"}
TOP_FIELDS: Final = ("version", "id", "title", "rules", "tags", "original", "config", "seed",
                     "steps")
REQUIRED_TOP: Final = frozenset({"version", "id", "title", "rules", "tags", "config", "steps"})
ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*\Z")
RULE_PATTERN: Final = re.compile(r"(R\d+(\.\d+)*|D[1-9]\d*|[PLVE]\d+)\Z")
TAG_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9:._-]*\Z")


class MalformedError(Exception):
    """A vector or trace that cannot be used: names the file, the line and the field."""

    def __init__(self, file: str, line: int | None, field: str, problem: str) -> None:
        self.file = file
        self.line = line
        self.field = field
        self.problem = problem
        where = file if line is None else f"{file}:{line}"
        super().__init__(f"{where}: {field + ': ' if field else ''}{problem}")


@dataclass(frozen=True, slots=True)
class Step:
    """One step: an input to apply or an output to expect.

    ``value`` is the input's P9 JSON or the output's P1 JSON (``{"out": "none"}``
    for "no output now"), without the step's own annotations.
    """

    kind: Literal["in", "out"]
    value: dict[str, Any]
    raises: str | None = None
    loose: Mapping[jsoncmp.Path, str] = field(default_factory=dict)
    note: str | None = None

    def to_json(self) -> dict[str, Any]:
        out = dict(self.value)
        if self.raises is not None:
            out["raises"] = self.raises
        if self.loose:
            out["loose"] = {jsoncmp.pointer(path): prefix for path, prefix in self.loose.items()}
        if self.note is not None:
            out["note"] = self.note
        return out


@dataclass(frozen=True, slots=True)
class Vector:
    id: str
    title: str
    rules: tuple[str, ...]
    tags: tuple[str, ...]
    config: dict[str, Any]
    steps: tuple[Step, ...]
    seed: tuple[dict[str, Any], ...] = ()
    path: str = "<memory>"
    #: 1-based line of each step in the file (0 when unknown)
    lines: tuple[int, ...] = ()
    #: for a vector tagged differs-from-original: the 1-based step at which the original
    #: implementation departs (informative; specs/differences.md)
    original_step: int | None = None
    #: ... and what the original does there, and where in its code (file:line at its commit)
    original_does: str | None = None
    original_where: str | None = None

    @property
    def requires(self) -> frozenset[str]:
        """Optional port capabilities this vector needs (PROTOCOL.md §Capabilities)."""
        needs: set[str] = set()
        if self.seed:
            needs.add("seed")
        if any(s.kind == "in" and s.value["in"] == "append" for s in self.steps):
            needs.add("append")
        if any(s.kind == "in" and s.value["in"] == "observer" for s in self.steps):
            needs.add("observer")
        # a seam the original lacks: the vector is tagged extension:<capability> (§Skipping)
        needs.update(t[len("extension:"):] for t in self.tags if t.startswith("extension:"))
        return frozenset(needs)

    def line(self, index: int) -> int:
        return self.lines[index] if index < len(self.lines) else 0


# --------------------------------------------------------------------------
# Configuration and seed
# --------------------------------------------------------------------------


def config_from_json(value: Mapping[str, Any]) -> CoreConfig:
    """The CoreConfig of a vector's ``config`` (raises ValidationError naming the JSON field)."""
    unknown = sorted(set(value) - set(CONFIG_FIELDS))
    if unknown:
        raise ValidationError(unknown[0], f"unknown configuration field; expected one of "
                                          f"{sorted(CONFIG_FIELDS)}")
    kwargs = {CONFIG_FIELDS[key]: item for key, item in value.items()}
    try:
        return CoreConfig(**kwargs)
    except ValidationError as error:
        names = {v: k for k, v in CONFIG_FIELDS.items()}
        head, _, rest = error.path.removeprefix("config.").partition(".")
        where = names.get(head, head) + (f".{rest}" if rest else "")
        raise ValidationError(where, error.problem) from None


def seed_events(seed: Iterable[Mapping[str, Any]]) -> list[Event]:
    """Events of a seeded log (``time`` defaults to 0: the clock is fake)."""
    return [Event.from_json({"time": 0, **event}, f"seed[{i}]") for i, event in enumerate(seed)]


# --------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------


class _Problem(Exception):
    def __init__(self, path: jsoncmp.Path, problem: str) -> None:
        super().__init__(problem)
        self.path = path
        self.problem = problem


def _object_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r} in an object")
        out[key] = value
    return out


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not JSON")


def decode_json(text: str) -> Any:
    """json.loads, refusing duplicate keys and NaN/Infinity (ValueError / JSONDecodeError);
    a document nested too deeply for the parser is a ValueError too ("nested too deeply")."""
    try:
        return json.loads(text, object_pairs_hook=_object_pairs, parse_constant=_no_constant)
    except RecursionError:
        raise ValueError("nested too deeply") from None


def load_vector(path: str | Path) -> Vector:
    """Read and check one vector file (``-``: standard input, whose vector may have any id);
    raises MalformedError (never anything else for bad data)."""
    name = shown(path)
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise MalformedError(name, None, "", "no such file") from None
    except IsADirectoryError:
        raise MalformedError(name, None, "", "is a directory, not a vector") from None
    except UnicodeDecodeError as error:
        raise MalformedError(name, None, "", f"not UTF-8 text ({error.reason} at byte "
                                             f"{error.start})") from None
    except OSError as error:
        raise MalformedError(name, None, "", f"cannot read: {error.strerror or error}") from None
    vector = parse_vector(text, name)
    stem = Path(path).stem
    if str(path) != STDIN and vector.id != stem:
        raise MalformedError(name, line_of(text, ("id",)), "/id",
                             f"the id {vector.id!r} does not match the file name {stem!r}.json")
    return vector


def parse_vector(text: str, name: str = "<vector>") -> Vector:
    """Decode and check a vector document; raises MalformedError with file, line and field."""
    try:
        value = decode_json(text)
    except json.JSONDecodeError as error:
        raise MalformedError(name, error.lineno, "", f"invalid JSON: {error.msg} "
                                                     f"(column {error.colno})") from None
    except (ValueError, RecursionError) as error:
        raise MalformedError(name, None, "", f"invalid JSON: {error}") from None
    try:
        return _vector(value, name, text)
    except _Problem as problem:
        raise MalformedError(name, line_of(text, problem.path), jsoncmp.pointer(problem.path),
                             problem.problem) from None


def _require(cond: bool, path: jsoncmp.Path, problem: str) -> None:
    if not cond:
        raise _Problem(path, problem)


def _string_list(value: Any, path: jsoncmp.Path, pattern: re.Pattern[str], what: str,
                 *, nonempty: bool) -> tuple[str, ...]:
    _require(isinstance(value, list), path, f"must be an array of {what}")
    _require(bool(value) or not nonempty, path, f"must list at least one {what[:-1]}")
    for index, item in enumerate(value):
        _require(isinstance(item, str) and pattern.match(item) is not None, (*path, index),
                 f"must be a {what[:-1]} matching {pattern.pattern.removesuffix(chr(92) + 'Z')}")
    _require(len(set(value)) == len(value), path, f"lists a {what[:-1]} twice")
    return tuple(value)


def _vector(value: Any, name: str, text: str) -> Vector:
    _require(isinstance(value, dict), (), "a vector must be a JSON object")
    for key in value:
        _require(key in TOP_FIELDS, (key,), f"unknown field; a vector has {', '.join(TOP_FIELDS)}")
    for key in sorted(REQUIRED_TOP):
        _require(key in value, (key,), "is missing")
    _require(value["version"] == VERSION and type(value["version"]) is int, ("version",),
             f"must be {VERSION}")
    _require(isinstance(value["id"], str) and ID_PATTERN.match(value["id"]) is not None, ("id",),
             "must be a string of letters, digits, '.', '_' and '-'")
    _require(isinstance(value["title"], str) and value["title"].strip() != "", ("title",),
             "must be a non-empty string")
    rules = _string_list(value["rules"], ("rules",), RULE_PATTERN, "rule ids", nonempty=True)
    tags = _string_list(value["tags"], ("tags",), TAG_PATTERN, "tags", nonempty=False)
    config = value["config"]
    _require(isinstance(config, dict), ("config",), "must be an object (rule P11)")
    try:
        config_from_json(config)
    except ValidationError as error:
        raise _Problem(("config", *error.path.split(".")), error.problem) from None
    seed = value.get("seed", [])
    _require(isinstance(seed, list), ("seed",), "must be an array of session events")
    for index, event in enumerate(seed):
        _require(isinstance(event, dict), ("seed", index), "must be a session event object")
    try:
        SessionLog(seed_events(seed))
    except ValidationError as error:
        head, _, rest = error.path.partition("]")
        where: jsoncmp.Path = ("seed",)
        if head.startswith("seed[") and head[5:].isdigit():
            where = ("seed", int(head[5:]), *[p for p in rest.strip(".").split(".") if p])
        raise _Problem(where, error.problem) from None
    except InvariantError as error:
        match = re.search(r"seq (\d+)", str(error))
        raise _Problem(("seed", int(match.group(1))) if match else ("seed",), str(error)) from None
    steps_value = value["steps"]
    _require(isinstance(steps_value, list) and bool(steps_value), ("steps",),
             "must be a non-empty array of steps")
    steps: list[Step] = []
    previous: Step | None = None
    for index, raw in enumerate(steps_value):
        step = _step(raw, ("steps", index))
        if previous is not None and previous.kind == "out" and previous.value["out"] == "none":
            _require(step.kind == "in", ("steps", index),
                     'an output cannot follow {"out": "none"} without an input in between')
        steps.append(step)
        previous = step
    lines = _step_lines(text, steps_value)
    original_step: int | None = None
    departs_does: str | None = None
    departs_where: str | None = None
    if "original" in value:
        original = value["original"]
        _require(isinstance(original, dict) and set(original) == ORIGINAL_FIELDS, ("original",),
                 'must be {"step": N, "does": TEXT, "where": TEXT}: where the original '
                 "implementation departs, what it does there and where in its code")
        step_number = original["step"]
        _require(type(step_number) is int and 1 <= step_number <= len(steps),
                 ("original", "step"), f"must be a step number from 1 to {len(steps)}")
        original_step = step_number
        for key in ("does", "where"):
            _require(isinstance(original[key], str) and original[key].strip() != "",
                     ("original", key), "must be a non-empty string")
        departs_does, departs_where = original["does"], original["where"]
    return Vector(value["id"], value["title"], rules, tags, config, tuple(steps),
                  tuple(seed), name, lines, original_step, departs_does, departs_where)


def _step_lines(text: str, raw_steps: list[Any]) -> tuple[int, ...]:
    """The line of each step: written vectors hold one step per line; otherwise scan."""
    count = len(raw_steps)
    start = line_of(text, ("steps", 0))
    lines = text.split("\n")
    if start + count - 1 <= len(lines):
        try:
            if all(decode_json(lines[start - 1 + i].strip().removesuffix(",")) == raw_steps[i]
                   for i in range(count)):
                return tuple(range(start, start + count))
        except ValueError:
            pass
    return tuple(line_of(text, ("steps", i)) for i in range(count))


def check_step(raw: Any) -> Step:
    """Decode one step; raises ValueError("FIELD: problem") for a malformed one."""
    try:
        return _step(raw, ())
    except _Problem as problem:
        raise ValueError(f"{jsoncmp.pointer(problem.path) or '/'}: {problem.problem}") from None


def _step(raw: Any, path: jsoncmp.Path) -> Step:
    _require(isinstance(raw, dict), path, 'a step must be an object {"in": ...} or {"out": ...}')
    has_in, has_out = "in" in raw, "out" in raw
    _require(has_in != has_out, path, 'a step has exactly one of "in" (an input) and "out" '
                                      '(an expected output)')
    note = raw.get("note")
    _require(note is None or isinstance(note, str), (*path, "note"), "must be a string")
    if has_in:
        return _input_step(raw, path, note)
    return _output_step(raw, path, note)


def _input_step(raw: dict[str, Any], path: jsoncmp.Path, note: str | None) -> Step:
    kind = raw["in"]
    _require(isinstance(kind, str) and kind in INPUT_FIELDS, (*path, "in"),
             f"unknown input {jsoncmp.render(kind, 40)}; expected one of {sorted(INPUT_FIELDS)}")
    required, optional = INPUT_FIELDS[kind]
    for key in raw:
        _require(key in required or key in optional or key in ("in", "raises", "note"),
                 (*path, key), f"unknown field for input {kind!r} (allowed: "
                               f"{', '.join(sorted(required | optional))})")
    for key in sorted(required):
        _require(key in raw, (*path, key), f"is missing (input {kind!r} needs it)")
    if kind in COMPLETIONS:
        effect = raw["effect"]
        _require(type(effect) is int and effect >= 0, (*path, "effect"),
                 "must be a non-negative integer effect id")
    if kind == "observer":
        _require(raw["action"] in ("throw", "veto"), (*path, "action"),
                 "must be 'throw' or 'veto' (P14)")
    raises = raw.get("raises")
    _require(raises is None or raises in RAISE_KINDS, (*path, "raises"),
             f"must be one of {', '.join(RAISE_KINDS)}")
    value = {k: v for k, v in raw.items() if k not in ("raises", "note")}
    return Step("in", value, raises, {}, note)


def _output_step(raw: dict[str, Any], path: jsoncmp.Path, note: str | None) -> Step:
    kind = raw["out"]
    _require(isinstance(kind, str) and kind in OUTPUT_KINDS, (*path, "out"),
             f"unknown output {jsoncmp.render(kind, 40)}; expected one of {list(OUTPUT_KINDS)}")
    _require("raises" not in raw, (*path, "raises"), "only an input step can raise")
    value = {k: v for k, v in raw.items() if k not in ("loose", "note")}
    fields = set(value) - {"out"}
    if kind == "event":
        for key in fields:
            _require(key in ("type", "seq", "data", "surfaceOp", "sourceEventSeqs", "ignorable"),
                     (*path, key), "unknown field for a durable event (time is omitted in vectors)")
        for key in ("type", "seq", "data"):
            _require(key in value, (*path, key), "is missing")
        _require(isinstance(value["type"], str) and value["type"] != "", (*path, "type"),
                 "must be a non-empty string")
        _require(type(value["seq"]) is int and value["seq"] >= 0, (*path, "seq"),
                 "must be a non-negative integer")
        _require(isinstance(value["data"], dict), (*path, "data"), "must be an object")
        seqs = value.get("sourceEventSeqs", [])
        _require(isinstance(seqs, list) and all(type(s) is int for s in seqs),
                 (*path, "sourceEventSeqs"), "must be an array of integers")
        _require(value.get("ignorable", True) is True, (*path, "ignorable"),
                 "must be true, or omitted (D16)")
    elif kind == "live":
        _require(isinstance(value.get("type"), str) and value.get("type") != "", (*path, "type"),
                 "a live notification needs a non-empty string type")
    elif kind == "effect":
        effect = value.get("effect")
        _require(type(effect) is int and effect >= 0, (*path, "effect"),
                 "must be a non-negative integer effect id")
        _require(value.get("kind") in EFFECT_KINDS, (*path, "kind"),
                 f"must be an effect kind (rule P4): {', '.join(sorted(EFFECT_KINDS))}")
    elif kind == "abort":
        for key in fields:
            _require(key in ("signal", "reason"), (*path, key), "unknown field for abort")
        _require(type(value.get("signal")) is int, (*path, "signal"), "must be an integer")
        _require(isinstance(value.get("reason"), dict), (*path, "reason"), "must be an object")
    elif kind == "release":
        for key in fields:
            _require(key == "effect", (*path, key), "unknown field for release")
        effect = value.get("effect")
        _require(type(effect) is int and effect >= 0, (*path, "effect"),
                 "must be a non-negative integer effect id")
    else:
        for key in fields:
            _require(False, (*path, key), 'an {"out": "none"} step has no other fields')
    loose: dict[jsoncmp.Path, str] = {}
    raw_loose = raw.get("loose", {})
    _require(isinstance(raw_loose, dict), (*path, "loose"),
             "must be an object mapping JSON Pointers to required prefixes")
    for text, prefix in raw_loose.items():
        _require(isinstance(prefix, str), (*path, "loose", text), "must be a string prefix")
        try:
            tokens = jsoncmp.parse_pointer(text)
        except ValueError as error:
            raise _Problem((*path, "loose", text), f"not a JSON Pointer: {error}") from None
        target = jsoncmp.resolve(value, tokens)
        _require(target is not None and len(target) > 0, (*path, "loose", text),
                 "names no field of this output")
        assert target is not None
        loose[target] = prefix
    return Step("out", value, None, loose, note)


#: Files of the kit that a directory search passes over: they describe the corpus.
NOT_VECTORS: Final = frozenset({"corpus.json"})


def find_vectors(paths: Sequence[str | Path]) -> Iterator[Path]:
    """Vector files under *paths*: files as given, directories searched for ``*.json``
    (``*.schema.json`` and ``corpus.json`` are skipped), sorted by path. A file reached
    twice (named twice, or also inside a named directory) is given once, where first seen."""
    seen: set[Path] = set()
    for path in paths:
        p = Path(path)
        if str(path) == STDIN:
            yield p
            continue
        found = sorted(f for f in p.rglob("*.json") if not f.name.endswith(".schema.json")
                       and f.name not in NOT_VECTORS) if p.is_dir() else [p]
        for file in found:
            key = file.resolve()
            if key not in seen:
                seen.add(key)
                yield file


#: What a port's verdict depends on (PROTOCOL.md §6: a change here is a MAJOR change of the
#: corpus); the other fields (title, rules, tags, original) describe the vector.
BEHAVIOUR_FIELDS: Final = ("version", "id", "config", "seed", "steps")


def corpus_fingerprint(paths: Sequence[str | Path]) -> dict[str, str]:
    """Two SHA-256 digests of the vectors under *paths*, in id order: ``behaviour`` over
    what a port's verdict depends on (`BEHAVIOUR_FIELDS`), ``description`` over the rest.
    ``corpus.json`` records them for its version, so a changed corpus cannot keep its
    version number unnoticed (PROTOCOL.md §6)."""
    import hashlib

    behaviour, description = hashlib.sha256(), hashlib.sha256()
    vectors = sorted((decode_json(path.read_text(encoding="utf-8"))
                      for path in find_vectors(paths)), key=lambda v: str(v.get("id")))
    for vector in vectors:
        for digest, keep in ((behaviour, True), (description, False)):
            part = {k: v for k, v in vector.items() if (k in BEHAVIOUR_FIELDS) == keep}
            digest.update(json.dumps(part, sort_keys=True, ensure_ascii=False,
                                     separators=(",", ":")).encode("utf-8") + b"\n")
    return {"behaviour": behaviour.hexdigest(), "description": description.hexdigest()}


# --------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------


def vector_to_json(vector: Vector) -> dict[str, Any]:
    out: dict[str, Any] = {"version": VERSION, "id": vector.id, "title": vector.title,
                           "rules": list(vector.rules), "tags": list(vector.tags)}
    if vector.original_step is not None:
        out["original"] = {"step": vector.original_step, "does": vector.original_does,
                           "where": vector.original_where}
    out["config"] = vector.config
    if vector.seed:
        out["seed"] = list(vector.seed)
    out["steps"] = [step.to_json() for step in vector.steps]
    return out


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def dump_vector(vector: Vector | Mapping[str, Any]) -> str:
    """The canonical text of a vector: one field per line, one step (and seed event) per line."""
    data = vector_to_json(vector) if isinstance(vector, Vector) else dict(vector)
    lines = ["{"]
    keys = [k for k in TOP_FIELDS if k in data]
    for n, key in enumerate(keys):
        comma = "," if n < len(keys) - 1 else ""
        item = data[key]
        if key in ("steps", "seed"):
            lines.append(f'  "{key}": [')
            for i, element in enumerate(item):
                lines.append("    " + _compact(element) + ("," if i < len(item) - 1 else ""))
            lines.append("  ]" + comma)
        else:
            lines.append(f'  "{key}": {_compact(item)}{comma}')
    lines.append("}")
    return "\n".join(lines) + "\n"
