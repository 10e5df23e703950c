"""A synchronous scripted environment and driver for the core (tests, demos, ``turnstile run``).

`Driver` pulls outputs one at a time, hands each to its observers (who may
issue commands on the core: that is how a command lands at an observer
position), records everything, and, whenever the core waits for input,
answers the oldest pending effect through a `ScriptedEnvironment`. An
environment may *hold* an effect (return `HOLD`); the test answers it later
with `Driver.resolve`, `Driver.fail` or `Driver.stream`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Final

from machine.checking.invariants import InvariantMonitor
from machine.core import AgentCore
from machine.errors import ProtocolError
from machine.io import (
    FLUSH,
    MODEL,
    PROMPT_SUBMIT,
    REQUEST,
    REQUEST_ERROR,
    STEP_HOOK,
    SYSTEM_PROMPT,
    TICK,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    TURN_STOPPING,
    Control,
    Durable,
    Effect,
    Live,
    Output,
)
from machine.jsonvalue import FrozenDict, JsonLike, thaw
from machine.vocabulary import ErrorInfo, LlmFailure


class _Hold:
    def __repr__(self) -> str:
        return "HOLD"


HOLD: Final = _Hold()

#: A model reply: the chunks to stream (the finish chunk included), or an error to raise.
Reply = Sequence[JsonLike] | ErrorInfo
#: An answer to a non-model effect: ("resolve", value) or ("raise", ErrorInfo)
Answer = tuple[str, JsonLike]
Handler = Callable[[Effect], "Answer | Reply | _Hold | None"]


def text_reply(text: str, *, usage: JsonLike = None, pieces: int = 1) -> list[JsonLike]:
    """Chunks for a text reply: *pieces* text chunks, a usage chunk when *usage* is given
    (usage is its own chunk, rule V18), then a ``stop`` finish."""
    size = max(1, -(-len(text) // pieces)) if text else 1
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    chunks: list[JsonLike] = [{"type": "text", "text": p} for p in parts]
    if usage is not None:
        chunks.append({"type": "usage", "usage": usage})
    chunks.append({"type": "finish", "kind": "stop"})
    return chunks


def calls_reply(*calls: tuple[str, str] | tuple[str, str, str], text: str | None = None,
                finish: str = "stop") -> list[JsonLike]:
    """Chunks for a reply with tool calls ``(id, name[, arguments])``."""
    chunks: list[JsonLike] = []
    if text is not None:
        chunks.append({"type": "text", "text": text})
    for call in calls:
        arguments = call[2] if len(call) > 2 else "{}"
        chunks.append({"type": "tool-call", "id": call[0], "name": call[1], "arguments": arguments})
    chunks.append({"type": "finish", "kind": finish})
    return chunks


def model_failure(message: str, code: str, **facts: JsonLike) -> ErrorInfo:
    """A raised model failure (an error carrying LlmFailure facts)."""
    failure = LlmFailure.from_json({"message": message, "code": code, **facts})
    return ErrorInfo(message, "ModelError", code, failure=failure)


def ok_result(text: str = "ok", **extra: JsonLike) -> dict[str, JsonLike]:
    return {"content": [{"type": "text", "text": text}], **extra}


@dataclass
class ScriptedEnvironment:
    """Answers effects: model replies from a list, everything else by default or by handler."""

    replies: list[Reply] = field(default_factory=list)
    handlers: dict[str, Handler] = field(default_factory=dict)
    config: JsonLike = field(default_factory=lambda: {"provider": "test", "model": "test-model"})
    tool_results: dict[str, JsonLike] = field(default_factory=dict)

    def answer(self, effect: Effect) -> Answer | Reply | _Hold:
        handler = self.handlers.get(effect.kind)
        if handler is not None:
            answered = handler(effect)
            if answered is not None:
                return answered
        return self.default(effect)

    def default(self, effect: Effect) -> Answer | Reply | _Hold:
        kind = effect.kind
        if kind == MODEL:
            if not self.replies:
                return text_reply("ok")
            return self.replies.pop(0)
        if kind == PROMPT_SUBMIT:
            return ("resolve", {"kind": "allow"})
        if kind == REQUEST:
            config = effect.payload.get("config")
            seed = thaw(config) if isinstance(config, FrozenDict) and config else self.config
            return ("resolve", {"config": seed})
        if kind in (TICK, STEP_HOOK, SYSTEM_PROMPT, TURN_STOPPING, REQUEST_ERROR, FLUSH, TOOL_PREPARE):
            return ("resolve", None)
        if kind == TOOL_EXECUTE:
            call_id = str(effect.payload.get("callId"))
            return ("resolve", self.tool_results.get(call_id, ok_result()))
        if kind == TOOL_FINALIZE:
            return ("resolve", thaw(effect.payload["result"]))
        raise ProtocolError(f"no default answer for effect kind {kind!r}")


class Driver:
    """Pull, deliver, answer: a synchronous event loop for one core."""

    def __init__(self, core: AgentCore, env: ScriptedEnvironment | None = None, *,
                 check_invariants: bool = True) -> None:
        self.core = core
        self.env = env if env is not None else ScriptedEnvironment()
        # R20.1 runtime invariants, checked at every output and whenever the core waits.
        self.monitor = (InvariantMonitor(core, core)
                        if check_invariants and hasattr(core, "staged") else None)
        self.outputs: list[Output] = []
        self.observers: list[Callable[[Output], None]] = []
        self.pending: deque[Effect] = deque()
        self.held: list[Effect] = []

    # -- observation -----------------------------------------------------------
    def on(self, observer: Callable[[Output], None]) -> Callable[[], None]:
        self.observers.append(observer)
        return lambda: self.observers.remove(observer)

    def on_event(self, type_: str, callback: Callable[[FrozenDict], None], *,
                 once: bool = False) -> None:
        """Call *callback* with the data of each durable event (or live payload) of *type_*."""
        state = {"fired": False}

        def observer(output: Output) -> None:
            if once and state["fired"]:
                return
            if isinstance(output, Durable) and output.event.type == type_:
                state["fired"] = True
                callback(output.event.data)
            elif isinstance(output, Live) and output.event.type == type_:
                state["fired"] = True
                callback(output.event.payload)
        self.observers.append(observer)

    # -- running -------------------------------------------------------------
    def pump(self) -> None:
        """Deliver every output available now, without answering effects."""
        while (output := self.core.next_output()) is not None:
            self._deliver(output)
        if self.monitor is not None:
            self.monitor.poll(quiet=True)

    def run(self, *, max_rounds: int = 100_000) -> None:
        """Deliver outputs and answer effects until the core waits only on held effects."""
        for _ in range(max_rounds):
            self.pump()
            if not self._answer_next():
                return
        raise RuntimeError("the scripted run did not settle")

    def _deliver(self, output: Output) -> None:
        self.outputs.append(output)
        if self.monitor is not None:
            self.monitor.output(output)
        for observer in tuple(self.observers):
            observer(output)
        if self.monitor is not None:
            self.monitor.poll()
        if isinstance(output, Effect):
            self.pending.append(output)
        elif isinstance(output, Control) and output.kind == "release":
            effect_id = output.payload["effect"]
            self.pending = deque(e for e in self.pending if e.id != effect_id)
            self.held = [e for e in self.held if e.id != effect_id]

    def _answer_next(self) -> bool:
        while self.pending:
            effect = self.pending.popleft()
            answer = self.env.answer(effect)
            if isinstance(answer, _Hold):
                self.held.append(effect)
                continue
            self._apply(effect, answer)
            return True
        return False

    def _apply(self, effect: Effect, answer: Answer | Reply) -> None:
        if effect.kind == MODEL:
            if isinstance(answer, ErrorInfo):
                self.core.fail(effect.id, answer)
                return
            assert not isinstance(answer, tuple) or len(answer) != 2 or answer[0] not in ("resolve", "raise")
            for chunk in answer:
                self.core.chunk(effect.id, chunk)
            self.core.end(effect.id)
            return
        assert isinstance(answer, tuple)
        verb, value = answer
        if verb == "raise":
            assert isinstance(value, ErrorInfo)
            self.core.fail(effect.id, value)
        else:
            self.core.resolve(effect.id, value)

    # -- manual answers for held effects ----------------------------------------
    def take_held(self, kind: str) -> Effect:
        for effect in self.held:
            if effect.kind == kind:
                self.held.remove(effect)
                return effect
        raise LookupError(f"no held {kind!r} effect; held: {[e.kind for e in self.held]}")

    def resolve(self, kind: str, value: JsonLike = None) -> None:
        self.core.resolve(self.take_held(kind).id, value)

    def fail(self, kind: str, error: ErrorInfo) -> None:
        self.core.fail(self.take_held(kind).id, error)

    def stream(self, effect: Effect, chunks: Iterable[JsonLike], *, end: bool = True) -> None:
        for chunk in chunks:
            self.core.chunk(effect.id, chunk)
        if end:
            self.core.end(effect.id)

    # -- views -----------------------------------------------------------------
    @property
    def events(self) -> list[Durable]:
        return [o for o in self.outputs if isinstance(o, Durable)]

    def live(self, *types: str) -> list[Live]:
        return [o for o in self.outputs if isinstance(o, Live) and (not types or o.event.type in types)]

    def effects(self, kind: str | None = None) -> list[Effect]:
        return [o for o in self.outputs if isinstance(o, Effect) and (kind is None or o.kind == kind)]
