"""Inputs and outputs of the sans-I/O core (spec §P: rules P1–P12).

Outputs are pulled one at a time with `AgentCore.next_output`:

* `Durable`: a committed session event, to deliver to log observers;
* `Live`: a live notification;
* `Effect`: a request to the environment, answered later by a completion
  that names its ``effect`` id;
* `Control`: ``abort`` (a signal was aborted, with its reason) or ``release``
  (the core stopped consuming a model stream; further completions of that
  effect are refused).

Inputs are commands (`Send`, `Cancel`, `Dispose`) and completions
(`Resolve`, `Raise`, `Chunk`, `End`). Every input and output has a JSON form
(``to_json`` / ``input_from_json``), so a run is data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, TypeAlias

from machine.errors import CodecError, ValidationError
from machine.events import Event, LiveEvent
from machine.jsonvalue import FrozenDict, JsonLike, thaw
from machine.vocabulary import (
    FOLLOWUP,
    INJECT,
    STEER,
    CancelCause,
    ErrorInfo,
    Message,
    SendOptions,
)

# Effect kinds (rule P4).
TICK: Final = "tick"
PROMPT_SUBMIT: Final = "prompt-submit"
STEP_HOOK: Final = "step"
SYSTEM_PROMPT: Final = "system-prompt"
REQUEST: Final = "request"
MODEL: Final = "model"
TOOL_PREPARE: Final = "tool-prepare"
TOOL_EXECUTE: Final = "tool-execute"
TOOL_FINALIZE: Final = "tool-finalize"
TURN_STOPPING: Final = "turn-stopping"
REQUEST_ERROR: Final = "request-error"
FLUSH: Final = "flush"
#: The effect kinds as a type (P4): the core requests only these (mypy checks every request;
#: tests/test_machines.py checks the type names exactly EFFECT_KINDS).
EffectKind: TypeAlias = Literal["tick", "prompt-submit", "step", "system-prompt", "request",
                                "model", "tool-prepare", "tool-execute", "tool-finalize",
                                "turn-stopping", "request-error", "flush"]
EFFECT_KINDS: Final = frozenset({
    TICK, PROMPT_SUBMIT, STEP_HOOK, SYSTEM_PROMPT, REQUEST, MODEL, TOOL_PREPARE, TOOL_EXECUTE,
    TOOL_FINALIZE, TURN_STOPPING, REQUEST_ERROR, FLUSH,
})


@dataclass(frozen=True, slots=True)
class Durable:
    event: Event

    def to_json(self, *, with_time: bool = False) -> dict[str, JsonLike]:
        return {"out": "event", **self.event.to_json(with_time=with_time)}


@dataclass(frozen=True, slots=True)
class Live:
    event: LiveEvent

    def to_json(self) -> dict[str, JsonLike]:
        return {"out": "live", **self.event.to_json()}


@dataclass(frozen=True, slots=True)
class Effect:
    """An effect request (rule P4). ``history`` is the model call's message list:
    a cheap immutable view of the derived history before the step's ``step/start``."""

    id: int
    kind: str
    payload: FrozenDict
    history: Sequence[Message] | None = field(default=None, compare=False)

    def to_json(self) -> dict[str, JsonLike]:
        return {"out": "effect", "effect": self.id, "kind": self.kind, **thaw(self.payload)}


@dataclass(frozen=True, slots=True)
class Control:
    """``abort`` {signal, reason} or ``release`` {effect} (rule P5)."""

    kind: Literal["abort", "release"]
    payload: FrozenDict

    def to_json(self) -> dict[str, JsonLike]:
        return {"out": self.kind, **thaw(self.payload)}


Output: TypeAlias = Durable | Live | Effect | Control


# --------------------------------------------------------------------------
# Inputs
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Send:
    message: JsonLike
    options: JsonLike
    preset: str | None = None

    def to_json(self) -> dict[str, JsonLike]:
        message = self.message.to_json() if isinstance(self.message, Message) else self.message
        if self.preset:
            return {"in": self.preset, "message": message}
        options = self.options.to_json() if isinstance(self.options, SendOptions) else self.options
        return {"in": "send", "message": message, "options": options}


@dataclass(frozen=True, slots=True)
class Cancel:
    cause: JsonLike
    keep_inbox: bool = False

    def to_json(self) -> dict[str, JsonLike]:
        cause = self.cause.to_json() if isinstance(self.cause, CancelCause) else self.cause
        out: dict[str, JsonLike] = {"in": "cancel", "cause": cause}
        if self.keep_inbox:
            out["keepInbox"] = True
        return out


@dataclass(frozen=True, slots=True)
class Dispose:
    def to_json(self) -> dict[str, JsonLike]:
        return {"in": "dispose"}


@dataclass(frozen=True, slots=True)
class Append:
    """A direct append by extension code (rule P3)."""

    type: str
    data: JsonLike
    surface_op: JsonLike = None
    source_event_seqs: tuple[int, ...] | None = None
    ignorable: bool = False       # D16: an extension event a resuming build may not read

    def to_json(self) -> dict[str, JsonLike]:
        out: dict[str, JsonLike] = {"in": "append", "type": self.type, "data": self.data}
        if self.surface_op is not None:
            out["surfaceOp"] = self.surface_op
        if self.source_event_seqs is not None:
            out["sourceEventSeqs"] = list(self.source_event_seqs)
        if self.ignorable:
            out["ignorable"] = True
        return out


@dataclass(frozen=True, slots=True)
class Observer:
    """What observers do (rule P14): ``throw``, the observers of the last output pulled raise
    (their driver contains it); ``veto``, pre-commit observers refuse the next durable append,
    where an implementation lets them. Neither reaches the core: its observers run after
    commit and their failures are their driver's (L11, D7), so the core takes it as a no-op;
    the input exists so that a port with in-process observers can be checked against it."""

    action: str

    def to_json(self) -> dict[str, JsonLike]:
        return {"in": "observer", "action": self.action}


OBSERVER_ACTIONS: Final = ("throw", "veto")


@dataclass(frozen=True, slots=True)
class Resolve:
    effect: int
    value: JsonLike = None

    def to_json(self) -> dict[str, JsonLike]:
        value = self.value.to_json() if hasattr(self.value, "to_json") else self.value
        return {"in": "resolve", "effect": self.effect, "value": value}


@dataclass(frozen=True, slots=True)
class Raise:
    effect: int
    error: ErrorInfo

    def to_json(self) -> dict[str, JsonLike]:
        return {"in": "raise", "effect": self.effect, "error": self.error.to_json()}


@dataclass(frozen=True, slots=True)
class Chunk:
    effect: int
    chunk: JsonLike

    def to_json(self) -> dict[str, JsonLike]:
        return {"in": "chunk", "effect": self.effect, "chunk": self.chunk}


@dataclass(frozen=True, slots=True)
class End:
    effect: int

    def to_json(self) -> dict[str, JsonLike]:
        return {"in": "end", "effect": self.effect}


Input: TypeAlias = Send | Cancel | Dispose | Append | Observer | Resolve | Raise | Chunk | End
Command: TypeAlias = Send | Cancel | Dispose | Append | Observer
Completion: TypeAlias = Resolve | Raise | Chunk | End

PRESETS: Final = {"followup": FOLLOWUP, "steer": STEER, "inject": INJECT}


def _effect_id(value: JsonLike, path: str) -> int:
    effect = value.get("effect")
    if type(effect) is not int or effect < 0:
        raise CodecError(f"{path}.effect", "must be a non-negative integer effect id")
    return effect


def input_from_json(value: JsonLike, path: str = "input") -> Input:
    """Decode one input (rule P9). Message and option *contents* are validated by the core."""
    if not isinstance(value, dict) or not isinstance(value.get("in"), str):
        raise CodecError(path, "must be an object with a string 'in' naming the input")
    kind = value["in"]
    allowed: dict[str, set[str]] = {
        "send": {"in", "message", "options"}, "followup": {"in", "message"},
        "steer": {"in", "message"}, "inject": {"in", "message"},
        "cancel": {"in", "cause", "keepInbox"}, "dispose": {"in"},
        "append": {"in", "type", "data", "surfaceOp", "sourceEventSeqs", "ignorable"},
        "observer": {"in", "action"},
        "resolve": {"in", "effect", "value"}, "raise": {"in", "effect", "error"},
        "chunk": {"in", "effect", "chunk"}, "end": {"in", "effect"},
    }
    if kind not in allowed:
        raise CodecError(f"{path}.in", f"unknown input {kind!r}; expected one of {sorted(allowed)}")
    extra = set(value) - allowed[kind] - {"when", "note"}
    if extra:
        raise CodecError(path, f"unexpected field(s) {sorted(extra)} for input {kind!r}")
    if kind in PRESETS:
        return Send(value.get("message"), PRESETS[kind], preset=kind)
    if kind == "send":
        return Send(value.get("message"), value.get("options"))
    if kind == "cancel":
        keep = value.get("keepInbox", False)
        if not isinstance(keep, bool):
            raise CodecError(f"{path}.keepInbox", "must be a bool")
        return Cancel(value.get("cause"), keep)
    if kind == "dispose":
        return Dispose()
    if kind == "observer":
        action = value.get("action")
        if action not in OBSERVER_ACTIONS:
            raise CodecError(f"{path}.action", f"must be one of {', '.join(OBSERVER_ACTIONS)}")
        return Observer(str(action))
    if kind == "append":
        if not isinstance(value.get("type"), str):
            raise CodecError(f"{path}.type", "must be a string event type")
        seqs = value.get("sourceEventSeqs")
        if seqs is not None and (not isinstance(seqs, list)
                                 or not all(type(s) is int for s in seqs)):
            raise CodecError(f"{path}.sourceEventSeqs", "must be a list of integers")
        if "ignorable" in value and value["ignorable"] is not True:
            raise CodecError(f"{path}.ignorable", "must be true, or omitted (D16)")
        return Append(value["type"], value.get("data"), value.get("surfaceOp"),
                      None if seqs is None else tuple(seqs), "ignorable" in value)
    effect = _effect_id(value, path)
    if kind == "resolve":
        return Resolve(effect, value.get("value"))
    if kind == "raise":
        try:
            return Raise(effect, ErrorInfo.from_json(value.get("error"), f"{path}.error"))
        except ValidationError as exc:
            raise CodecError(exc.path, exc.problem) from None
    if kind == "chunk":
        if "chunk" not in value:
            raise CodecError(f"{path}.chunk", "is required")
        return Chunk(effect, value["chunk"])
    return End(effect)
