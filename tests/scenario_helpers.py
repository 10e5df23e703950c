"""Shared helpers for the reference-scenario tests (scenarios.md) and the §19 reentrancy matrix.

`Scenario` wraps one `AgentCore` with the scripted `Driver` and `ScriptedEnvironment`
and adds:

* message builders and command shortcuts (``followup('hi')``, ``inject('c', 'plugin:p')``);
* observer and hook helpers: ``observe(type, cb)`` registers an output observer (a log or
  live observer, which may issue commands at exactly that output); ``handle(kind, fn)``
  installs a hook point (an environment handler for that effect kind); ``hold(kind)``
  makes the environment hold an effect so the test answers it later;
* renderers in the scenario notation: ``log()`` renders the durable log as tokens such as
  ``TS(1,msg:user) UM('hi') SS(1.1) RH(initial) CH… AM(1.1;'hello there') SE(1.1)
  TE(1,completed)`` and ``trace()`` renders outputs in order (live notifications, and the
  durable events and effects asked for);
* `L`, which splits a notation string into tokens, so a test asserts
  ``s.log() == L("TS(1,msg:user) UM('hi') ...")``;
* ``check()``, which asserts the invariants that hold for every scenario (contiguous seqs,
  the ``sourceEventSeqs`` of every AM and TR, the canonical synthetic tool results, balanced
  steps, status alternation, inbox conservation).

Observer failures are the driver's business in the sans-I/O design: the core never sees
them. ``observe(..., contained=True)`` contains a raising observer the way a driver would
(the failure is recorded in ``contained_warnings``), so a scenario can assert that the
core's outputs are unaffected.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from machine.core import AgentCore, CoreConfig
from machine.events import Event
from machine.io import Durable, Effect, Live, Output
from machine.jsonvalue import FrozenDict, FrozenList, JsonLike, thaw
from machine.log import SessionLog
from machine.scripted import HOLD, Driver, ScriptedEnvironment, ok_result, text_reply
from machine.vocabulary import ErrorInfo, Message

# --------------------------------------------------------------------------
# Sources and messages
# --------------------------------------------------------------------------

USER: dict[str, JsonLike] = {"kind": "user"}


def source(spec: str | Mapping[str, JsonLike] | None) -> dict[str, JsonLike]:
    """``None``/``'user'`` → {kind:'user'}; ``'plugin:NAME'`` → {kind:'plugin', plugin:NAME};
    any other string is a bare kind; a mapping is copied."""
    if spec is None or spec == "user":
        return dict(USER)
    if isinstance(spec, str):
        if spec.startswith("plugin:"):
            return {"kind": "plugin", "plugin": spec[len("plugin:"):]}
        return {"kind": spec}
    return dict(spec)


_ids = itertools.count(1)


def msg(text: str, src: str | Mapping[str, JsonLike] | None = None, *,
        id: str | None = None) -> dict[str, JsonLike]:
    """A plain (mutable) well-formed user message with one text block."""
    return {"id": id if id is not None else f"m{next(_ids)}", "role": "user",
            "content": [{"type": "text", "text": text}], "source": source(src)}


def as_msg(value: str | Mapping[str, JsonLike] | Message,
           src: str | Mapping[str, JsonLike] | None = None) -> JsonLike:
    if isinstance(value, str):
        return msg(value, src)
    return value  # type: ignore[return-value]


def reply_text(text: str, *, finish: str = "stop", usage: JsonLike = None) -> list[JsonLike]:
    """A text reply with the given finish kind (and a usage chunk before it, rule V18)."""
    chunks: list[JsonLike] = [{"type": "text", "text": text}]
    if usage is not None:
        chunks.append({"type": "usage", "usage": usage})
    chunks.append({"type": "finish", "kind": finish})
    return chunks


def result_with_contexts(text: str, *contexts: Mapping[str, JsonLike], **extra: JsonLike
                         ) -> dict[str, JsonLike]:
    return ok_result(text, additionalContexts=[dict(c) for c in contexts], **extra)


# --------------------------------------------------------------------------
# The notation
# --------------------------------------------------------------------------

_OPEN = "([{⟨"
_CLOSE = ")]}⟩"


def L(notation: str) -> list[str]:
    """Split a notation string into tokens: whitespace separates tokens only outside
    quotes and brackets, so ``UM('file changed: a.ts';plugin:watcher)`` is one token.
    Whitespace right after ``;`` or ``,`` inside brackets is dropped, so the scenario
    spelling ``TS(1, msg:user)`` and the rendered ``TS(1,msg:user)`` agree."""
    tokens: list[str] = []
    current: list[str] = []
    depth = 0
    quoted = False
    for ch in notation:
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
    assert depth == 0 and not quoted, f"unbalanced notation: {notation!r}"
    return tokens


def _q(text: str) -> str:
    return f"'{text}'"


def _fmt(value: Any) -> str:
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_fmt(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_fmt(v) for v in value) + "]"
    if isinstance(value, str):
        return _q(value)
    return str(value)


def source_label(src: Mapping[str, Any]) -> str:
    kind = src.get("kind")
    if kind == "plugin" and set(src) == {"kind", "plugin"}:
        return f"plugin:{src['plugin']}"
    return str(kind)


def content_label(content: Sequence[Any]) -> str:
    """``'text'`` for text blocks, ``call ID`` for tool calls, ``TR:ID`` for tool results,
    joined by ``+``; ``[]`` when empty."""
    parts: list[str] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            parts.append(_q(str(block.get("text"))))
        elif kind == "tool-call":
            parts.append(f"call {block.get('id')}")
        elif kind == "tool-result":
            parts.append(f"TR:{block.get('toolCallId')}")
        else:
            parts.append(str(kind))
    return "+".join(parts) if parts else "[]"


def message_label(message: Mapping[str, Any] | Message) -> str:
    """A request/history message: its content label, with ``;SOURCE`` for non-user sources
    of user-role messages (assistant and tool-result messages are recognisable by content)."""
    m = message.to_json() if isinstance(message, Message) else thaw(message)
    label = content_label(m["content"])
    if m["role"] == "user" and m["source"].get("kind") not in ("user", "tool"):
        label += ";" + source_label(m["source"])
    return label


def message_text(message: Mapping[str, Any] | Message) -> str:
    m = message.to_json() if isinstance(message, Message) else thaw(message)
    return "".join(str(b.get("text", "")) for b in m["content"] if b.get("type") == "text")


def reason_label(reason: Mapping[str, Any]) -> str:
    kind = reason["kind"]
    if kind != "error":
        return str(kind)
    fields: list[str] = []
    for key in ("step", "message", "code"):
        if key in reason:
            fields.append(f"{key}:{_fmt(reason[key])}")
    if "failure" in reason:
        failure = reason["failure"]
        ordered = {k: failure[k] for k in ("message", "code", "status", "providerRetryAfterMs",
                                             "requestId") if k in failure}
        fields.append(f"failure:{_fmt(ordered)}")
    return "error{" + ",".join(fields) + "}"


TAGS: dict[str, str] = {
    "turn/start": "TS", "turn/end": "TE", "step/start": "SS", "step/end": "SE",
    "user/message": "UM", "steering/message": "STM", "request/header": "RH",
    "assistant/chunk": "CH", "assistant/message": "AM", "tool/call": "TC", "tool/result": "TR",
}


def event_token(event: Event) -> str:
    d = thaw(event.data)
    t = event.type
    if t == "turn/start":
        trigger = d["trigger"]
        if trigger["kind"] == "message":
            return f"TS({d['turn']},msg:{trigger['source']['kind']})"
        return f"TS({d['turn']},{trigger['kind']})"
    if t == "turn/end":
        return f"TE({d['turn']},{reason_label(d['reason'])})"
    if t in ("step/start", "step/end"):
        return f"{TAGS[t]}({d['turn']}.{d['step']})"
    if t == "user/message":
        label = content_label(d["content"])
        if d["source"] != USER:
            label += ";" + source_label(d["source"])
        return f"UM({label})"
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
        error = d.get("error")
        if error is None:
            block = d["message"]["content"][0]
            outcome = "ERR" if block.get("isError") else "ok"
        elif error.get("code") == "ABORTED_BEFORE_DISPATCH":
            outcome = "ERR ABD"
        elif error.get("code") == "ABORTED":
            outcome = "ERR ABORTED"
        else:
            outcome = f"ERR {error.get('code', error.get('name'))}"
        return f"TR({d['turn']}.{d['step']};{d['message']['content'][0]['toolCallId']};{outcome})"
    return t


def log_tokens(events: Sequence[Event], *, collapse_chunks: bool = True) -> list[str]:
    """The log in the scenario notation. A run of chunks that ends with the finish chunk is
    ``CH…``; chunks of an unfinished stream are one ``CH`` each."""
    tokens: list[str] = []
    i = 0
    while i < len(events):
        event = events[i]
        if collapse_chunks and event.type == "assistant/chunk":
            j = i
            while j < len(events) and events[j].type == "assistant/chunk":
                j += 1
            run = events[i:j]
            if run[-1].data["chunk"]["type"] == "finish":
                tokens.append("CH…")
            else:
                tokens.extend("CH" for _ in run)
            i = j
            continue
        tokens.append(event_token(event))
        i += 1
    return tokens


def _messages_label(messages: Iterable[Any]) -> str:
    return ",".join(message_text(m) for m in messages)


def live_token(live: Live) -> str:
    p = thaw(live.event.payload)
    t = live.event.type
    if t in ("agent/inbox/enqueue", "agent/inbox/dequeue"):
        short = "enq" if t.endswith("enqueue") else "deq"
        return f"{short}({message_text(p['message'])},{p['placement'][0]})"
    if t == "agent/inbox/discard":
        return f"disc[{_messages_label(p['messages'])}]"
    if t == "agent/context/discard":
        return f"ctxdisc[{_messages_label(p['messages'])}]"
    if t == "agent/status":
        return str(p["status"])
    if t == "agent/cancel-requested":
        return f"cancel-req({p['cause']['kind']})"
    if t == "agent/settled":
        return f"settled({p['turn']},{p['reason']['kind']})"
    if t == "agent/error":
        return f"error({p['turn']},{p['step']},{_q(p['error']['message'])})"
    if t == "agent/warning":
        return f"warn({p['text']})"
    if t == "agent/session-start":
        return f"session-start({p['source']})"
    return t


def effect_token(effect: Effect) -> str:
    p = thaw(effect.payload)
    k = effect.kind
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


PUBLICATION = frozenset({"session/created", "agent/created", "agent/session-start"})


def output_token(output: Output) -> str:
    if isinstance(output, Durable):
        return f"[{event_token(output.event)}]"
    if isinstance(output, Live):
        return live_token(output)
    if isinstance(output, Effect):
        return effect_token(output)
    if output.kind == "abort":
        return f"abort({output.payload['reason']['kind']})"
    return "release"


# --------------------------------------------------------------------------
# The scenario harness
# --------------------------------------------------------------------------

Handler = Callable[[Effect], Any]


class Scenario:
    """One agent over a fresh (or seeded) session, driven by the scripted driver."""

    def __init__(self, *replies: Sequence[JsonLike] | ErrorInfo | str,
                 config: CoreConfig | None = None, log: SessionLog | None = None,
                 tool_modes: Mapping[str, str] | None = None) -> None:
        if config is None:
            config = CoreConfig(tool_modes=dict(tool_modes or {}))  # type: ignore[arg-type]
        self.core = AgentCore(config, log=log)
        self.env = ScriptedEnvironment(replies=[text_reply(r) if isinstance(r, str) else r
                                                for r in replies])
        self.driver = Driver(self.core, self.env)
        self.contained_warnings: list[str] = []

    # -- commands ------------------------------------------------------------
    def followup(self, text: str | Mapping[str, JsonLike], src: str | None = None) -> None:
        self.core.followup(as_msg(text, src))

    def steer(self, text: str | Mapping[str, JsonLike], src: str | None = None) -> None:
        self.core.steer(as_msg(text, src))

    def inject(self, text: str | Mapping[str, JsonLike], src: str | None = "plugin:test") -> None:
        self.core.inject(as_msg(text, src))

    def send(self, text: str | Mapping[str, JsonLike], target: str, wakeup: bool,
             src: str | None = None) -> None:
        self.core.send(as_msg(text, src), {"target": target, "wakeup": wakeup})

    def cancel(self, kind: str = "user", keep_inbox: bool = False) -> None:
        self.core.cancel({"kind": kind}, keep_inbox)

    def dispose(self) -> None:
        self.core.dispose()

    # -- running -----------------------------------------------------------------
    def pump(self) -> None:
        self.driver.pump()

    def run(self) -> Scenario:
        self.driver.run()
        return self

    # -- observers and hook points -------------------------------------------------
    def observe(self, type_: str, callback: Callable[[FrozenDict], None], *, once: bool = False,
                contained: bool = False) -> None:
        """An observer of the durable event or live notification *type_* (data/payload)."""
        if contained:
            inner = callback

            def callback(data: FrozenDict) -> None:
                try:
                    inner(data)
                except Exception as exc:   # the driver contains observer failures (§0.1)
                    self.contained_warnings.append(f"observer of {type_} failed: {exc}")
        self.driver.on_event(type_, callback, once=once)

    def on_output(self, callback: Callable[[Output], None]) -> None:
        self.driver.on(callback)

    def handle(self, kind: str, fn: Handler, *, times: int | None = None,
               when: Callable[[Effect], bool] | None = None) -> None:
        """Install a hook point for *kind*. *fn* returns an answer (None = the default).
        With *times*, only the first *times* matching invocations reach *fn*."""
        count = {"n": 0}

        def handler(effect: Effect) -> Any:
            if when is not None and not when(effect):
                return None
            if times is not None and count["n"] >= times:
                return None
            count["n"] += 1
            return fn(effect)
        self.env.handlers[kind] = handler

    def unhandle(self, kind: str) -> None:
        self.env.handlers.pop(kind, None)

    def hold(self, kind: str, *, times: int | None = 1,
             when: Callable[[Effect], bool] | None = None) -> None:
        self.handle(kind, lambda _e: HOLD, times=times, when=when)

    def take(self, kind: str) -> Effect:
        return self.driver.take_held(kind)

    def resolve(self, kind: str, value: JsonLike = None) -> Scenario:
        self.driver.resolve(kind, value)
        return self.run()

    def fail(self, kind: str, error: ErrorInfo) -> Scenario:
        self.driver.fail(kind, error)
        return self.run()

    def hang_model(self) -> Effect:
        """The held model call yields two non-finish chunks and then hangs."""
        effect = self.take("model")
        self.core.chunk(effect.id, {"type": "text", "text": "partial "})
        self.core.chunk(effect.id, {"type": "text", "text": "reply"})
        self.run()
        return effect

    def model_honours_abort(self, effect: Effect) -> Scenario:
        """The hanging model call sees its signal aborted and raises."""
        self.core.fail(effect.id, ErrorInfo("the operation was aborted", "AbortError"))
        return self.run()

    # -- views ---------------------------------------------------------------------
    @property
    def outputs(self) -> list[Output]:
        return self.driver.outputs

    @property
    def events(self) -> list[Event]:
        return list(self.core.log.events)

    def types(self) -> list[str]:
        return [e.type for e in self.events]

    def of(self, type_: str) -> list[Event]:
        return [e for e in self.events if e.type == type_]

    def log(self, *, collapse_chunks: bool = True) -> list[str]:
        return log_tokens(self.events, collapse_chunks=collapse_chunks)

    def render(self) -> str:
        return " ".join(self.log())

    def trace(self, durable: Iterable[str] | str = (), effects: Iterable[str] | str = (),
              *, controls: bool = False, publication: bool = False,
              since: int = 0) -> list[str]:
        """Outputs in order: every live notification (publication notices only if asked),
        the durable events whose tags are in *durable* (``'*'`` for all), the effects whose
        kinds are in *effects* (``'*'`` for all) and, if asked, the control outputs."""
        tags = set(TAGS.values()) if durable == "*" else set(durable)
        kinds = None if effects == "*" else set(effects)
        tokens: list[str] = []
        for output in self.outputs[since:]:
            if isinstance(output, Live):
                if output.event.type in PUBLICATION and not publication:
                    continue
            elif isinstance(output, Durable):
                if TAGS.get(output.event.type, output.event.type) not in tags:
                    continue
            elif isinstance(output, Effect):
                if kinds is not None and output.kind not in kinds:
                    continue
            elif not controls:
                continue
            tokens.append(output_token(output))
        return tokens

    def live(self, *types: str) -> list[FrozenDict]:
        return [o.event.payload for o in self.driver.live(*types)]

    def live_tokens(self, *types: str) -> list[str]:
        return [live_token(o) for o in self.driver.live(*types)]

    def statuses(self) -> list[str]:
        return [str(p["status"]) for p in self.live("agent/status")]

    def errors(self) -> list[tuple[int, int, str]]:
        return [(int(p["turn"]), int(p["step"]), str(p["error"]["message"]))  # type: ignore[index]
                for p in self.live("agent/error")]

    def warnings(self) -> list[str]:
        """Warnings from the core (agent/warning) and contained observer failures."""
        return [str(p["text"]) for p in self.live("agent/warning")] + self.contained_warnings

    def warned(self, text: str) -> bool:
        return any(text in w for w in self.warnings())

    def effects(self, kind: str | None = None) -> list[Effect]:
        return self.driver.effects(kind)

    @property
    def requests(self) -> list[Effect]:
        return self.effects("model")

    def request(self, n: int) -> list[str]:
        """Request *n* (1-based) as message labels (see `message_label`)."""
        effect = self.requests[n - 1]
        assert effect.history is not None
        return [message_label(m) for m in effect.history]

    def request_messages(self, n: int) -> list[Message]:
        history = self.requests[n - 1].history
        assert history is not None
        return list(history)

    def user_texts(self) -> list[str]:
        return [message_text(e.data) for e in self.of("user/message")]

    def history(self) -> list[str]:
        return [message_label(m) for m in self.core.log.derive_messages()]

    def reasons(self) -> list[str]:
        return [reason_label(thaw(e.data["reason"])) for e in self.of("turn/end")]

    def turn_numbers(self) -> list[int]:
        return [int(e.data["turn"]) for e in self.of("turn/start")]  # type: ignore[arg-type]

    # -- invariants ----------------------------------------------------------------
    def check(self) -> None:
        check_log(self.events)
        statuses = self.statuses()
        for i, status in enumerate(statuses):
            assert status == ("running" if i % 2 == 0 else "idle"), f"status alternation: {statuses}"
        enq = len(self.live("agent/inbox/enqueue"))
        deq = len(self.live("agent/inbox/dequeue"))
        disc = sum(len(p["messages"]) for p in self.live("agent/inbox/discard"))  # type: ignore[arg-type]
        pending = self.core.pending_queued + self.core.pending_steering
        assert enq == deq + disc + pending, (
            f"inbox conservation: enq={enq} deq={deq} disc={disc} pending={pending}")
        if self.core.status == "idle":
            assert not self.core.accepts_next_step


ABD_TEXT = "Error: tool call aborted before dispatch"
ABORTED_TEXT = "Error: tool call aborted"


def check_log(events: Sequence[Event]) -> None:
    """Invariants of every scenario log: seq = index; AM sourceEventSeqs = its step's chunks;
    TR sourceEventSeqs = [its tool/call]; canonical synthetic results; balanced steps."""
    open_step: tuple[int, int] | None = None
    chunks: list[int] = []
    calls: dict[str, int] = {}
    for index, event in enumerate(events):
        assert event.seq == index
        d = event.data
        if event.is_surface:
            assert event.surface_op == "append"
        if event.type == "step/start":
            assert open_step is None
            open_step = (d["turn"], d["step"])  # type: ignore[assignment]
            chunks, calls = [], {}
        elif event.type == "step/end":
            assert open_step == (d["turn"], d["step"])
            open_step = None
        elif event.type == "assistant/chunk":
            chunks.append(event.seq)
        elif event.type == "assistant/message":
            assert list(event.source_event_seqs or ()) == chunks, (
                f"AM at {event.seq}: sourceEventSeqs {event.source_event_seqs} != chunks {chunks}")
        elif event.type == "tool/call":
            calls[str(d["callId"])] = event.seq
        elif event.type == "tool/result":
            block = d["message"]["content"][0]  # type: ignore[index]
            call_id = str(block["toolCallId"])
            assert list(event.source_event_seqs or ()) == [calls[call_id]]
            assert d["message"]["source"] == {"kind": "tool", "callId": call_id}  # type: ignore[index]
            error = d.get("error")
            if error is not None and error.get("code") in ("ABORTED_BEFORE_DISPATCH", "ABORTED"):
                text = ABD_TEXT if error["code"] == "ABORTED_BEFORE_DISPATCH" else ABORTED_TEXT
                assert error == {"name": "AbortError", "code": error["code"]}
                assert block["isError"] is True
                assert block["content"] == FrozenList([{"type": "text", "text": text}])
    assert open_step is None or events[-1].type != "turn/end"


__all__ = [
    "ABD_TEXT",
    "ABORTED_TEXT",
    "HOLD",
    "USER",
    "CoreConfig",
    "ErrorInfo",
    "L",
    "Scenario",
    "check_log",
    "event_token",
    "log_tokens",
    "message_label",
    "message_text",
    "msg",
    "ok_result",
    "reason_label",
    "reply_text",
    "result_with_contexts",
    "source",
    "text_reply",
]


def assert_failed_step(s: Scenario, name: str, code: str, message: str) -> None:
    """R15.3 / R15.4: the turn ended with a generic failure of step 1, coded *code*, and the
    core reported the error it built (*name*, *message*) as ``agent/error`` and in
    ``agent/settled``."""
    (turn_end,) = s.of("turn/end")
    assert thaw(turn_end.data["reason"]) == {
        "kind": "error", "step": 1, "message": message, "code": code}
    (error,) = s.live("agent/error")
    assert thaw(error["error"]) == {"name": name, "message": message, "code": code}
    (settled,) = s.live("agent/settled")
    assert thaw(settled["reason"]) == {"kind": "error", "error": thaw(error["error"])}
