"""Authoring conformance vectors: play a scenario here, review it, write it.

A scenario is a Python function decorated with `scenario` (see
``specs/conformance/_author/``). It builds a `Session` (a `RecordingCore`
driven by the scripted `Driver`, so observers can issue commands at exactly
the output they observe), plays the script, *reviews* the recording with
assertions in the notation of ``scenarios.md``, and returns the session. The
build (``specs/conformance/_author/build.py``) writes one vector per
scenario whose review passed, with the scenario's hand-written title, rules
and tags.

Notation (as in ``scenarios.md``): ``TS(1,msg:user) UM('hi') SS(1.1)
RH(initial) CH… AM(1.1;'hello there') SE(1.1) TE(1,completed)`` for the log;
``enq(hi,q) running deq(hi,q) settled(1,completed) idle`` for live
notifications.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from machine.conformance.recorder import RecordingCore
from machine.conformance.vectors import Vector
from machine.core import CoreConfig, ToolMode
from machine.events import Event
from machine.invariants import AgentInvariantError, InvariantMonitor
from machine.io import Control, Durable, Effect, Live, Observer, Output
from machine.jsonvalue import JsonLike, thaw
from machine.scripted import HOLD, Driver, ScriptedEnvironment
from machine.vocabulary import ErrorInfo, LlmFailure

__all__ = [
    "HOLD", "REGISTRY", "Scenario", "Session", "calls", "durable", "effect", "error", "live",
    "model_failure", "notation", "reply", "result", "scenario", "source",
]

USER: Final[dict[str, JsonLike]] = {"kind": "user"}


# --------------------------------------------------------------------------
# Values
# --------------------------------------------------------------------------


def source(spec: str | Mapping[str, JsonLike] | None) -> dict[str, JsonLike]:
    """``None``/``'user'`` -> {kind:'user'}; ``'plugin:NAME'`` -> {kind:'plugin', plugin:NAME};
    another string is a bare kind; a mapping is copied."""
    if spec is None or spec == "user":
        return dict(USER)
    if isinstance(spec, str):
        if spec.startswith("plugin:"):
            return {"kind": "plugin", "plugin": spec[len("plugin:"):]}
        return {"kind": spec}
    return dict(spec)


def reply(text: str, *, finish: str = "stop", usage: JsonLike = None,
          pieces: int = 1) -> list[JsonLike]:
    """A text reply: *pieces* text chunks, a usage chunk when *usage* is given (rule V18),
    then a finish chunk of kind *finish*."""
    size = max(1, -(-len(text) // pieces))
    parts = [text[i:i + size] for i in range(0, len(text), size)] or [""]
    chunks: list[JsonLike] = [{"type": "text", "text": p} for p in parts]
    if usage is not None:
        chunks.append({"type": "usage", "usage": usage})
    chunks.append({"type": "finish", "kind": finish})
    return chunks


def calls(*ids_and_names: tuple[str, str] | tuple[str, str, str], text: str | None = None,
          finish: str = "stop") -> list[JsonLike]:
    """A reply with tool calls ``(id, name[, arguments])``, optionally after a text block."""
    chunks: list[JsonLike] = []
    if text is not None:
        chunks.append({"type": "text", "text": text})
    for call in ids_and_names:
        chunks.append({"type": "tool-call", "id": call[0], "name": call[1],
                       "arguments": call[2] if len(call) > 2 else "{}"})
    chunks.append({"type": "finish", "kind": finish})
    return chunks


def result(text: str = "ok", *, contexts: Sequence[Mapping[str, JsonLike]] = (),
           **extra: JsonLike) -> dict[str, JsonLike]:
    """A tool result with one text block (and additional contexts)."""
    out: dict[str, JsonLike] = {"content": [{"type": "text", "text": text}], **extra}
    if contexts:
        out["additionalContexts"] = [dict(c) for c in contexts]
    return out


def error(message: str, name: str = "Error", code: str | None = None) -> ErrorInfo:
    return ErrorInfo(message, name, code)


def model_failure(message: str, code: str, **facts: JsonLike) -> ErrorInfo:
    failure = LlmFailure.from_json({"message": message, "code": code, **facts})
    return ErrorInfo(message, "ModelError", code, failure=failure)


# --------------------------------------------------------------------------
# Output predicates
# --------------------------------------------------------------------------

Predicate = Callable[[Output], bool]


def _fields_match(payload: Mapping[str, Any], fields: Mapping[str, Any]) -> bool:
    return all(k in payload and thaw(payload[k]) == v for k, v in fields.items())


def durable(type_: str, **fields: Any) -> Predicate:
    """A durable event of *type_* whose data has these field values."""
    return lambda o: (isinstance(o, Durable) and o.event.type == type_
                      and _fields_match(o.event.data, fields))


def live(type_: str, **fields: Any) -> Predicate:
    """A live notification of *type_* whose payload has these field values."""
    return lambda o: (isinstance(o, Live) and o.event.type == type_
                      and _fields_match(o.event.payload, fields))


def effect(kind: str, **fields: Any) -> Predicate:
    """An effect request of *kind* whose payload has these field values."""
    return lambda o: isinstance(o, Effect) and o.kind == kind and _fields_match(o.payload, fields)


def control(kind: str) -> Predicate:
    return lambda o: isinstance(o, Control) and o.kind == kind


# --------------------------------------------------------------------------
# Notation
# --------------------------------------------------------------------------

_OPEN, _CLOSE = "([{⟨", ")]}⟩"


def notation(text: str) -> list[str]:
    """Split notation into tokens: whitespace separates tokens only outside quotes and
    brackets; whitespace after ``,`` or ``;`` inside brackets is dropped."""
    tokens: list[str] = []
    current: list[str] = []
    depth = 0
    quoted = False
    for ch in text:
        if ch == "'":
            quoted = not quoted
        elif not quoted:
            if ch in _OPEN:
                depth += 1
            elif ch in _CLOSE:
                depth -= 1
            elif ch.isspace():
                if depth == 0:
                    if current:
                        tokens.append("".join(current))
                        current = []
                    continue
                if current and current[-1] in ";,":
                    continue
        current.append(ch)
    if current:
        tokens.append("".join(current))
    if depth or quoted:
        raise ValueError(f"unbalanced notation: {text!r}")
    return tokens


def source_label(src: Mapping[str, Any]) -> str:
    if src.get("kind") == "plugin" and set(src) == {"kind", "plugin"}:
        return f"plugin:{src['plugin']}"
    return str(src.get("kind"))


def content_label(content: Sequence[Any]) -> str:
    parts: list[str] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            parts.append(f"'{block.get('text')}'")
        elif kind == "tool-call":
            parts.append(f"call {block.get('id')}")
        elif kind == "tool-result":
            parts.append(f"TR:{block.get('toolCallId')}")
        else:
            parts.append(str(kind))
    return "+".join(parts) if parts else "[]"


def text_of(message: Mapping[str, Any]) -> str:
    return "".join(str(b.get("text", "")) for b in message.get("content", [])
                   if b.get("type") == "text")


def message_label(message: Mapping[str, Any]) -> str:
    label = content_label(message["content"])
    src = message.get("source", {})
    if message.get("role") == "user" and src.get("kind") not in ("user", "tool"):
        label += ";" + source_label(src)
    return label


def event_token(event: Event) -> str:
    d = thaw(event.data)
    t = event.type
    if t == "turn/start":
        trigger = d["trigger"]
        if trigger["kind"] == "message":
            return f"TS({d['turn']},msg:{source_label(trigger['source'])})"
        return f"TS({d['turn']},{trigger['kind']})"
    if t == "turn/end":
        return f"TE({d['turn']},{d['reason']['kind']})"
    if t in ("step/start", "step/end"):
        return f"{'SS' if t == 'step/start' else 'SE'}({d['turn']}.{d['step']})"
    if t == "user/message":
        return f"UM({message_label(d)})"
    if t == "steering/message":
        m = d["message"]
        return f"STM({d['turn']};{content_label(m['content'])};{source_label(m['source'])})"
    if t == "request/header":
        return f"RH({d['reason']})"
    if t == "assistant/chunk":
        return "CH"
    if t == "assistant/message":
        return f"AM({d['turn']}.{d['step']};{content_label(d['message']['content'])})"
    if t == "tool/call":
        return f"TC({d['turn']}.{d['step']};{d['callId']})"
    if t == "tool/result":
        err = d.get("error")
        block = d["message"]["content"][0]
        if err is None:
            outcome = "ERR" if block.get("isError") else "ok"
        elif err.get("code") == "ABORTED_BEFORE_DISPATCH":
            outcome = "ERR ABD"
        elif err.get("code") == "ABORTED":
            outcome = "ERR ABORTED"
        else:
            outcome = f"ERR {err.get('code', err.get('name'))}"
        return f"TR({d['turn']}.{d['step']};{block['toolCallId']};{outcome})"
    return t


def log_tokens(events: Sequence[Event]) -> list[str]:
    """The log in notation; a run of chunks ending with the finish chunk is ``CH…``."""
    tokens: list[str] = []
    i = 0
    while i < len(events):
        if events[i].type == "assistant/chunk":
            j = i
            while j < len(events) and events[j].type == "assistant/chunk":
                j += 1
            run = events[i:j]
            finish = thaw(run[-1].data["chunk"]).get("type") == "finish"
            tokens.extend(["CH…"] if finish and len(run) > 1 else ["CH"] * len(run))
            i = j
            continue
        tokens.append(event_token(events[i]))
        i += 1
    return tokens


def live_token(output: Live) -> str:
    p = thaw(output.event.payload)
    t = output.event.type
    if t in ("agent/inbox/enqueue", "agent/inbox/dequeue"):
        short = "enq" if t.endswith("enqueue") else "deq"
        return f"{short}({text_of(p['message'])},{p['placement'][0]})"
    if t == "agent/inbox/discard":
        return "disc[" + ",".join(text_of(m) for m in p["messages"]) + "]"
    if t == "agent/context/discard":
        return "ctxdisc[" + ",".join(text_of(m) for m in p["messages"]) + "]"
    if t == "agent/status":
        return str(p["status"])
    if t == "agent/cancel-requested":
        return f"cancel-req({p['cause']['kind']})"
    if t == "agent/settled":
        return f"settled({p['turn']},{p['reason']['kind']})"
    if t == "agent/error":
        return f"error({p['turn']},{p['step']},'{p['error']['message']}')"
    if t == "agent/warning":
        return f"warn('{p['text']}')"
    if t == "agent/session-start":
        return f"session-start({p['source']})"
    return t


def effect_token(output: Effect) -> str:
    p = thaw(output.payload)
    k = output.kind
    if k == "flush":
        return f"flush({p['turn']})"
    if k == "tick":
        return f"tick({p['purpose']})"
    if k == "prompt-submit":
        return "⟨prompt-submit⟩"
    if k == "turn-stopping":
        return f"⟨turn-stopping {p['turn']}⟩"
    if k in ("tool-prepare", "tool-execute", "tool-finalize"):
        return f"⟨{k[5:]} {p['callId']}⟩"
    return f"⟨{k} {p['turn']}.{p['step']}⟩"


PUBLICATION: Final = frozenset({"session/created", "agent/created", "agent/session-start"})


# --------------------------------------------------------------------------
# Sessions
# --------------------------------------------------------------------------

Handler = Callable[[Effect], Any]


class Session:
    """One recorded core over a fresh (or seeded) session, driven by the scripted driver."""

    def __init__(self, *replies: Sequence[JsonLike] | ErrorInfo | str,
                 tool_modes: Mapping[str, ToolMode] | None = None,
                 max_parallel: int = 10, request_options: Mapping[str, JsonLike] | None = None,
                 session_start: str = "startup", seed: Sequence[Event] = (),
                 publish: bool = True) -> None:
        config = CoreConfig(request_options=dict(request_options or {}),
                            tool_modes=dict(tool_modes or {}), max_parallel_tool_calls=max_parallel,
                            session_start=session_start,  # type: ignore[arg-type]
                            publish=publish)
        self.core = RecordingCore(config, seed=seed)
        self.env = ScriptedEnvironment(replies=[reply(r) if isinstance(r, str) else r
                                                for r in replies])
        self.driver = Driver(self.core, self.env)
        # Review: the agent invariants (R20.1) hold at every input and output.
        self.monitor = InvariantMonitor(self.core, self.core)
        self.driver.on(self.monitor.output)
        self.core.listeners.append(lambda what: self.monitor.poll(quiet=what == "wait"))
        self._ids = itertools.count(1)
        self.caught: list[str] = []    # errors raised by commands issued by observers/handlers

    # -- messages and commands -------------------------------------------------
    def msg(self, text: str, src: str | Mapping[str, JsonLike] | None = None, *,
            id: str | None = None) -> dict[str, JsonLike]:
        return {"id": id if id is not None else f"m{next(self._ids)}", "role": "user",
                "content": [{"type": "text", "text": text}], "source": source(src)}

    def _m(self, message: str | Mapping[str, JsonLike], src: str | Mapping[str, JsonLike] | None
           ) -> JsonLike:
        return self.msg(message, src) if isinstance(message, str) else message

    def followup(self, message: str | Mapping[str, JsonLike], src: Any = None) -> None:
        self.core.followup(self._m(message, src))

    def steer(self, message: str | Mapping[str, JsonLike], src: Any = None) -> None:
        self.core.steer(self._m(message, src))

    def inject(self, message: str | Mapping[str, JsonLike], src: Any = "plugin:test") -> None:
        self.core.inject(self._m(message, src))

    def send(self, message: str | Mapping[str, JsonLike], options: JsonLike, src: Any = None) -> None:
        self.core.send(self._m(message, src), options)

    def cancel(self, kind: str = "user", keep_inbox: bool = False) -> None:
        self.core.cancel({"kind": kind}, keep_inbox)

    def observer_throws(self) -> None:
        """P14: the observers of the last pulled output raise (their driver contains it)."""
        self.core.feed(Observer("throw"))

    def observer_vetoes(self) -> None:
        """P14: pre-commit observers refuse the next durable append, where an implementation
        lets observers veto (turnstile does not: D7)."""
        self.core.feed(Observer("veto"))

    def dispose(self) -> None:
        self.core.dispose()

    def attempt(self, command: Callable[[], None]) -> str | None:
        """Run a command that may be refused; returns the error text (recorded as refused)."""
        try:
            command()
        except AgentInvariantError:
            raise
        except Exception as exc:   # the recorder has recorded the refusal
            self.caught.append(str(exc))
            return str(exc)
        return None

    # -- running ---------------------------------------------------------------------
    def pump(self) -> Session:
        self.driver.pump()
        return self

    def run(self) -> Session:
        self.driver.run()
        return self

    # -- observers and handlers ------------------------------------------------------
    def on(self, predicate: Predicate, action: Callable[[Output], None], *,
           times: int | None = 1, nth: int = 1) -> None:
        """An observer: on the *nth* (and following, up to *times*) matching output, run
        *action*, which may issue commands at exactly that output (rule P2)."""
        state = {"seen": 0, "fired": 0}

        def observer(output: Output) -> None:
            if not predicate(output):
                return
            state["seen"] += 1
            if state["seen"] < nth or (times is not None and state["fired"] >= times):
                return
            state["fired"] += 1
            action(output)
        self.driver.on(observer)

    def handle(self, kind: str, fn: Handler, *, times: int | None = None) -> None:
        """An environment handler for effects of *kind*; *fn* returns an answer (None: the
        default; HOLD: answer later). With *times*, only the first *times* invocations."""
        count = {"n": 0}
        previous = self.env.handlers.get(kind)

        def handler(e: Effect) -> Any:
            if times is not None and count["n"] >= times:
                return previous(e) if previous is not None else None
            count["n"] += 1
            return fn(e)
        self.env.handlers[kind] = handler

    def hold(self, kind: str, *, times: int | None = 1) -> None:
        self.handle(kind, lambda e: HOLD, times=times)

    def held(self, kind: str) -> Effect:
        for e in self.driver.held:
            if e.kind == kind:
                return e
        raise LookupError(f"no held {kind!r} effect; held: {[e.kind for e in self.driver.held]}")

    def resolve(self, kind: str, value: JsonLike = None) -> Session:
        self.driver.resolve(kind, value)
        return self

    def fail(self, kind: str, err: ErrorInfo) -> Session:
        self.driver.fail(kind, err)
        return self

    def stream(self, chunks: Iterable[JsonLike], *, end: bool = True) -> Session:
        """Stream chunks into the held model effect (kept held unless *end*)."""
        model = self.held("model")
        for chunk in chunks:
            self.core.chunk(model.id, chunk)
        if end:
            self.core.end(model.id)
            self.driver.held.remove(model)
        return self

    def fail_model(self, err: ErrorInfo) -> Session:
        model = self.held("model")
        self.driver.held.remove(model)
        self.core.fail(model.id, err)
        return self

    # -- views ------------------------------------------------------------------------
    @property
    def outputs(self) -> list[Output]:
        return self.driver.outputs

    def events(self) -> list[Event]:
        return list(self.core.log.events)

    def log(self) -> list[str]:
        return log_tokens(self.events())

    def types(self) -> list[str]:
        return [e.type for e in self.events()]

    def live(self, *types: str, publication: bool = False) -> list[str]:
        return [live_token(o) for o in self.outputs if isinstance(o, Live)
                and (publication or o.event.type not in PUBLICATION)
                and (not types or o.event.type in types)]

    def trace(self, *, events: bool = True, effects: bool = True) -> list[str]:
        """Every output in order: live tokens, ``[durable]`` tokens and effect tokens."""
        out: list[str] = []
        for o in self.outputs:
            if isinstance(o, Live):
                if o.event.type not in PUBLICATION:
                    out.append(live_token(o))
            elif isinstance(o, Durable):
                if events:
                    out.append(f"[{event_token(o.event)}]")
            elif isinstance(o, Effect):
                if effects:
                    out.append(effect_token(o))
            else:
                out.append(o.kind)
        return out

    def effects(self, kind: str | None = None) -> list[Effect]:
        return self.driver.effects(kind)

    def requests(self) -> list[list[str]]:
        """The message list of each model request, as message labels."""
        return [[message_label(m.to_json()) for m in (e.history or ())]
                for e in self.effects("model")]

    def reasons(self) -> list[dict[str, Any]]:
        return [thaw(e.data["reason"]) for e in self.events() if e.type == "turn/end"]

    def data(self, type_: str) -> list[dict[str, Any]]:
        return [thaw(e.data) for e in self.events() if e.type == type_]

    def expect_log(self, text: str) -> None:
        expected = notation(text)
        actual = self.log()
        if actual != expected:
            raise AssertionError(f"log differs:\n  expected {' '.join(expected)}\n"
                                 f"  actual   {' '.join(actual)}")

    def expect_live(self, text: str, *types: str) -> None:
        expected = notation(text)
        actual = self.live(*types)
        if actual != expected:
            raise AssertionError(f"live notifications differ:\n  expected {' '.join(expected)}\n"
                                 f"  actual   {' '.join(actual)}")

    def vector(self, id: str, title: str, rules: Sequence[str], tags: Sequence[str]) -> Vector:
        return self.core.vector(id, title, rules, tags)


# --------------------------------------------------------------------------
# The registry
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Scenario:
    id: str
    title: str
    rules: tuple[str, ...]
    tags: tuple[str, ...]
    play: Callable[[], Session]

    def build(self) -> Vector:
        """Play and review the scenario (AssertionError if the review fails); the vector."""
        session = self.play()
        return session.vector(self.id, self.title, self.rules, self.tags)


REGISTRY: list[Scenario] = []


def scenario(id: str, title: str, rules: Sequence[str], tags: Sequence[str] = ()
             ) -> Callable[[Callable[[], Session]], Callable[[], Session]]:
    """Register a scenario: *title* and *rules* are hand-written; the function plays and
    reviews it and returns its session."""
    def register(play: Callable[[], Session]) -> Callable[[], Session]:
        if any(s.id == id for s in REGISTRY):
            raise ValueError(f"duplicate scenario id {id!r}")
        REGISTRY.append(Scenario(id, title, tuple(rules), tuple(tags), play))
        return play
    return register
