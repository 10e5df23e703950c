"""Authoring conformance vectors: play a scenario here, review it, write it.

A scenario is a Python function decorated with `scenario` (the definitions are in
`machine.conformance.corpus`). It builds a `Session` (a `RecordingCore` driven by the
scripted `Driver`, so observers can issue commands at exactly the output they observe),
plays the script, *reviews* the recording with assertions in the notation of
``scenarios.md``, and returns the session. `Scenario.review` adds what holds of every log
(`check_log`); the build (``python -m machine.conformance.corpus``) writes one vector per
scenario whose review passed, with the scenario's hand-written title, rules and tags, and
``tests/test_scenarios.py`` runs each review as a test.

Notation (as in ``scenarios.md``): ``TS(1,msg:user) UM('hi') SS(1.1)
RH(initial) CH… AM(1.1;'hello there') SE(1.1) TE(1,completed)`` for the log;
``enq(hi,q) running deq(hi,q) settled(1,completed) idle`` for live notifications;
``⟨step 1.1⟩``, ``tick(wake)``, ``flush(1)`` for effects, ``abort(user)`` and ``release``
for controls (`trace_tokens`). This module is the one renderer of the notation: the test
harness (``tests/scenario_helpers.py``) uses it too.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from machine.checking.invariants import AgentInvariantError, InvariantMonitor
from machine.checking.scripted import HOLD, Driver, ScriptedEnvironment
from machine.conformance.recorder import RecordingCore
from machine.conformance.vectors import Vector
from machine.core import CoreConfig, ToolMode
from machine.events import Event
from machine.io import Control, Durable, Effect, Live, Observer, Output
from machine.jsonvalue import JsonLike, thaw
from machine.vocabulary import (
    ABORTED_BEFORE_DISPATCH_TEXT,
    ABORTED_TEXT,
    ErrorInfo,
    LlmFailure,
    Message,
)

__all__ = [
    "HOLD", "PUBLICATION", "REGISTRY", "TAGS", "Scenario", "Session",
    "calls", "check_log", "content_label", "control", "control_token", "durable", "effect",
    "effect_token", "error", "event_token", "live", "live_token", "log_tokens", "message_label",
    "model_failure", "notation", "output_token", "reason_label", "reply", "result", "scenario",
    "source", "source_label", "text_of", "trace_tokens",
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
# Notation: the one renderer (the scenario tests' harness, tests/scenario_helpers.py, uses it)
# --------------------------------------------------------------------------

_OPEN, _CLOSE = "([{⟨", ")]}⟩"


def notation(text: str) -> list[str]:
    """Split notation into tokens: whitespace separates tokens only outside quotes and
    brackets (so ``UM('file changed: a.ts';plugin:watcher)`` is one token); whitespace after
    ``,`` or ``;`` inside brackets is dropped, so ``TS(1, msg:user)`` and the rendered
    ``TS(1,msg:user)`` agree."""
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


def _json(message: Mapping[str, Any] | Message) -> Any:
    return message.to_json() if isinstance(message, Message) else thaw(message)  # type: ignore[arg-type]


def _fmt(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    if isinstance(value, str):
        return f"'{value}'"
    return str(value)


def source_label(src: Mapping[str, Any]) -> str:
    """``plugin:NAME`` for a plugin source with nothing else, else the source's kind."""
    if src.get("kind") == "plugin" and set(src) == {"kind", "plugin"}:
        return f"plugin:{src['plugin']}"
    return str(src.get("kind"))


def content_label(content: Sequence[Any]) -> str:
    """``'text'`` for text blocks, ``call ID`` for tool calls, ``TR:ID`` for tool results,
    joined by ``+``; ``[]`` when empty."""
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


def text_of(message: Mapping[str, Any] | Message) -> str:
    """The text of a message's text blocks, joined."""
    m = _json(message)
    return "".join(str(b.get("text", "")) for b in m.get("content", []) if b.get("type") == "text")


def message_label(message: Mapping[str, Any] | Message) -> str:
    """A request/history message: its content label, with ``;SOURCE`` for user-role messages
    of another source than the user or a tool (assistant and tool-result messages are
    recognisable by their content)."""
    m = _json(message)
    label = content_label(m["content"])
    src = m.get("source", {})
    if m.get("role") == "user" and src.get("kind") not in ("user", "tool"):
        label += ";" + source_label(src)
    return label


def reason_label(reason: Mapping[str, Any]) -> str:
    """A turn's end reason in full (``TE`` shows its kind only): its kind; an error with its facts,
    ``error{step:1,message:'boom',code:'X'}`` or ``error{step:1,failure:{message:…,code:…}}``."""
    kind = reason["kind"]
    if kind != "error":
        return str(kind)
    fields = [f"{key}:{_fmt(reason[key])}" for key in ("step", "message", "code") if key in reason]
    if "failure" in reason:
        failure = reason["failure"]
        ordered = {k: failure[k] for k in ("message", "code", "status", "providerRetryAfterMs",
                                             "requestId") if k in failure}
        fields.append(f"failure:{_fmt(ordered)}")
    return "error{" + ",".join(fields) + "}"


#: The notation's tag of each core event type.
TAGS: Final[dict[str, str]] = {
    "turn/start": "TS", "turn/end": "TE", "step/start": "SS", "step/end": "SE",
    "user/message": "UM", "steering/message": "STM", "request/header": "RH",
    "assistant/chunk": "CH", "assistant/message": "AM", "tool/call": "TC", "tool/result": "TR",
}


def event_token(event: Event) -> str:
    """One durable event: ``TS(1,msg:user)``, ``UM('hi';plugin:p)``, ``TE(1,completed)`` (the
    reason's kind: `reason_label` renders it in full) …; an extension event is its type."""
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
        return f"{TAGS[t]}({d['turn']}.{d['step']})"
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
        kept = ";interrupted" if d.get("interrupted") is True else ""      # D15
        return f"AM({d['turn']}.{d['step']};{content_label(d['message']['content'])}{kept})"
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


def log_tokens(events: Sequence[Event], *, collapse_chunks: bool = True) -> list[str]:
    """The log in notation. A run of several chunks ending with the finish chunk is ``CH…``;
    a lone chunk, and each chunk of an unfinished stream, is ``CH`` (every chunk is ``CH``
    without *collapse_chunks*)."""
    tokens: list[str] = []
    i = 0
    while i < len(events):
        if collapse_chunks and events[i].type == "assistant/chunk":
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
    """One live notification: ``enq(hi,q)``, ``running``, ``settled(1,completed)``,
    ``warn('text')`` …; another is its type."""
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
    """One effect request: ``tick(wake)``, ``flush(1)``, ``⟨step 1.1⟩``, ``⟨execute c1⟩`` …"""
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


def control_token(output: Control) -> str:
    """A control output: ``abort(CAUSE)`` or ``release``."""
    if output.kind == "abort":
        return f"abort({thaw(output.payload)['reason']['kind']})"
    return str(output.kind)


def output_token(output: Output) -> str:
    """Any output: a durable event in brackets (``[TS(1,msg:user)]``), the others as above."""
    if isinstance(output, Durable):
        return f"[{event_token(output.event)}]"
    if isinstance(output, Live):
        return live_token(output)
    if isinstance(output, Effect):
        return effect_token(output)
    return control_token(output)




def check_log(events: Sequence[Event]) -> None:
    """What holds of every scenario's log (AssertionError otherwise): seq = index; a surface
    event appends; steps are balanced; an AM's sourceEventSeqs are its step's chunks; a TR's
    are its tool/call (a result for a tool that never started has none, L5), and its source is
    that call; a synthetic aborted result is canonical."""
    open_step: tuple[int, int] | None = None
    chunks: list[int] = []
    calls: dict[str, int] = {}
    for index, event in enumerate(events):
        assert event.seq == index, f"seq {event.seq} at index {index}"
        d = thaw(event.data)
        if event.is_surface:
            assert event.surface_op == "append", f"{event.type} at {event.seq}: {event.surface_op}"
        if event.type == "step/start":
            assert open_step is None, f"step/start at {event.seq} inside step {open_step}"
            open_step = (d["turn"], d["step"])
            chunks, calls = [], {}
        elif event.type == "step/end":
            assert open_step == (d["turn"], d["step"]), f"step/end at {event.seq}"
            open_step = None
        elif event.type == "assistant/chunk":
            chunks.append(event.seq)
        elif event.type == "assistant/message":
            assert list(event.source_event_seqs or ()) == chunks, (
                f"AM at {event.seq}: sourceEventSeqs {event.source_event_seqs} != chunks {chunks}")
        elif event.type == "tool/call":
            calls[str(d["callId"])] = event.seq
        elif event.type == "tool/result":
            block = d["message"]["content"][0]
            call_id = str(block["toolCallId"])
            err = d.get("error")
            if call_id in calls:
                assert list(event.source_event_seqs or ()) == [calls[call_id]], f"TR at {event.seq}"
            else:   # L5: only a result for a tool that never started needs no tool/call
                assert err is not None and err.get("code") == "TOOL_NOT_STARTED", f"TR at {event.seq}"
            assert d["message"]["source"] == {"kind": "tool", "callId": call_id}
            if err is not None and err.get("code") in ("ABORTED_BEFORE_DISPATCH", "ABORTED"):
                text = (ABORTED_BEFORE_DISPATCH_TEXT if err["code"] == "ABORTED_BEFORE_DISPATCH"
                        else ABORTED_TEXT)
                assert err == {"name": "AbortError", "code": err["code"]}, err
                assert block["isError"] is True
                assert block["content"] == [{"type": "text", "text": text}], block
    assert open_step is None or events[-1].type != "turn/end"


#: The publication notices (P11), left out of traces unless asked for.
PUBLICATION: Final = frozenset({"session/created", "agent/created", "agent/session-start"})


def trace_tokens(outputs: Iterable[Output], durable: Iterable[str] | str = "*",
                 effects: Iterable[str] | str = "*", *, controls: bool = True,
                 publication: bool = False) -> list[str]:
    """Outputs in order, as `output_token`: every live notification (the publication notices
    only with *publication*), the durable events whose tags (`TAGS`; an extension event's
    type) are in *durable*, the effects whose kinds are in *effects* (``'*'``: all of them)
    and, with *controls*, the control outputs."""
    tags = None if durable == "*" else set(durable)
    kinds = None if effects == "*" else set(effects)
    tokens: list[str] = []
    for output in outputs:
        if isinstance(output, Live):
            if output.event.type in PUBLICATION and not publication:
                continue
        elif isinstance(output, Durable):
            if tags is not None and TAGS.get(output.event.type, output.event.type) not in tags:
                continue
        elif isinstance(output, Effect):
            if kinds is not None and output.kind not in kinds:
                continue
        elif not controls:
            continue
        tokens.append(output_token(output))
    return tokens


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

    def attempt(self, command: Callable[[], object]) -> str | None:
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

    def log(self, *, collapse_chunks: bool = True) -> list[str]:
        return log_tokens(self.events(), collapse_chunks=collapse_chunks)

    def types(self) -> list[str]:
        return [e.type for e in self.events()]

    def of(self, type_: str) -> list[Event]:
        """The logged events of *type_*."""
        return [e for e in self.events() if e.type == type_]

    def payloads(self, *types: str) -> list[dict[str, Any]]:
        """The payloads of the live notifications of these types (all, without *types*)."""
        return [thaw(o.event.payload) for o in self.outputs if isinstance(o, Live)
                and (not types or o.event.type in types)]

    def user_texts(self) -> list[str]:
        """The text of every logged user/message, in order."""
        return [text_of(d) for d in self.data("user/message")]

    def history(self) -> list[str]:
        """The message history the log derives now, as message labels."""
        return [message_label(m) for m in self.core.log.derive_messages()]

    def live(self, *types: str, publication: bool = False) -> list[str]:
        return [live_token(o) for o in self.outputs if isinstance(o, Live)
                and (publication or o.event.type not in PUBLICATION)
                and (not types or o.event.type in types)]

    def trace(self, durable: Iterable[str] | str = "*", effects: Iterable[str] | str = "*", *,
              controls: bool = True, publication: bool = False, since: int = 0) -> list[str]:
        """The outputs from the *since*-th on, in order (`trace_tokens`): by default every
        live notification but the publication notices, every ``[durable]`` event, effect and
        control; *durable* and *effects* narrow them to these tags and kinds."""
        return trace_tokens(self.outputs[since:], durable, effects, controls=controls,
                            publication=publication)

    def effects(self, kind: str | None = None) -> list[Effect]:
        return self.driver.effects(kind)

    def requests(self) -> list[list[str]]:
        """The message list of each model request, as message labels."""
        return [[message_label(m) for m in (e.history or ())]
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

    def review(self) -> Session:
        """Play the scenario and review it: its own assertions, the agent invariants at every
        input and output (R20.1, `Session`), then what holds of every log (`check_log`).
        AssertionError (or AgentInvariantError) if the review fails; the session."""
        session = self.play()
        check_log(session.events())
        return session

    def build(self) -> Vector:
        """Play and review the scenario (AssertionError if the review fails); the vector."""
        return self.review().vector(self.id, self.title, self.rules, self.tags)


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
