"""The explorer's decision alphabet (`machine.checking.search`): the commands it issues, the
answers it gives to each kind of effect, the landmarks its ``to:`` macro-decisions run to,
and its scenario macro-decisions.

A decision is an `Action`: ``("pull",)``, ``("drain",)``, ``("cmd", name)`` (`COMMANDS`),
``("ans", kind, variant)`` (`ANSWERS`) or ``("macro", name)`` (`MACROS`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from machine.io import (
    Cancel,
    Dispose,
    Durable,
    Effect,
    Input,
    Output,
    Send,
)
from machine.jsonvalue import JsonLike
from machine.vocabulary import FOLLOWUP, INJECT, STEER, ErrorInfo, LlmFailure

#: ("pull",) | ("drain",) | ("cmd", name) | ("ans", kind, variant) | ("macro", name)
Action = tuple[str, ...]

COMMANDS: dict[str, Callable[[str], Input]] = {
    "followup": lambda mid: Send(_msg(mid), FOLLOWUP, preset="followup"),
    "steer": lambda mid: Send(_msg(mid), STEER, preset="steer"),
    "inject": lambda mid: Send(_msg(mid), INJECT, preset="inject"),
    "quiet": lambda mid: Send(_msg(mid), {"target": "next-turn", "wakeup": False}),
    "cancel": lambda _mid: Cancel({"kind": "user"}),
    "cancel-parent": lambda _mid: Cancel({"kind": "parent"}),
    "cancel-keep": lambda _mid: Cancel({"kind": "user"}, keep_inbox=True),
    "dispose": lambda _mid: Dispose(),
}
#: Every command but dispose (which ends the run; `ALL_COMMANDS` adds it).
DEFAULT_COMMANDS = ("followup", "steer", "inject", "quiet", "cancel", "cancel-parent",
                    "cancel-keep")
ALL_COMMANDS = (*DEFAULT_COMMANDS, "dispose")
#: The alphabet of the first explorer (kept for comparable benchmark figures and for the
#: mutation runs' verdicts): these commands, no macro-decisions, three model answers.
CLASSIC_COMMANDS = ("followup", "steer", "inject", "cancel")

_FAIL = ErrorInfo("boom", "Error", "BOOM")
_MODEL_FAIL = ErrorInfo("unavailable", "ModelError", "UNAVAILABLE",
                        failure=LlmFailure("unavailable", "UNAVAILABLE"))
_STOP: dict[str, JsonLike] = {"type": "finish", "kind": "stop"}


def _calls(fresh: str, count: int) -> list[tuple[str, JsonLike]]:
    return [*(("chunk", {"type": "tool-call", "id": f"call-{fresh}-{n}" if count > 1 else
                         f"call-{fresh}", "name": "t", "arguments": "{}"})
              for n in range(1, count + 1)), ("chunk", _STOP), ("end", None)]


#: effect kind -> variant name -> answer builder (given the effect payload and a fresh id).
ANSWERS: dict[str, dict[str, Callable[[dict[str, Any], str], list[tuple[str, JsonLike]]]]] = {
    "tick": {"ok": lambda p, m: [("resolve", None)]},
    "prompt-submit": {
        "allow": lambda p, m: [("resolve", {"kind": "allow"})],
        "block": lambda p, m: [("resolve", {"kind": "block", "reason": "no"})],
        "raise": lambda p, m: [("raise", _FAIL)],
    },
    "step": {"ok": lambda p, m: [("resolve", None)], "raise": lambda p, m: [("raise", _FAIL)]},
    "system-prompt": {"ok": lambda p, m: [("resolve", "sys")]},
    "request": {"ok": lambda p, m: [("resolve", {"config": {"provider": "p", "model": "m"}})]},
    "model": {
        "text": lambda p, m: [("chunk", {"type": "text", "text": "x"}), ("chunk", _STOP),
                              ("end", None)],
        "call": lambda p, m: _calls(m, 1),
        "calls3": lambda p, m: _calls(m, 3),
        "max": lambda p, m: [("chunk", {"type": "text", "text": "x"}),
                             ("chunk", {"type": "finish", "kind": "max-tokens"}), ("end", None)],
        "fail": lambda p, m: [("raise", _MODEL_FAIL)],
    },
    "tool-prepare": {"ok": lambda p, m: [("resolve", None)]},
    "tool-execute": {
        "ok": lambda p, m: [("resolve", {"content": [{"type": "text", "text": "ok"}]})],
        "ctx": lambda p, m: [("resolve", {"content": [{"type": "text", "text": "ok"}],
                                          "additionalContexts": [_msg(m, "plugin")]})],
        "raise": lambda p, m: [("raise", _FAIL)],
    },
    "tool-finalize": {"ok": lambda p, m: [("resolve", p["result"])]},
    "turn-stopping": {"ok": lambda p, m: [("resolve", None)]},
    "request-error": {"none": lambda p, m: [("resolve", None)],
                      "retry": lambda p, m: [("resolve", {"kind": "retry"})]},
    "flush": {"ok": lambda p, m: [("resolve", None)], "raise": lambda p, m: [("raise", _FAIL)]},
}
#: The answer variants explored by default: all but the three-call reply (see `PARALLEL`).
DEFAULT_ANSWERS: dict[str, tuple[str, ...]] = {
    kind: tuple(v for v in variants if v != "calls3") for kind, variants in ANSWERS.items()}
#: The variant a macro-decision answers with: the well-behaved environment.
DEFAULTS: dict[str, str] = {kind: next(iter(variants)) for kind, variants in ANSWERS.items()}

#: Macro-decisions: ``defaults``; ``to:<landmark>`` (see `LANDMARKS`); ``settle``.
LANDMARKS: dict[str, Callable[[Output], bool]] = {
    "model": lambda o: isinstance(o, Effect) and o.kind == "model",
    "step/end": lambda o: isinstance(o, Durable) and o.event.type == "step/end",
    "turn/end": lambda o: isinstance(o, Durable) and o.event.type == "turn/end",
    "flush": lambda o: isinstance(o, Effect) and o.kind == "flush",
    "tool-execute": lambda o: isinstance(o, Effect) and o.kind == "tool-execute",
}


@dataclass(frozen=True)
class Scenario:
    """A macro-decision that plays a whole sequence the explorer would otherwise need many
    decisions for, offered only while an effect of one of its *kinds* is outstanding: it
    answers the oldest such effect with *first*, issues *command* (if any), then pulls,
    answering with the defaults but for *answers*, until just after an output *until*
    names (or until nothing is left to do)."""

    kinds: tuple[str, ...]
    first: str
    until: Callable[[Output], bool]
    answers: dict[str, str] = field(default_factory=dict)
    command: str | None = None


#: The scenario macro-decisions (`Scenario`), by name.
SCENARIOS: dict[str, Scenario] = {
    # R7.10, R8.3: a blocked admission followed by a second prompt, which the continue-or-
    # idle of the same busy interval claims (D1); it stops at that prompt's admission.
    "block-followup": Scenario(("prompt-submit",), "block",
                               lambda o: isinstance(o, Effect) and o.kind == "prompt-submit",
                               command="followup"),
    # R10.4: each tool body of the batch answers with a result carrying an additional
    # context; the stages run to the end of the step, whose drain takes the contexts.
    "tool-contexts": Scenario(("tool-prepare", "tool-execute", "tool-finalize"), "ok",
                              LANDMARKS["step/end"], answers={"tool-execute": "ctx"}),
}
#: Every macro-decision; a prefix may use any of them.
MACROS = ("defaults", *(f"to:{name}" for name in LANDMARKS), "settle", *SCENARIOS)
#: The macro-decisions a search offers by default (a tool body is reached by answering).
DEFAULT_MACROS = tuple(m for m in MACROS if m != "to:tool-execute")


def _msg(message_id: str, kind: str = "user") -> dict[str, JsonLike]:
    source: dict[str, JsonLike] = {"kind": "user"} if kind == "user" else {
        "kind": "plugin", "plugin": "p"}
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": message_id}],
            "source": source}


