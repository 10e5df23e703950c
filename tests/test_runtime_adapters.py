"""The provider adapters through the real SDKs against the local fake server (specs/runtime.md
RT15): recorded and scripted SSE on 127.0.0.1, never the network."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final

import pytest
from scenario_helpers import obj, string

from machine.errors import ValidationError
from machine.events import Event
from machine.jsonvalue import thaw
from machine.payloads import AssistantMessageData, ToolCallData, TurnEndData
from machine.runtime import Agent, ModelAdapter, Tool, ToolCall, retry_request
from machine.runtime.adapters.anthropic import SIGNATURE, AnthropicMessages, to_anthropic_messages
from machine.runtime.adapters.common import (
    NO_KEY,
    classify_status,
    closing_chunks,
    context_label,
    retry_after_ms,
    usage,
)
from machine.runtime.adapters.fake_server import (
    FakeServer,
    RecordedRequest,
    Reply,
    anthropic_text,
    anthropic_tool_calls,
    openai_text,
    openai_tool_calls,
    sse_event,
)
from machine.runtime.adapters.openai import OpenAIChat, to_openai_messages
from machine.runtime.retry import RetryPolicy
from machine.vocabulary import Message, plugin_source, user_message

SSE = Path(__file__).parent / "fixtures" / "sse"


async def _read(call: ToolCall) -> str:
    return f"contents of {call.arg('path', str)}"


READ = Tool("read", _read, "parallel", "Read a file.",
            {"type": "object", "properties": {"path": {"type": "string"}}})


def converse(replies: Sequence[Reply], make: Callable[[FakeServer], ModelAdapter],
             prompts: Sequence[str] = ("hi",), *, tools: Sequence[Tool] = (READ,),
             setup: Callable[[Agent], object] | None = None
             ) -> tuple[list[Event], list[RecordedRequest]]:
    """Run *prompts* through an agent on *make(server)*; the log and the requests."""
    async def main() -> tuple[list[Event], list[RecordedRequest]]:
        async with FakeServer(replies) as server:
            async with Agent(make(server), tools=tools, system="be brief") as agent:
                if setup is not None:
                    setup(agent)
                for prompt in prompts:
                    agent.followup(prompt)
                await agent.when_idle(timeout=60)
                events = list(agent.session.events)
            return events, server.requests
    return asyncio.run(main())


def openai(server: FakeServer) -> OpenAIChat:
    return OpenAIChat("fake-model", base_url=server.openai_base_url, provider="fakeai")


def claude(server: FakeServer) -> AnthropicMessages:
    return AnthropicMessages("fake-claude", base_url=server.base_url)


def of(events: list[Event], type_: str) -> list[Event]:
    return [e for e in events if e.type == type_]


def ends(events: list[Event]) -> list[TurnEndData]:
    return [e.data_as(TurnEndData) for e in of(events, "turn/end")]


def failure_of(events: list[Event]) -> dict[str, Any]:
    reason = ends(events)[-1].reason
    assert reason.kind == "error" and reason.failure is not None, reason
    return reason.failure.to_json()


# --------------------------------------------------------------------------
# OpenAI-compatible: recorded streams
# --------------------------------------------------------------------------


def test_RT15_openai_streams_text_deltas_and_reports_usage_from_a_recorded_stream() -> None:
    events, requests = converse([Reply.from_file(SSE / "openai-text.sse")], openai)
    chunks = [obj(e.data["chunk"]) for e in of(events, "assistant/chunk")]
    assert [c["text"] for c in chunks if c["type"] == "text"] == ["The file", " says hello", "."]
    message = of(events, "assistant/message")[0].data_as(AssistantMessageData)
    assert message.message.text == "The file says hello."
    assert message.message.source == {"kind": "model", "provider": "fakeai", "model": "fake-model"}
    assert message.usage == {"inputTokens": 10, "outputTokens": 5, "cacheReadTokens": 32}
    assert [c["type"] for c in chunks][-2:] == ["usage", "finish"]
    assert ends(events)[0].reason.kind == "completed"
    body = requests[0].json
    assert body["model"] == "fake-model" and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["messages"] == [{"role": "system", "content": "be brief"},
                                {"role": "user", "content": "hi"}]
    assert body["tools"] == [{"type": "function", "function": {
        "name": "read", "description": "Read a file.",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}}}}]
    assert requests[0].path == "/v1/chat/completions"


def test_RT15_openai_maps_deepseek_reasoning_content_to_reasoning_chunks() -> None:
    events, _ = converse([Reply.from_file(SSE / "deepseek-reasoning.sse")], openai)
    chunks = [obj(e.data["chunk"]) for e in of(events, "assistant/chunk")]
    assert [c["text"] for c in chunks if c["type"] == "reasoning"] == ["The user asks",
                                                                       " for 2+2."]
    message = of(events, "assistant/message")[0].data_as(AssistantMessageData)
    assert [dict(obj(b)) for b in message.message.content] == [
        {"type": "reasoning", "text": "The user asks for 2+2."}, {"type": "text", "text": "4"}]
    assert message.usage == {"inputTokens": 12, "outputTokens": 9, "reasoningTokens": 7}


def test_RT15_openai_assembles_tool_call_deltas_and_sends_the_results_back() -> None:
    events, requests = converse([Reply.from_file(SSE / "openai-tool-calls.sse"),
                                 openai_text("both read")], openai)
    calls = [e.data_as(ToolCallData) for e in of(events, "tool/call")]
    assert [(c.call_id, c.name, thaw(c.arguments)) for c in calls] == [
        ("call_Hk7q", "read", {"path": "a.txt"}), ("call_Zp3m", "read", {"path": "b.txt"})]
    second = requests[1].json["messages"]
    assert second[2] == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_Hk7q", "type": "function",
         "function": {"name": "read", "arguments": '{"path": "a.txt"}'}},
        {"id": "call_Zp3m", "type": "function",
         "function": {"name": "read", "arguments": '{"path": "b.txt"}'}}]}
    assert second[3:] == [
        {"role": "tool", "tool_call_id": "call_Hk7q", "content": "contents of a.txt"},
        {"role": "tool", "tool_call_id": "call_Zp3m", "content": "contents of b.txt"}]
    assert [e.reason.kind for e in ends(events)] == ["completed"]


def test_RT15_openai_length_stop_is_a_max_tokens_finish() -> None:
    events, _ = converse([Reply.from_file(SSE / "openai-length.sse")], openai)
    assert ends(events)[0].reason.kind == "max-tokens"
    message = of(events, "assistant/message")[0].data_as(AssistantMessageData)
    assert message.message.text == "Once upon a time"
    assert message.usage == {"inputTokens": 9, "outputTokens": 4}


# --------------------------------------------------------------------------
# OpenAI-compatible: failures and their facts
# --------------------------------------------------------------------------


def test_RT15_openai_429_carries_retry_after_status_and_request_id() -> None:
    events, _ = converse([Reply.error(429, {"error": {"message": "Rate limit reached",
                                                      "type": "requests",
                                                      "code": "rate_limit_exceeded"}},
                                      {"retry-after": "2", "x-request-id": "req_123"})], openai)
    assert failure_of(events) == {"message": "fakeai 429: Rate limit reached",
                                  "code": "RATE_LIMITED", "status": 429,
                                  "providerRetryAfterMs": 2000.0, "requestId": "req_123"}


def test_RT15_openai_500_and_context_length_and_auth_are_classified() -> None:
    replies = [Reply.error(500, {"error": {"message": "The server had an error"}}),
               Reply.error(400, {"error": {"message": "This model's maximum context length is "
                                           "8192 tokens", "code": "context_length_exceeded"}}),
               Reply.error(401, {"error": {"message": "Incorrect API key provided"}})]
    events, _ = converse(replies, openai, prompts=("a", "b", "c"))
    assert [(r.reason.failure.code, r.reason.failure.status) for r in ends(events)
            if r.reason.failure] == [("SERVER_ERROR", 500), ("CONTEXT_LENGTH_EXCEEDED", 400),
                                     ("AUTHENTICATION_FAILED", 401)]


def test_RT15_openai_a_connection_dropped_mid_stream_is_stream_interrupted() -> None:
    events, _ = converse([openai_text("partial answer here", pieces=4).but(drop_after=3)],
                         openai)
    texts = [string(obj(e.data["chunk"])["text"]) for e in of(events, "assistant/chunk")]
    assert "".join(texts) == "partial an"               # what arrived is logged
    failure = failure_of(events)
    assert failure["code"] == "STREAM_INTERRUPTED" and "cut off" in failure["message"]
    assert not of(events, "assistant/message")


def test_RT15_openai_a_malformed_event_is_a_malformed_response() -> None:
    stream = sse_event({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
                        "choices": [{"index": 0, "delta": {"content": "a"}}]}) + \
        "data: {not json\n\n"
    events, _ = converse([Reply.from_sse(stream)], openai)
    assert failure_of(events)["code"] == "MALFORMED_RESPONSE"


def _chunk(*choices: object, **fields: object) -> dict[str, object]:
    """A Chat Completions chunk with *choices* (each a choice as it is) and *fields* over it."""
    return {"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": list(choices), **fields}


def _tool_delta(piece: object) -> dict[str, object]:
    return _chunk({"index": 0, "delta": {"tool_calls": [piece]}, "finish_reason": None})


@pytest.mark.parametrize(("bad", "says"), [
    (_chunk(choices=None), "chunk: choices is missing or not a list"),
    ({"id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m"},
     "chunk: choices is missing or not a list"),
    (["not", "a", "chunk"], "chunk: the chunk is not an object"),
    ('"not a chunk"', "chunk: the chunk is not an object"),
    (_chunk(["a choice"]), "choice: a choice is not an object"),
    (_chunk({"index": 0, "delta": "more text"}), "choice: delta is not an object"),
    (_chunk({"delta": {"content": "a"}}), "choice: index is missing or not an integer"),
    (_chunk({"index": 0, "delta": {"content": ["a"]}}), "delta: content is not a string"),
    (_chunk({"index": 0, "delta": {}, "finish_reason": 1}),
     "choice: finish_reason is not a string"),
    (_chunk({"index": 0, "delta": {"tool_calls": {"index": 1}}}),
     "delta: tool_calls is not a list"),
    (_tool_delta({"id": "t2", "function": {"name": "read", "arguments": "{}"}}),
     "tool call: index is missing or not an integer"),
    (_tool_delta({"index": "first", "function": {"arguments": "{}"}}),
     "tool call: index is missing or not an integer"),
    (_tool_delta({"index": 0, "function": "read"}), "tool call: function is not an object"),
    (_tool_delta({"index": 0, "function": {"arguments": {"path": "x"}}}),
     "function: arguments is not a string"),
    (_chunk(usage=[7, 3]), "chunk: usage is not an object"),
    (_chunk(usage={"prompt_tokens": "seven", "completion_tokens": 3}),
     "usage: prompt_tokens is not an integer"),
    (_chunk(usage={"prompt_tokens": 7, "completion_tokens": 3,
                   "prompt_tokens_details": {"cached_tokens": 2.5}}),
     "prompt_tokens_details: cached_tokens is not an integer"),
], ids=["choices-null", "choices-absent", "list", "string", "choice-not-object",
        "delta-not-object", "choice-index-absent", "content-not-string",
        "finish-reason-not-string", "tool-calls-not-list", "tool-index-absent",
        "tool-index-not-int", "function-not-object", "arguments-not-string", "usage-not-object",
        "usage-count-not-int", "usage-detail-not-int"])
def test_RT15_openai_a_malformed_chunk_shape_is_a_malformed_response_and_nothing_is_committed(
        bad: object, says: str) -> None:
    """A chunk that is JSON but not of the Chat Completions shape ends the turn
    MALFORMED_RESPONSE (not retried, RT16), though the rest of the stream would complete it:
    the text that came before is logged as chunks, but no message is committed, the tool
    call under way is not run, and a later prompt completes."""
    whole = openai_tool_calls(("t1", "read", '{"path": "x"}'), text="reading").events
    stream = Reply((*whole[:-3], sse_event(bad), *whole[-3:]))   # before the finish chunk
    events, requests = converse([stream, openai_text("ok")], openai, prompts=("a", "b"),
                                setup=lambda a: a.hooks.request_error.use(retry_request))
    reasons = [r.reason for r in ends(events)]
    assert [r.kind for r in reasons] == ["error", "completed"]
    failure = reasons[0].failure
    assert failure is not None and failure.to_json() == {
        "message": f"fakeai: malformed stream event: {says}", "code": "MALFORMED_RESPONSE"}
    assert not RetryPolicy().retryable(failure)
    assert [obj(e.data["trigger"])["kind"] for e in of(events, "turn/start")] == ["message"] * 2
    chunks = [obj(e.data["chunk"]) for e in of(events, "assistant/chunk") if e.data["turn"] == 1]
    assert chunks == [{"type": "text", "text": "reading"}]
    assert [e.data_as(AssistantMessageData).message.text
            for e in of(events, "assistant/message")] == ["ok"]
    assert not [e for e in events if e.type.startswith("tool/")]
    assert len(requests) == 2 and requests[1].json["messages"] == [
        {"role": "system", "content": "be brief"}, {"role": "user", "content": "a"},
        {"role": "user", "content": "b"}]


#: An SSE event whose bytes are not UTF-8 (the fake server sends a lone surrogate U+DCxx as
#: the byte it escapes): a ``data:`` line holding the bytes 0xFF 0xFE.
NOT_UTF8: Final = 'data: {"text": "\udcff\udcfe"}\n\n'


def _failed_then_ok(first: Reply, make: Callable[[FakeServer], ModelAdapter], ok: Reply
                    ) -> tuple[dict[str, Any], list[Event]]:
    """*first* fails the first turn for good (the request-error point retries what the
    policy allows) and a second prompt completes (*ok*): the failure and the log."""
    events, _ = converse([first, ok], make, prompts=("a", "b"),
                                setup=lambda a: a.hooks.request_error.use(retry_request))
    reasons = [r.reason for r in ends(events)]
    assert [r.kind for r in reasons] == ["error", "completed"]
    failure = reasons[0].failure
    assert failure is not None and not RetryPolicy().retryable(failure)
    assert [obj(e.data["trigger"])["kind"] for e in of(events, "turn/start")] == ["message"] * 2
    assert [e.data_as(AssistantMessageData).message.text
            for e in of(events, "assistant/message")] == ["ok"]
    assert not [e for e in events if e.type.startswith("tool/")]
    return failure.to_json(), events


def test_RT15_openai_an_event_that_is_not_utf8_is_a_malformed_response() -> None:
    """Bytes that do not decode as UTF-8 are a malformed event, classified and not retried
    (RT16), not an unknown failure of the turn."""
    whole = openai_tool_calls(("t1", "read", '{"path": "x"}'), text="reading").events
    failure, events = _failed_then_ok(Reply((*whole[:2], NOT_UTF8, *whole[2:])), openai,
                                      openai_text("ok"))
    assert failure["code"] == "MALFORMED_RESPONSE"
    assert failure["message"].startswith("fakeai: malformed stream event: it is not UTF-8 (")
    assert "0xff" in failure["message"]
    chunks = [obj(e.data["chunk"]) for e in of(events, "assistant/chunk") if e.data["turn"] == 1]
    assert chunks == [{"type": "text", "text": "reading"}]      # what came before is logged


def test_RT15_openai_a_tool_call_index_reused_by_another_id_is_a_malformed_response() -> None:
    """Two calls at one index would be merged into one (the second's id, the names and the
    arguments joined): the stream is malformed, and no call runs."""
    stream = Reply.from_sse("".join(sse_event(c) for c in [
        _tool_delta({"index": 0, "id": "call1", "function": {"name": "t",
                                                             "arguments": '{"a": 1}'}}),
        _tool_delta({"index": 0, "id": "call2", "function": {"name": "u",
                                                             "arguments": '{"b": 2}'}}),
        _chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"})]) + sse_event("[DONE]"))
    failure, _ = _failed_then_ok(stream, openai, openai_text("ok"))
    assert failure == {"message": "fakeai: malformed stream event: tool call: index 0 is reused "
                                  "by call 'call2' while call 'call1' holds it",
                       "code": "MALFORMED_RESPONSE"}


def test_RT15_openai_a_tool_call_id_repeated_in_its_deltas_is_one_call() -> None:
    """The other side of a reused index: a server that repeats a call's id in each of its
    deltas streams one call."""
    stream = Reply.from_sse("".join(sse_event(c) for c in [
        _tool_delta({"index": 0, "id": "call1", "function": {"name": "read", "arguments": ""}}),
        _tool_delta({"index": 0, "id": "call1", "function": {"arguments": '{"path": '}}),
        _tool_delta({"index": 0, "id": "call1", "function": {"arguments": '"x"}'}}),
        _chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"})]) + sse_event("[DONE]"))
    events, _ = converse([stream, openai_text("done")], openai)
    assert [e.reason.kind for e in ends(events)] == ["completed"]
    assert [(c.call_id, c.name, thaw(c.arguments)) for c in
            (e.data_as(ToolCallData) for e in of(events, "tool/call"))] == [
        ("call1", "read", {"path": "x"})]


def test_RT15_openai_fields_the_api_leaves_out_or_null_are_read_as_absent() -> None:
    """The other side of the malformed shapes: null or absent optional fields (an empty
    ``choices``, a choice without ``delta`` as Azure's filter chunks, null ``content``,
    ``tool_calls``, ``id`` and ``function`` fields, null usage details) and fields the adapter
    does not know are no failure."""
    stream = Reply.from_sse("".join(sse_event(c) for c in [
        _chunk(prompt_filter_results=[{"prompt_index": 0}]),
        _chunk({"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": None,
                                      "refusal": None}, "logprobs": None, "finish_reason": None}),
        _chunk({"index": 0, "content_filter_results": {"hate": {"filtered": False}}}),
        _chunk({"index": 0, "delta": None}),
        _chunk({"index": 0, "delta": {"content": "fine", "reasoning": {"summary": "odd"}}}),
        _tool_delta({"index": 0, "id": "t1", "type": "function",
                     "function": {"name": "read", "arguments": None}}),
        _tool_delta({"index": 0, "id": None, "function": {"name": None,
                                                          "arguments": '{"path": "x"}'}}),
        _tool_delta({"index": 0, "function": None, "extra_content": {"google": {}}}),
        _chunk({"index": 1, "delta": "another choice, not read"}),
        _chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}),
        _chunk(usage={"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10,
                      "prompt_tokens_details": None, "completion_tokens_details": None}),
        _chunk(usage=None),
    ]) + sse_event("[DONE]"))
    events, _ = converse([stream, openai_text("done")], openai)
    assert [e.reason.kind for e in ends(events)] == ["completed"]
    message = of(events, "assistant/message")[0].data_as(AssistantMessageData)
    assert message.message.text == "fine"
    assert message.usage == {"inputTokens": 7, "outputTokens": 3}
    assert [(c.call_id, c.name, thaw(c.arguments)) for c in
            (e.data_as(ToolCallData) for e in of(events, "tool/call"))] == [
        ("t1", "read", {"path": "x"})]


def test_RT15_openai_an_error_event_mid_stream_and_a_missing_finish_are_failures() -> None:
    error = Reply.from_sse(sse_event({"error": {"message": "overloaded mid-stream",
                                                "type": "server_error", "code": "overloaded"}}))
    unfinished = Reply.from_sse(sse_event({
        "id": "x", "object": "chat.completion.chunk", "created": 1, "model": "m",
        "choices": [{"index": 0, "delta": {"content": "a"}, "finish_reason": None}]})
        + sse_event("[DONE]"))
    filtered = openai_text("no", finish="content_filter")
    events, _ = converse([error, unfinished, filtered], openai, prompts=("a", "b", "c"))
    codes = [r.reason.failure.code for r in ends(events) if r.reason.failure]
    assert codes == ["OVERLOADED", "STREAM_INTERRUPTED", "CONTENT_FILTERED"]


def test_RT15_openai_no_server_is_a_network_error() -> None:
    async def closed_port() -> int:
        async with FakeServer() as server:
            return server.port
    port = asyncio.run(closed_port())

    def make(_server: FakeServer) -> OpenAIChat:
        return OpenAIChat("m", base_url=f"http://127.0.0.1:{port}/v1", timeout=10)
    events, _ = converse([], make)
    assert failure_of(events)["code"] == "NETWORK_ERROR"


def test_RT15_a_failure_is_retried_by_the_policy_as_a_new_turn() -> None:
    policy = RetryPolicy(base_delay=0.001, jitter=0)
    replies = [Reply.error(429, {"error": {"message": "slow down"}}, {"retry-after-ms": "5"}),
               openai_text("done")]

    def make(server: FakeServer) -> OpenAIChat:
        return OpenAIChat("m", base_url=server.openai_base_url, retry_policy=policy)
    events, requests = converse(replies, make,
                                setup=lambda a: a.hooks.request_error.use(retry_request))
    starts = [obj(e.data["trigger"])["kind"] for e in of(events, "turn/start")]
    assert starts == ["message", "retry"]
    assert [e.reason.kind for e in ends(events)] == ["error", "completed"]
    assert len(requests) == 2 and requests[1].json["messages"][-1] == {"role": "user",
                                                                       "content": "hi"}


def test_RT15_cancel_gives_up_a_held_stream_at_once() -> None:
    """The adapter races its reads against the turn's signal: the server still holds the
    stream when the turn has already ended aborted."""
    async def main() -> list[Event]:
        async with FakeServer([openai_text("never finished", pieces=3).but(hold_at=2)]) as server:
            agent = Agent(openai(server))
            async with agent:
                first = asyncio.Event()
                agent.on("assistant/chunk", lambda e: first.set())
                agent.followup("hi")
                await asyncio.wait_for(first.wait(), 30)
                agent.cancel()
                # Without the race the core would release the stream only at a next chunk,
                # which the held server never sends: this wait would time out.
                await agent.when_idle(timeout=30)
                events = list(agent.session.events)
            server.release()
            return events
    events = asyncio.run(main())
    assert ends(events)[0].reason.kind == "aborted"
    assert [obj(e.data["chunk"])["text"] for e in of(events, "assistant/chunk")] == ["never"]


def test_RT15_reserved_and_invalid_options_are_refused() -> None:
    with pytest.raises(ValidationError, match="messages"):
        OpenAIChat("m", base_url="http://127.0.0.1:1/v1", options={"messages": []})
    with pytest.raises(ValidationError, match="model"):
        OpenAIChat("", base_url="http://127.0.0.1:1/v1")
    with pytest.raises(ValidationError, match="system"):
        AnthropicMessages("m", base_url="http://127.0.0.1:1", options={"system": "x"})


def test_RT15_request_options_reach_the_body_and_the_header() -> None:
    def make(server: FakeServer) -> OpenAIChat:
        return OpenAIChat("m", base_url=server.openai_base_url,
                          options={"temperature": 0.2, "max_tokens": 64})
    events, requests = converse([openai_text("ok")], make)
    body = requests[0].json
    assert body["temperature"] == 0.2 and body["max_tokens"] == 64
    header = obj(of(events, "request/header")[0].data["header"])
    assert header["config"] == {"provider": "openai", "model": "m", "temperature": 0.2,
                                "max_tokens": 64}


# --------------------------------------------------------------------------
# Anthropic
# --------------------------------------------------------------------------


def test_RT15_anthropic_streams_text_and_signed_thinking_from_a_recorded_stream() -> None:
    events, requests = converse([Reply.from_file(SSE / "anthropic-text.sse"),
                                 anthropic_text("again")], claude, prompts=("hi", "more"))
    message = of(events, "assistant/message")[0].data_as(AssistantMessageData)
    assert [dict(obj(b)) for b in message.message.content] == [
        {"type": "reasoning", "text": "A greeting; answer briefly."},
        {"type": SIGNATURE, "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"},
        {"type": "text", "text": "Hello! How can I help?"}]
    assert message.usage == {"inputTokens": 25, "outputTokens": 15, "cacheReadTokens": 20}
    body = requests[1].json
    assert body["system"] == "be brief" and body["max_tokens"] == 4096
    assert body["messages"][1] == {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "A greeting; answer briefly.",
         "signature": "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds"},
        {"type": "text", "text": "Hello! How can I help?"}]}
    assert requests[0].path == "/v1/messages"


def test_RT15_anthropic_assembles_tool_use_input_and_sends_tool_results() -> None:
    events, requests = converse([Reply.from_file(SSE / "anthropic-tools.sse"),
                                 anthropic_text("it says hello")], claude)
    call = of(events, "tool/call")[0].data_as(ToolCallData)
    assert (call.call_id, call.name, thaw(call.arguments)) == (
        "toolu_01T1x1fJ34qAmk2tNTrN7Up6", "read", {"path": "a.txt"})
    messages = requests[1].json["messages"]
    assert messages[1]["content"][1] == {"type": "tool_use", "id": call.call_id,
                                         "name": "read", "input": {"path": "a.txt"}}
    assert messages[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": call.call_id, "content": "contents of a.txt"}]}
    assert requests[0].json["tools"][0]["input_schema"]["properties"] == {
        "path": {"type": "string"}}


def test_RT15_anthropic_stops_overload_drops_and_rate_limits_are_classified() -> None:
    replies = [anthropic_text("cut", stop_reason="max_tokens"),
               Reply.error(529, {"type": "error", "error": {"type": "overloaded_error",
                                                           "message": "Overloaded"}},
                           {"request-id": "req_a1"}),
               Reply.from_sse(sse_event({"type": "error", "error": {
                   "type": "overloaded_error", "message": "Overloaded"}}, "error")),
               anthropic_text("partial reply", pieces=3).but(drop_after=4),
               Reply.error(429, {"type": "error", "error": {"type": "rate_limit_error",
                                                           "message": "slow"}},
                           {"retry-after": "3"}),
               anthropic_text("no", stop_reason="refusal")]
    events, _ = converse(replies, claude, prompts=("a", "b", "c", "d", "e", "f"))
    reasons = [r.reason for r in ends(events)]
    assert reasons[0].kind == "max-tokens"
    failures = [r.failure.to_json() for r in reasons[1:] if r.failure is not None]
    assert [(f["code"], f.get("status")) for f in failures] == [
        ("OVERLOADED", 529), ("OVERLOADED", None), ("STREAM_INTERRUPTED", None),
        ("RATE_LIMITED", 429), ("CONTENT_FILTERED", None)]
    assert failures[0]["requestId"] == "req_a1"
    assert failures[3]["providerRetryAfterMs"] == 3000.0


def test_RT15_anthropic_500_is_a_server_error_retried_by_the_policy_as_a_new_turn() -> None:
    """The 500 of the OpenAI test, in the Messages API's form: SERVER_ERROR with its status
    and request id, a transient failure that `RetryPolicy` retries (RT16) as a new turn."""
    policy = RetryPolicy(base_delay=0.001, jitter=0)
    replies = [Reply.error(500, {"type": "error", "error": {"type": "api_error",
                                                           "message": "Internal server error"}},
                           {"request-id": "req_500"}),
               anthropic_text("done")]

    def make(server: FakeServer) -> AnthropicMessages:
        return AnthropicMessages("fake-claude", base_url=server.base_url, retry_policy=policy)
    events, requests = converse(replies, make,
                                setup=lambda a: a.hooks.request_error.use(retry_request))
    failed = ends(events)[0].reason
    assert failed.kind == "error" and failed.failure is not None
    assert failed.failure.to_json() == {"message": "anthropic 500: Internal server error",
                                        "code": "SERVER_ERROR", "status": 500,
                                        "requestId": "req_500"}
    assert RetryPolicy().retryable(failed.failure)
    assert [obj(e.data["trigger"])["kind"] for e in of(events, "turn/start")] == ["message", "retry"]
    assert [e.reason.kind for e in ends(events)] == ["error", "completed"]
    assert [e.data_as(AssistantMessageData).message.text
            for e in of(events, "assistant/message")] == ["done"]
    assert len(requests) == 2 and requests[1].json["messages"] == requests[0].json["messages"]


def test_RT15_anthropic_a_malformed_event_is_a_malformed_response_and_nothing_is_committed(
        ) -> None:
    """An event that is not JSON, and one of a known type without its fields, end the turn
    MALFORMED_RESPONSE (not retried, RT16); the text and the complete tool call that came
    before are logged as chunks, but no message is committed and no tool runs."""
    head = "".join(anthropic_tool_calls(("t1", "read", '{"path": "x"}'),
                                        text="reading").events[:-2])   # no message_delta/stop
    not_json = Reply.from_sse(head + "event: message_delta\ndata: {not json\n\n")
    no_delta = Reply.from_sse(head + sse_event({"type": "message_delta",
                                                "usage": {"output_tokens": 3}}, "message_delta"))
    events, requests = converse([not_json, no_delta, anthropic_text("ok")], claude,
                                prompts=("a", "b", "c"),
                                setup=lambda a: a.hooks.request_error.use(retry_request))
    reasons = [r.reason for r in ends(events)]
    failures = [r.failure for r in reasons if r.failure is not None]
    assert [r.kind for r in reasons] == ["error", "error", "completed"]
    assert [f.code for f in failures] == ["MALFORMED_RESPONSE", "MALFORMED_RESPONSE"]
    assert failures[1].message == ("anthropic: malformed stream event: message_delta: delta is "
                                   "missing or not an object")
    assert not any(RetryPolicy().retryable(f) for f in failures)
    assert [obj(e.data["trigger"])["kind"] for e in of(events, "turn/start")] == ["message"] * 3
    chunks = [obj(e.data["chunk"]) for e in of(events, "assistant/chunk") if e.data["turn"] == 1]
    assert [c["type"] for c in chunks] == ["text", "tool-call"]
    assert [e.data_as(AssistantMessageData).message.text
            for e in of(events, "assistant/message")] == ["ok"]
    assert not [e for e in events if e.type.startswith("tool/")]
    assert len(requests) == 3 and requests[2].json["messages"] == [{"role": "user", "content": [
        {"type": "text", "text": "a"}, {"type": "text", "text": "b"},
        {"type": "text", "text": "c"}]}]


def test_RT15_anthropic_an_event_that_is_not_utf8_is_a_malformed_response() -> None:
    """As for the OpenAI-compatible adapter: bytes that are not UTF-8 are a malformed
    event, not an unknown failure."""
    whole = anthropic_tool_calls(("t1", "read", '{"path": "x"}'), text="reading").events
    failure, _ = _failed_then_ok(Reply((*whole[:2], NOT_UTF8, *whole[2:])), claude,
                                 anthropic_text("ok"))
    assert failure["code"] == "MALFORMED_RESPONSE"
    assert failure["message"].startswith("anthropic: malformed stream event: it is not UTF-8 (")


def test_RT15_anthropic_a_block_index_started_twice_is_a_malformed_response() -> None:
    """A second ``content_block_start`` at an index already started (a tool call of another
    id at the index of the first) is malformed, as a reused tool-call index is for the
    OpenAI-compatible adapter; no call runs."""
    first = anthropic_tool_calls(("t1", "read", '{"path": "x"}')).events
    second = anthropic_tool_calls(("t2", "read", '{"path": "y"}')).events
    blocks = [e for e in second if e.startswith("event: content_block")]
    failure, _ = _failed_then_ok(Reply((*first[:-2], *blocks, *first[-2:])), claude,
                                 anthropic_text("ok"))
    assert failure == {"message": "anthropic: malformed stream event: content_block_start: "
                                  "index 0 is started a second time",
                       "code": "MALFORMED_RESPONSE"}


@pytest.mark.parametrize("make", [openai, claude], ids=["openai", "anthropic"])
def test_RT15_injected_context_reaches_the_provider_labelled_with_its_plugin(
        make: Callable[[FakeServer], ModelAdapter]) -> None:
    """Through the real SDK, in the request the server receives: context a plugin injected
    before the prompt is sent as user text after the label naming the plugin; the user's
    own prompt has no label."""
    context = user_message("c1", "cwd is /tmp", plugin_source("fs"))
    reply = openai_text("ok") if make is openai else anthropic_text("ok")
    _, requests = converse([reply], make, setup=lambda agent: agent.inject(context))
    messages = requests[0].json["messages"]
    if make is openai:
        assert messages[1:] == [{"role": "user", "content": "[context from plugin:fs]\ncwd is /tmp"},
                                {"role": "user", "content": "hi"}]
    else:
        assert messages == [{"role": "user", "content": [
            {"type": "text", "text": "[context from plugin:fs]\ncwd is /tmp"},
            {"type": "text", "text": "hi"}]}]


def test_RT15_anthropic_tool_calls_builder_round_trip() -> None:
    events, requests = converse([anthropic_tool_calls(("t1", "read", '{"path": "x"}'),
                                                      text="reading"),
                                 anthropic_text("done")], claude)
    assert [e.data_as(ToolCallData).arguments for e in of(events, "tool/call")] == [
        {"path": "x"}]
    assert requests[1].json["messages"][2]["content"][0]["content"] == "contents of x"


# --------------------------------------------------------------------------
# Mapping and classification, unit by unit
# --------------------------------------------------------------------------


def _assistant_calling(*ids: str) -> Message:
    return Message.from_json({"id": "a1", "role": "assistant", "content": [
        {"type": "tool-call", "id": i, "name": "read", "arguments": "{}"} for i in ids],
        "source": {"kind": "model", "provider": "p", "model": "m"}})


def _result(call_id: str, text: str) -> Message:
    return Message.from_json({"id": f"r-{call_id}", "role": "user", "content": [
        {"type": "tool-result", "toolCallId": call_id, "content": [{"type": "text",
                                                                   "text": text}]}],
        "source": {"kind": "tool", "callId": call_id}})


def test_RT15_history_labels_context_and_answers_calls_left_without_results() -> None:
    history = [user_message("u1", "hi"),
               user_message("c1", "cwd is /tmp", plugin_source("shell")),
               _assistant_calling("k1", "k2"), _result("k1", "one"),
               user_message("u2", "next")]
    assert context_label(history[1]) == "[context from plugin:shell]"
    assert to_openai_messages(history) == [
        {"role": "user", "content": "hi"},
        {"role": "user", "content": "[context from plugin:shell]\ncwd is /tmp"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "k1", "type": "function", "function": {"name": "read", "arguments": "{}"}},
            {"id": "k2", "type": "function", "function": {"name": "read", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "k1", "content": "one"},
        {"role": "tool", "tool_call_id": "k2",
         "content": "Error: no result was recorded for this call"},
        {"role": "user", "content": "next"}]
    assert to_anthropic_messages(history, label=None) == [
        {"role": "user", "content": [{"type": "text", "text": "hi"},
                                     {"type": "text", "text": "cwd is /tmp"}]},
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "k1", "name": "read", "input": {}},
            {"type": "tool_use", "id": "k2", "name": "read", "input": {}}]},
        {"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": "k1", "content": "one"},
            {"type": "tool_result", "tool_use_id": "k2",
             "content": "Error: no result was recorded for this call", "is_error": True},
            {"type": "text", "text": "next"}]}]


def test_RT15_retry_after_headers_are_read_in_every_form() -> None:
    assert retry_after_ms({"Retry-After": "2"}) == 2000.0
    assert retry_after_ms({"retry-after-ms": "150", "retry-after": "9"}) == 150.0
    assert retry_after_ms({"retry-after": "Wed, 01 Jan 2025 00:00:10 GMT"},
                          now=1735689600.0) == 10_000.0
    assert retry_after_ms({"retry-after": "Wed, 01 Jan 2025 00:00:10 GMT"},
                          now=1735689700.0) == 0.0
    assert retry_after_ms({"retry-after": "soon"}) is None
    assert retry_after_ms({"retry-after-ms": "nan", "retry-after": "1"}) == 1000.0
    assert retry_after_ms({}) is None and retry_after_ms(None) is None


def test_RT15_usage_is_its_own_chunk_in_the_originals_shape() -> None:
    """V18, P12: usage is a chunk {type:'usage', usage} before the finish; the figures have
    the original's names and disjoint counts."""
    figures = usage(10, 4, cache_read_tokens=6, reasoning_tokens=0)
    assert figures == {"inputTokens": 10, "outputTokens": 4, "cacheReadTokens": 6}
    assert usage(None, None) is None
    assert closing_chunks("stop", figures) == [{"type": "usage", "usage": figures},
                                               {"type": "finish", "kind": "stop"}]
    assert closing_chunks("max-tokens", None) == [{"type": "finish", "kind": "max-tokens"}]


@pytest.mark.parametrize(("status", "body", "code"), [
    (429, {"error": {"message": "You exceeded your quota", "code": "insufficient_quota"}},
     "QUOTA_EXCEEDED"),
    (429, None, "RATE_LIMITED"),
    (403, None, "PERMISSION_DENIED"),
    (404, {"error": {"message": "model not found", "code": "model_not_found"}}, "NOT_FOUND"),
    (408, None, "TIMEOUT"),
    (413, None, "REQUEST_TOO_LARGE"),
    (400, {"type": "error", "error": {"type": "invalid_request_error",
                                      "message": "prompt is too long: 210000 tokens"}},
     "CONTEXT_LENGTH_EXCEEDED"),
    (422, None, "BAD_REQUEST"),
    (502, None, "SERVER_ERROR"),
    (503, None, "OVERLOADED"),
    (None, {"error": {"message": "odd", "type": "mystery"}}, "PROVIDER_ERROR"),
    (200, {"type": "error", "error": {"type": "api_error", "message": "x"}}, "SERVER_ERROR"),
])
def test_RT15_http_failures_are_classified(status: int | None, body: object, code: str) -> None:
    assert classify_status(status, body) == code


def test_RT15_an_api_key_comes_from_the_argument_the_environment_or_a_local_placeholder(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(ValidationError, match="set OPENAI_API_KEY"):
        OpenAIChat("m")
    with pytest.raises(ValidationError, match="set ANTHROPIC_API_KEY"):
        AnthropicMessages("m")
    assert OpenAIChat("m", base_url="http://127.0.0.1:1/v1").client.api_key == NO_KEY
    monkeypatch.setenv("OPENAI_API_KEY", "from-env")
    assert OpenAIChat("m").client.api_key == "from-env"
    assert OpenAIChat("m", api_key="given").client.api_key == "given"
