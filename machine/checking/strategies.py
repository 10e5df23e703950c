"""Hypothesis strategies for the vocabulary (specs/vocabulary.md) and the event envelopes.

Test support only: this module imports Hypothesis, so the library itself
(``machine/__init__.py`` and everything it loads) must never import it.
Hypothesis comes with the ``testing`` extra: ``pip install 'turnstile-agent[testing]'``.

Strategies that produce *values* (messages, options, reasons, events) return
the library's immutable types; strategies for data the environment or a caller
supplies as JSON (`json_values`, `blocks`, `sources`, `chunks`) return plain
JSON (lists and dicts), which is what the validators accept.
"""

from __future__ import annotations

import math
from typing import Any

try:
    from hypothesis import strategies as st
except ImportError as missing:  # the library itself never needs Hypothesis
    raise ImportError(
        "machine.checking.strategies needs Hypothesis, which is an optional dependency: install it with "
        "pip install 'turnstile-agent[testing]'", name=missing.name) from missing

from machine.events import (
    AGENT_CREATED,
    AGENT_DISPOSED,
    CANCEL_REQUESTED,
    CONTEXT_DISCARD,
    CORE_EVENT_TYPES,
    ERROR,
    INBOX_DEQUEUE,
    INBOX_DISCARD,
    INBOX_ENQUEUE,
    LIVE_TYPES,
    SESSION_CREATED,
    SESSION_DISPOSED,
    SESSION_START,
    SETTLED,
    STATUS,
    SURFACE_TYPES,
    WARNING,
    Event,
    LiveEvent,
)
from machine.vocabulary import (
    FOLLOWUP,
    INJECT,
    STEER,
    Allow,
    Block,
    CancelCause,
    ErrorInfo,
    LlmFailure,
    Message,
    PromptDecision,
    SendOptions,
    SettleReason,
    ToolResult,
    TurnEndReason,
    TurnTrigger,
)

#: The extension block type and source kind the strategies use (never registered, so any
#: fields are accepted: rules V3, V4).
EXTENSION_BLOCK_TYPE = "x-annotation"
EXTENSION_SOURCE_KIND = "x-scheduler"

_SHORT = 12


def _text(min_size: int = 0, max_size: int = _SHORT) -> st.SearchStrategy[str]:
    return st.text(min_size=min_size, max_size=max_size)


def _ids() -> st.SearchStrategy[str]:
    return _text(min_size=1)


def _finite_floats() -> st.SearchStrategy[float]:
    return st.floats(allow_nan=False, allow_infinity=False)


def _json_scalars() -> st.SearchStrategy[Any]:
    return st.none() | st.booleans() | st.integers() | _finite_floats() | _text()


def json_values(max_leaves: int = 8) -> st.SearchStrategy[Any]:
    """Any JSON-compatible value (rule V1) as plain data: None, bool, int, finite float,
    str, lists and str-keyed dicts, nested."""
    return st.recursive(
        _json_scalars(),
        lambda inner: st.lists(inner, max_size=3)
        | st.dictionaries(_text(max_size=6), inner, max_size=3),
        max_leaves=max_leaves)


def json_objects(max_leaves: int = 8) -> st.SearchStrategy[dict[str, Any]]:
    """A JSON object (str-keyed dict) of JSON-compatible values."""
    return st.dictionaries(_text(max_size=6), json_values(max_leaves), max_size=3)


# -- content blocks and sources (rules V3, V4) --------------------------------------------


def _flat_blocks() -> st.SearchStrategy[dict[str, Any]]:
    text_like = st.builds(lambda t, s: {"type": t, "text": s},
                          st.sampled_from(["text", "reasoning"]), _text())
    call = st.builds(lambda i, n, a: {"type": "tool-call", "id": i, "name": n, "arguments": a},
                     _ids(), _text(), _text() | st.just("{}"))
    extension = st.builds(lambda extra: {**extra, "type": EXTENSION_BLOCK_TYPE},
                          json_objects(max_leaves=3))
    return text_like | call | extension


def blocks() -> st.SearchStrategy[dict[str, Any]]:
    """A content block (rule V3) as plain JSON: text, reasoning, tool-call, tool-result
    (whose content is a list of blocks, ``isError`` only as true) or an extension type."""

    def result(call_id: str, content: list[dict[str, Any]], is_error: bool) -> dict[str, Any]:
        block: dict[str, Any] = {"type": "tool-result", "toolCallId": call_id, "content": content}
        if is_error:
            block["isError"] = True
        return block

    tool_result = st.builds(result, _ids(), st.lists(_flat_blocks(), max_size=2), st.booleans())
    return _flat_blocks() | tool_result


def _content() -> st.SearchStrategy[list[dict[str, Any]]]:
    return st.lists(blocks(), max_size=3)


def sources() -> st.SearchStrategy[dict[str, Any]]:
    """A message source (rule V4) as plain JSON: every core kind and one extension kind."""

    def model(provider: str, model_name: str, replay: Any, with_replay: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "model", "provider": provider, "model": model_name}
        if with_replay:
            out["replayState"] = replay
        return out

    return st.one_of(
        st.just({"kind": "user"}),
        st.builds(lambda r: {"kind": "user", "requestId": r}, _ids()),
        st.builds(lambda p: {"kind": "plugin", "plugin": p}, _text()),
        st.builds(model, _text(), _text(), json_values(max_leaves=3), st.booleans()),
        st.builds(lambda c: {"kind": "tool", "callId": c}, _ids()),
        st.builds(lambda extra: {**extra, "kind": EXTENSION_SOURCE_KIND},
                  json_objects(max_leaves=3)),
    )


def _model_sources() -> st.SearchStrategy[dict[str, Any]]:
    return st.builds(lambda p, m: {"kind": "model", "provider": p, "model": m}, _text(), _text())


# -- messages (rules V5–V7) ------------------------------------------------------------------


def user_messages() -> st.SearchStrategy[Message]:
    """A well-formed user message (rule V7)."""
    return st.builds(lambda i, c, s: Message(i, "user", c, s),
                     _ids(), _content(), sources())


def assistant_messages() -> st.SearchStrategy[Message]:
    """An assistant message: role assistant, source of kind model (rule V5)."""
    return st.builds(lambda i, c, s: Message(i, "assistant", c, s),
                     _ids(), _content(), _model_sources())


def messages() -> st.SearchStrategy[Message]:
    """Any message: user, assistant or system role."""
    system = st.builds(lambda i, c, s: Message(i, "system", c, s),
                       _ids(), _content(), sources())
    return user_messages() | assistant_messages() | system


@st.composite
def invalid_user_messages(draw: st.DrawFn) -> tuple[Any, str]:
    """A malformed user message in JSON form (rule V7, reference D5) paired with a substring
    of the field path its `ValidationError` must name."""
    base: dict[str, Any] = draw(user_messages()).to_json()
    case = draw(st.sampled_from([
        "non-json", "non-json-source", "empty-id", "missing-id", "non-str-id", "wrong-role",
        "no-source", "source-not-mapping", "no-kind", "empty-kind", "content-not-list",
        "block-without-type", "block-not-mapping", "extra-field",
    ]))
    if case == "non-json":
        bad = draw(st.sampled_from([
            {1, 2}, frozenset({"a"}), math.nan, math.inf, -math.inf, ("a", "b"), b"bytes",
            {1: "non-str key"}, object(),
        ]))
        base["content"] = [{"type": "text", "text": bad}]
        return base, "message.content[0].text"
    if case == "non-json-source":
        base["source"] = {"kind": "user", "note": draw(st.sampled_from([math.nan, {1}, b"x"]))}
        return base, "message.source"
    if case == "empty-id":
        base["id"] = ""
        return base, "message.id"
    if case == "missing-id":
        del base["id"]
        return base, "message.id"
    if case == "non-str-id":
        base["id"] = draw(st.sampled_from([None, 7, ["a"]]))
        return base, "message.id"
    if case == "wrong-role":
        base["role"] = draw(st.sampled_from(["assistant", "system", "bot", "", None]))
        return base, "message.role"
    if case == "no-source":
        del base["source"]
        return base, "message.source"
    if case == "source-not-mapping":
        base["source"] = draw(st.sampled_from(["user", None, ["user"]]))
        return base, "message.source"
    if case == "no-kind":
        base["source"] = {"plugin": "p"}
        return base, "message.source"
    if case == "empty-kind":
        base["source"] = {"kind": draw(st.sampled_from(["", None, 3]))}
        return base, "message.source"
    if case == "content-not-list":
        base["content"] = draw(st.sampled_from(["hello", {"type": "text", "text": "x"},
                                                ({"type": "text", "text": "x"},), None]))
        return base, "message.content"
    if case == "block-without-type":
        base["content"] = [{"type": "text", "text": "ok"}, {"text": "no type"}]
        return base, "message.content[1]"
    if case == "block-not-mapping":
        base["content"] = ["just a string"]
        return base, "message.content[0]"
    base["context"] = "not a message field"
    return base, "message"


# -- options, causes, failures, errors (rules V10, V11, V14, V15) ----------------------------


def send_options() -> st.SearchStrategy[SendOptions]:
    """The presets and the one combination without a preset (rule V10)."""
    return st.sampled_from([FOLLOWUP, STEER, INJECT, SendOptions("next-turn", False)])


def cancel_causes(*, with_disposed: bool = True) -> st.SearchStrategy[CancelCause]:
    kinds = ["user", "parent", "disposed"] if with_disposed else ["user", "parent"]
    return st.sampled_from([CancelCause(k) for k in kinds])  # type: ignore[arg-type]


def llm_failures() -> st.SearchStrategy[LlmFailure]:
    return st.builds(
        LlmFailure, _text(), _text(),
        st.none() | st.integers(min_value=100, max_value=599),
        st.none() | st.integers(min_value=0, max_value=10**7)
        | st.floats(min_value=0, max_value=1e7),
        st.none() | _ids())


def error_infos() -> st.SearchStrategy[ErrorInfo]:
    return st.builds(
        ErrorInfo, message=_text(), name=_text(min_size=1), code=st.none() | _text(min_size=1),
        causes=st.lists(_text(), max_size=3).map(tuple), failure=st.none() | llm_failures())


# -- environment-supplied values (rules V16–V18) ---------------------------------------------


def tool_results() -> st.SearchStrategy[ToolResult]:
    error = st.none() | st.builds(
        lambda name, extra: {**extra, "name": name}, _text(min_size=1), json_objects(3))
    return st.builds(
        ToolResult, content=_content(), is_error=st.booleans(), error=error,
        additional_contexts=st.lists(user_messages(), max_size=2).map(tuple),
        concludes_turn=st.booleans(), meta=json_values(max_leaves=4))


def prompt_decisions() -> st.SearchStrategy[PromptDecision]:
    allow = st.builds(Allow, content=st.none() | _content(),
                      additional_contexts=st.lists(user_messages(), max_size=2).map(tuple))
    return allow | st.builds(Block, _text())


def chunks() -> st.SearchStrategy[dict[str, Any]]:
    """A valid model chunk (rule V18) as plain JSON: text and reasoning, a tool call, a usage
    chunk, or a finish chunk of each kind (a failure for error, optional for aborted; an
    optional replayState)."""
    usage = st.fixed_dictionaries(
        {"inputTokens": st.integers(min_value=0), "outputTokens": st.integers(min_value=0)})
    failure_json = llm_failures().map(LlmFailure.to_json)

    def finish(kind: str, failure: Any, replay: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "finish", "kind": kind}
        if failure is not None:
            out["failure"] = failure
        if replay is not None:
            out["replayState"] = replay
        return out

    replay_states = st.none() | json_objects(2)
    finish_chunks = st.one_of(
        st.builds(finish, st.sampled_from(["stop", "max-tokens"]), st.none(), replay_states),
        st.builds(finish, st.just("error"), failure_json, st.none()),
        st.builds(finish, st.just("aborted"), st.none() | failure_json, st.none()))
    texts = st.builds(lambda t, s: {"type": t, "text": s},
                      st.sampled_from(["text", "reasoning"]), _text())
    calls = st.builds(lambda i, n, a: {"type": "tool-call", "id": i, "name": n, "arguments": a},
                      _ids(), _text(), _text())
    usages = usage.map(lambda u: {"type": "usage", "usage": u})
    return texts | calls | usages | finish_chunks


# -- loop-written records (rules V13, V19, V20) ----------------------------------------------


def turn_triggers() -> st.SearchStrategy[TurnTrigger]:
    return st.one_of(
        st.just(TurnTrigger("retry")),
        st.builds(lambda k, s: TurnTrigger(k, s),
                  st.sampled_from(["message", "injection"]), sources()))


def turn_end_reasons() -> st.SearchStrategy[TurnEndReason]:
    simple = st.sampled_from(["completed", "aborted", "disposed", "max-tokens", "interrupted"])
    steps = st.integers(min_value=0, max_value=50)
    return st.one_of(
        simple.map(TurnEndReason),  # type: ignore[arg-type]
        st.builds(TurnEndReason.request_failure, steps, llm_failures()),
        st.builds(TurnEndReason.failed, steps, _text(), st.none() | _text(min_size=1)))


def settle_reasons() -> st.SearchStrategy[SettleReason]:
    return st.one_of(
        st.sampled_from([SettleReason("completed"), SettleReason("aborted")]),
        st.builds(SettleReason, st.just("error"), error_infos(), st.none() | llm_failures()))


# -- envelopes (rules E1–E3) -----------------------------------------------------------------

EXTENSION_EVENT_TYPE = "x-telemetry/sample"


@st.composite
def events(draw: st.DrawFn) -> Event:
    """An `Event` of any core type or an extension type with a well-shaped envelope
    (surfaceOp exactly on surface types). Not necessarily valid as part of a log."""
    kind = draw(st.sampled_from([*sorted(CORE_EVENT_TYPES), EXTENSION_EVENT_TYPE]))
    seq = draw(st.integers(min_value=0, max_value=10**6))
    time = draw(st.integers(min_value=0, max_value=2**53)
                | st.floats(min_value=0, max_value=1e13))
    if kind == "user/message":
        data: dict[str, Any] = draw(user_messages()).to_json()
    else:
        data = draw(json_objects(max_leaves=6))
    op: Any = None
    seqs: list[int] | None = None
    if kind in SURFACE_TYPES:
        start = draw(st.integers(min_value=0, max_value=seq))
        end = draw(st.integers(min_value=start, max_value=max(seq, start)))
        op = draw(st.sampled_from(["append", {"op": "replace", "start": start, "end": end}]))
        if draw(st.booleans()):
            seqs = draw(st.lists(st.integers(min_value=0, max_value=max(seq - 1, 0)),
                                 max_size=4))
    return Event(kind, seq, time, data, op, seqs)  # type: ignore[arg-type]


def _live_payloads(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    message = user_messages().map(Message.to_json)
    turns = st.integers(min_value=1, max_value=100)
    shapes: dict[str, st.SearchStrategy[dict[str, Any]]] = {
        STATUS: st.fixed_dictionaries({"status": st.sampled_from(["idle", "running"])}),
        INBOX_ENQUEUE: st.fixed_dictionaries(
            {"message": message, "placement": st.sampled_from(["queued", "steering"])}),
        INBOX_DISCARD: st.fixed_dictionaries({"messages": st.lists(message, min_size=1,
                                                                   max_size=3)}),
        CANCEL_REQUESTED: st.fixed_dictionaries(
            {"cause": cancel_causes(with_disposed=False).map(CancelCause.to_json)}),
        SETTLED: st.fixed_dictionaries(
            {"turn": turns, "reason": settle_reasons().map(SettleReason.to_json)}),
        ERROR: st.fixed_dictionaries(
            {"turn": turns, "step": st.integers(min_value=0, max_value=20),
             "error": error_infos().map(ErrorInfo.to_json)}),
        WARNING: st.fixed_dictionaries({"text": _text()}),
        SESSION_START: st.fixed_dictionaries(
            {"source": st.sampled_from(["startup", "resume"])}),
    }
    shapes[INBOX_DEQUEUE] = shapes[INBOX_ENQUEUE]
    shapes[CONTEXT_DISCARD] = shapes[INBOX_DISCARD]
    for empty in (AGENT_CREATED, AGENT_DISPOSED, SESSION_CREATED, SESSION_DISPOSED):
        shapes[empty] = st.just({})
    return shapes[kind]


@st.composite
def live_events(draw: st.DrawFn) -> LiveEvent:
    """A `LiveEvent` of a catalogued type (rule E3) with its payload fields, optionally
    preceded by the emitting agent's id."""
    kind = draw(st.sampled_from(sorted(LIVE_TYPES)))
    payload = draw(_live_payloads(kind))
    if draw(st.booleans()):
        payload = {"agent": draw(_ids()), **payload}
    return LiveEvent(kind, payload)  # type: ignore[arg-type]
