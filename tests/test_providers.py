"""The provider boundary (specs/providers.md W1–W8, W10, W11): what the adapters send for
every history (the plan, W2), the providers' rules as validators (W3–W7), the fake servers
that refuse (W8), and the bodies each message is encoded into once (W10).

W9 (where requests are checked over what the core and the store reach) is in
tests/test_providers_reach.py.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from typing import Any, ClassVar

import openai
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from machine.jsonvalue import FrozenDict
from machine.log import SessionLog
from machine.providers.chat import ChatBodies, ChatCodec, chat_request, to_openai_messages
from machine.providers.check import request_refusals, with_tools
from machine.providers.history import EMPTY_MESSAGE, EMPTY_RESULT, MISSING_RESULT, OPENING
from machine.providers.messages import (
    SIGNATURE,
    MessagesBodies,
    messages_request,
    to_anthropic_messages,
)
from machine.providers.plan import IncrementalEncoder, Unit
from machine.providers.rules import (
    CHAT,
    MESSAGES,
    Refusal,
    chat_refusals,
    error_body,
    messages_refusals,
)
from machine.runtime import Agent, Tool, ToolCall
from machine.runtime.adapters.anthropic import AnthropicMessages
from machine.runtime.adapters.fake_server import (
    FakeServer,
    Reply,
    anthropic_text,
    anthropic_tool_calls,
    openai_text,
    openai_tool_calls,
)
from machine.runtime.adapters.openai import OpenAIChat
from machine.runtime.model import ModelCall
from machine.runtime.signal import Signal
from machine.vocabulary import Message, plugin_source, user_message

HEADER = FrozenDict({"config": {"provider": "p", "model": "m"}})
TOOLS = FrozenDict({"config": {"provider": "p", "model": "m"},
                    "tools": [{"name": "t", "parameters": {"type": "object"}}]})
THINKING = FrozenDict({"config": {"provider": "p", "model": "m",
                                  "thinking": {"type": "enabled", "budget_tokens": 1024}},
                       "tools": [{"name": "t", "parameters": {"type": "object"}}]})


def message(mid: str, role: str, content: list[dict[str, Any]], source: dict[str, Any]
            ) -> Message:
    return Message.from_json({"id": mid, "role": role, "content": content, "source": source})


def assistant(mid: str, *blocks: dict[str, Any]) -> Message:
    return message(mid, "assistant", list(blocks), {"kind": "model", "provider": "p",
                                                      "model": "m"})


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def call(call_id: str, name: str = "t", arguments: str = "{}") -> dict[str, Any]:
    return {"type": "tool-call", "id": call_id, "name": name, "arguments": arguments}


def result(call_id: str, value: str = "ok", *, error: bool = False, mid: str | None = None
           ) -> Message:
    block: dict[str, Any] = {"type": "tool-result", "toolCallId": call_id,
                             "content": [text(value)] if value else []}
    if error:
        block["isError"] = True
    return message(mid or f"r-{call_id}", "user", [block], {"kind": "tool", "callId": call_id})


def both(header: FrozenDict, history: Sequence[Message]) -> tuple[dict[str, Any], dict[str, Any]]:
    return (chat_request(header, history, model="m", stream=True),
            messages_request(header, history, model="m", stream=True))


def accepted(header: FrozenDict, history: Sequence[Message]) -> None:
    """Both adapters' bodies for *header* and *history*, and with its calls' tools declared,
    are accepted; a history that ends with the assistant's words is a prefill, which only the
    Messages API's W5.3 refuses (the core never sends one, W1)."""
    for variant in (header, with_tools(header, history)):
        found = request_refusals(variant, history)
        last = messages_request(variant, history, model="m")["messages"][-1]
        if last["role"] == "assistant":
            assert [(d, r.rule, r.message.startswith("This model does not support assistant "
                                                     "message prefill")) for d, r in found] \
                == [(MESSAGES, "W5.3", True)], found
        else:
            assert found == [], found


# --------------------------------------------------------------------------
# W1: every history makes an accepted request
# --------------------------------------------------------------------------

CALL_IDS = st.sampled_from(["c1", "c2", "call_0", "toolu_01A", "x.y:z", "a b", "ünï", "-",
                            "i" * 41, "j" * 70, "c1_2"])
NAMES = st.sampled_from(["t", "read", "read.file", "", "x" * 70, "naïve", "a-b_c"])
TEXTS = st.sampled_from(["", " ", "\n\t", "hi", "ok", "über"])
SOURCES: st.SearchStrategy[dict[str, Any]] = st.sampled_from([
    {"kind": "user"}, {"kind": "plugin", "plugin": "fs"}, {"kind": "plugin", "plugin": ""},
    {"kind": "x/ext", "n": 1}])


@st.composite
def messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "assistant", "result", "system", "odd"]))
    mid = f"m{draw(st.integers(0, 10**6))}"
    if kind == "user":
        parts = draw(st.lists(st.one_of(TEXTS.map(text), st.just({"type": "image", "u": 1})),
                              max_size=2))
        return message(mid, "user", parts, draw(SOURCES))
    if kind == "system":
        return message(mid, "system", [text(draw(TEXTS))], {"kind": "user"})
    if kind == "result":
        return result(draw(CALL_IDS), draw(TEXTS), error=draw(st.booleans()), mid=mid)
    if kind == "odd":                          # a tool-kind message of no result shape
        return message(mid, "user", [text(draw(TEXTS)), text("x")],
                       {"kind": "tool", "callId": "c1"})
    blocks: list[dict[str, Any]] = []
    for part in draw(st.lists(st.sampled_from(["text", "reasoning", "signed", "redacted",
                                               "call"]), max_size=4)):
        if part == "text":
            blocks.append(text(draw(TEXTS)))
        elif part == "reasoning":
            blocks.append({"type": "reasoning", "text": draw(TEXTS)})
        elif part == "signed":
            blocks += [{"type": "reasoning", "text": "think"},
                       {"type": SIGNATURE, "signature": "c2ln"}]
        elif part == "redacted":
            blocks.append({"type": "anthropic/redacted-thinking", "data": "opaque"})
        else:
            blocks.append(call(draw(CALL_IDS), draw(NAMES),
                               draw(st.sampled_from(["{}", "", "{\"a\": 1}", "[1]", "{bad"]))))
    return assistant(mid, *blocks)


@st.composite
def headers(draw: st.DrawFn) -> FrozenDict:
    config: dict[str, Any] = {"provider": "p", "model": draw(st.sampled_from(["m", ""]))}
    if draw(st.booleans()):
        config["thinking"] = {"type": draw(st.sampled_from(["enabled", "adaptive",
                                                            "disabled"]))}
    header: dict[str, Any] = {"config": config}
    if draw(st.booleans()):
        header["system"] = draw(st.sampled_from(["be brief", [text("a"), text("b")]]))
    names = draw(st.lists(NAMES, unique=True, max_size=3))
    if names:
        header["tools"] = [{"name": name, "parameters": {"type": "object"}} for name in names]
    return FrozenDict(header)


HISTORY_SETTINGS = settings(max_examples=400, deadline=None,
                            suppress_health_check=[HealthCheck.too_slow])


@HISTORY_SETTINGS
@given(headers(), st.lists(messages(), max_size=12))
def test_W1_every_history_makes_bodies_both_providers_accept(
        header: FrozenDict, history: list[Message]) -> None:
    """W1, W2: whatever the history holds — calls without results, results without calls,
    duplicates, blank text, ids and names no provider takes, thinking on or off, tools
    declared or not — neither adapter's body breaks a rule of W4 or W5."""
    accepted(header, history)


@HISTORY_SETTINGS
@given(headers(), st.lists(messages(), max_size=10))
def test_W10_the_encoded_bodies_are_the_requests_bodies_at_every_prefix(
        header: FrozenDict, history: list[Message]) -> None:
    """W10: the bytes an adapter sends are `request()`'s body, request after request, as the
    history grows (each prefix a history of its own list) and when it does not."""
    chat, claude = ChatBodies(), MessagesBodies()
    for end in [*range(len(history) + 1), len(history) // 2, len(history)]:
        prefix = list(history[:end])
        assert json.loads(chat.body(header, prefix, model="m")) == chat_request(
            header, prefix, model="m", stream=True)
        assert json.loads(claude.body(header, prefix, model="m")) == messages_request(
            header, prefix, model="m", stream=True)


# --------------------------------------------------------------------------
# W2: the plan
# --------------------------------------------------------------------------


def test_W2_1_an_assistant_message_with_nothing_to_send_is_left_out() -> None:
    history = [user_message("u", "hi"), assistant("a", {"type": "reasoning", "text": "hmm"},
                                                  text("  ")), user_message("v", "again")]
    assert [m["role"] for m in to_openai_messages(history)] == ["user", "user"]
    assert to_anthropic_messages(history) == [
        {"role": "user", "content": [text("hi"), text("again")]}]
    # sent when its reasoning is sent back (DeepSeek's thinking mode)
    assert to_openai_messages(history, send_reasoning=True)[1] == {
        "role": "assistant", "content": "", "reasoning_content": "hmm"}
    accepted(HEADER, history)


def test_W2_2_unanswered_calls_get_an_error_result_right_after_their_message() -> None:
    """W2.2: the found results in log order, then the missing ones in call order, before
    what follows; so a fork or a resume between a call and its result is sendable."""
    history = [user_message("u", "go"), assistant("a", call("k1"), call("k2"), call("k3")),
               result("k2", "two"), user_message("v", "next")]
    chat = to_openai_messages(history)
    assert [(m["role"], m.get("tool_call_id"), m.get("content")) for m in chat[1:]] == [
        ("assistant", None, None), ("tool", "k2", "two"), ("tool", "k1", MISSING_RESULT),
        ("tool", "k3", MISSING_RESULT), ("user", None, "next")]
    claude = to_anthropic_messages(history)
    assert claude[2] == {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "k2", "content": "two"},
        {"type": "tool_result", "tool_use_id": "k1", "content": MISSING_RESULT,
         "is_error": True},
        {"type": "tool_result", "tool_use_id": "k3", "content": MISSING_RESULT,
         "is_error": True},
        text("next")]}
    accepted(TOOLS, history)
    # the history's end closes the group too
    assert to_openai_messages(history[:2])[-1] == {"role": "tool", "tool_call_id": "k3",
                                                   "content": MISSING_RESULT}


def test_W2_3_a_message_between_calls_and_their_results_is_sent_after_them() -> None:
    """W2.3: a steer (or any message) logged between a call and its result waits for the
    group's results."""
    steer = user_message("s", "stop that")
    history = [user_message("u", "go"), assistant("a", call("k1"), call("k2")),
               result("k1"), steer, result("k2"), user_message("v", "more")]
    chat = to_openai_messages(history)
    assert [m.get("tool_call_id") or m["content"] for m in chat[2:]] == [
        "k1", "k2", "stop that", "more"]
    assert to_anthropic_messages(history)[2]["content"] == [
        {"type": "tool_result", "tool_use_id": "k1", "content": "ok"},
        {"type": "tool_result", "tool_use_id": "k2", "content": "ok"},
        text("stop that"), text("more")]
    accepted(TOOLS, history)


def test_W2_4_a_result_that_answers_no_call_of_its_group_is_sent_as_text() -> None:
    history = [result("k0", "early"), user_message("u", "go"), assistant("a", call("k1")),
               result("k1", "one"), result("k1", "again", error=True, mid="dup"),
               result("zz", "stray")]
    chat = to_openai_messages(history)
    assert chat[0] == {"role": "user", "content": "[result of tool call k0]\nearly"}
    assert chat[3:] == [{"role": "tool", "tool_call_id": "k1", "content": "one"},
                        {"role": "user", "content": "[result of tool call k1 (error)]\nagain"},
                        {"role": "user", "content": "[result of tool call zz]\nstray"}]
    assert to_anthropic_messages(history)[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "k1", "content": "one"},
        text("[result of tool call k1 (error)]\nagain"), text("[result of tool call zz]\nstray")]
    accepted(TOOLS, history)


def test_W2_5_ids_a_provider_refuses_or_a_request_repeats_are_sent_in_a_derived_form() -> None:
    long_id = "i" * 41
    history = [user_message("u", "go"), assistant("a", call("call_0"), call("x.y:z")),
               result("call_0"), result("x.y:z"), user_message("v", "again"),
               assistant("b", call("call_0"), call(long_id)), result("call_0", "second"),
               result(long_id)]
    chat = to_openai_messages(history)
    first, second = chat[1]["tool_calls"], chat[5]["tool_calls"]
    assert first[0]["id"] == "call_0" and first[1]["id"] == "x.y:z"
    assert second[0]["id"] != "call_0" and second[0]["id"].startswith("call_0_")
    assert len(second[1]["id"]) <= 40
    assert chat[6] == {"role": "tool", "tool_call_id": second[0]["id"], "content": "second"}
    claude = to_anthropic_messages(history)
    ids = [b["id"] for m in claude for b in m["content"] if b["type"] == "tool_use"]
    assert ids[0] == "call_0" and ids[1].startswith("x_y_z_") and len(set(ids)) == 4
    results = [b["tool_use_id"] for m in claude for b in m["content"]
               if b["type"] == "tool_result"]
    assert results == ids
    # deterministic: the same history is sent the same way
    assert to_anthropic_messages(list(history)) == claude
    accepted(TOOLS, history)


def test_W2_6_a_tool_name_no_provider_takes_is_sent_valid_and_read_back_as_its_own() -> None:
    """W2.6: the tool "read.file" is declared as a valid name; the model calls it by that
    name; the call is logged, and run, under "read.file"."""
    ran: list[str] = []

    async def body(tool_call: ToolCall) -> str:
        ran.append(tool_call.name)
        return "contents"

    tool = Tool("read.file", body, "exclusive", "Read.", {"type": "object"})

    async def main(make: Any, first: Reply, second: Reply) -> tuple[list[str], list[Any]]:
        async with FakeServer([first, second]) as server:
            async with Agent(make(server), tools=[tool]) as agent:
                agent.followup("read it")
                await agent.when_idle(timeout=60)
                names = [str(e.data["name"]) for e in agent.session.events
                         if e.type == "tool/call"]
            assert server.refusals == []
            return names, [r.json for r in server.requests]

    sent_name = OpenAIChat("m", base_url="http://127.0.0.1:9").request(ModelCall(
        1, 1, Signal(1), FrozenDict({"config": {"provider": "p", "model": "m"},
                                     "tools": [{"name": "read.file"}]}), ()))["tools"][0][
        "function"]["name"]
    assert sent_name != "read.file" and sent_name.startswith("read_file_")
    names, bodies = asyncio.run(main(
        lambda s: OpenAIChat("m", base_url=s.openai_base_url),
        openai_tool_calls(("c1", sent_name, "{}")), openai_text("done")))
    assert names == ["read.file"] and ran == ["read.file"]
    calling = next(m for m in bodies[1]["messages"] if m["role"] == "assistant")
    assert calling["tool_calls"][0]["function"]["name"] == sent_name
    names, bodies = asyncio.run(main(
        lambda s: AnthropicMessages("m", base_url=s.base_url),
        anthropic_tool_calls(("c1", sent_name, "{}")), anthropic_text("done")))
    assert names == ["read.file"] and bodies[0]["tools"][0]["name"] == sent_name


def test_W2_7_calls_go_as_text_without_tools_or_without_leading_thinking() -> None:
    history = [user_message("u", "go"), assistant("a", text("let me"), call("k1", "t", "{}")),
               result("k1", "done")]
    plain = to_anthropic_messages(history, tools=False)
    assert plain[1] == {"role": "assistant", "content": [
        text("let me"), text("[called tool t (k1) with arguments {}]")]}
    assert plain[2] == {"role": "user", "content": [text("[result of tool call k1]\ndone")]}
    # thinking on: a call is a tool_use only in a message that opens with its thinking
    thought = assistant("b", {"type": "reasoning", "text": "hmm"},
                        {"type": SIGNATURE, "signature": "c2ln"}, call("k2"))
    on = to_anthropic_messages([*history, user_message("v", "next"), thought,
                                result("k2")], thinking=True)
    assert on[1]["content"][1]["type"] == "text"
    assert [b["type"] for b in on[3]["content"]] == ["thinking", "tool_use"]
    for header in (HEADER, THINKING):
        accepted(header, [*history, user_message("v", "next"), thought, result("k2")])
    # OpenAI takes calls without declared tools
    assert to_openai_messages(history)[1]["tool_calls"][0]["id"] == "k1"


def test_W2_7_a_thinking_message_merged_behind_another_sends_its_calls_as_text() -> None:
    # Found by the W1 property test: two assistant messages in a row are one wire message
    # (W5.3), so the second's thinking does not open it; with thinking on, its calls go as
    # text (W5.7: the message with the calls the last message answers opens with thinking)
    said = assistant("a", text("hi"))
    thought = assistant("b", {"type": "reasoning", "text": "think"},
                        {"type": SIGNATURE, "signature": "c2ln"}, call("k1"))
    history = [said, thought]
    on = to_anthropic_messages(history, thinking=True)
    assert [b["type"] for b in on[1]["content"]] == ["text", "thinking", "text"]
    assert on[1]["content"][2] == text("[called tool t (k1) with arguments {}]")
    assert [b["type"] for b in on[2]["content"]] == ["text"]       # its missing result, as text
    assert on[2]["content"][0]["text"].startswith("[result of tool call k1 (error)]")
    for header in (HEADER, THINKING):
        accepted(header, history)
        accepted(header, [*history, result("k1", "done")])
    # alone, the same message opens its wire message and keeps its tool_use
    alone = to_anthropic_messages([user_message("u", "go"), thought], thinking=True)
    assert [b["type"] for b in alone[1]["content"]] == ["thinking", "tool_use"]


def test_W2_8_a_request_opens_with_the_user() -> None:
    history = [assistant("a", text("I said this first")), user_message("u", "hi")]
    assert to_anthropic_messages(history)[0] == {"role": "user", "content": [text(OPENING)]}
    assert to_openai_messages(history)[0]["role"] == "assistant"  # Chat Completions takes it
    assert to_openai_messages([]) == [{"role": "user", "content": OPENING}]
    assert to_anthropic_messages([]) == [{"role": "user", "content": [text(OPENING)]}]
    assert to_openai_messages([], system="s") == [{"role": "system", "content": "s"}]
    accepted(HEADER, history)
    accepted(HEADER, [])


def test_W2_9_blank_text_is_sent_as_a_placeholder_or_not_at_all() -> None:
    history = [user_message("u", ""), assistant("a", call("k1")), result("k1", " "),
               message("s", "system", [text("")], {"kind": "user"}),
               user_message("v", [])]
    chat = to_openai_messages(history)
    assert chat == [{"role": "user", "content": EMPTY_MESSAGE}, chat[1],
                    {"role": "tool", "tool_call_id": "k1", "content": EMPTY_RESULT},
                    {"role": "user", "content": EMPTY_MESSAGE}]
    claude = to_anthropic_messages(history)
    assert claude[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "k1", "content": EMPTY_RESULT},
        text(EMPTY_MESSAGE)]
    # a context message keeps its label, which says something
    context = user_message("c", "", plugin_source("fs"))
    assert to_openai_messages([context]) == [{"role": "user", "content": "[context from plugin:fs]"}]
    # an error result with no text still has content
    errored = to_anthropic_messages([user_message("u", "go"), assistant("a", call("k")),
                                     result("k", "", error=True)])
    assert errored[-1]["content"][0] == {"type": "tool_result", "tool_use_id": "k",
                                         "content": EMPTY_RESULT, "is_error": True}
    accepted(TOOLS, history)


# --------------------------------------------------------------------------
# W3-W7: the validators, each rule planted in a raw body
# --------------------------------------------------------------------------


def rules_of(found: list[Refusal]) -> list[tuple[str, str]]:
    return [(r.rule, r.where(CHAT)) for r in found]


def chat_body(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": list(messages), **extra}


CALLING = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "k1", "type": "function", "function": {"name": "t", "arguments": "{}"}},
    {"id": "k2", "type": "function", "function": {"name": "t", "arguments": "{}"}}]}
USER = {"role": "user", "content": "go"}


def tool(call_id: str, content: str = "ok") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def test_W3_a_refusal_is_the_providers_400_body() -> None:
    refusal = Refusal("W4.5", ("messages", 3, "role"), "bad")
    assert refusal.where(CHAT) == "messages[3].role"
    assert refusal.where(MESSAGES) == "messages.3.role"
    assert error_body(CHAT, refusal) == {"error": {"message": "bad", "type":
                                                   "invalid_request_error",
                                                   "param": "messages[3].role", "code": None}}
    assert error_body(MESSAGES, refusal) == {"type": "error", "error": {
        "type": "invalid_request_error", "message": "messages.3.role: bad"}}


def test_W4_1_the_body_needs_a_model_and_messages() -> None:
    assert rules_of(chat_refusals({"messages": [USER]})) == [("W4.1", "model")]
    assert rules_of(chat_refusals(chat_body())) == [("W4.1", "messages")]
    assert rules_of(chat_refusals(chat_body(USER, stream_options={}))) == [
        ("W4.1", "stream_options")]
    assert rules_of(chat_refusals([USER])) == [("W4.1", "")]
    assert chat_refusals(chat_body(USER, stream=True, stream_options={})) == []


def test_W4_2_roles_are_the_apis() -> None:
    assert rules_of(chat_refusals(chat_body({"role": "robot", "content": "x"}))) == [
        ("W4.2", "messages[0].role")]
    assert chat_refusals(chat_body({"role": "assistant", "content": "first"}, USER, USER)) == []


def test_W4_3_content_is_never_null_and_never_empty_but_for_calls() -> None:
    assert rules_of(chat_refusals(chat_body({"role": "user", "content": None}))) == [
        ("W4.3", "messages[0].content")]
    assert rules_of(chat_refusals(chat_body(USER, {"role": "assistant", "content": None}))) == [
        ("W4.3", "messages[1].content")]
    assert rules_of(chat_refusals(chat_body({"role": "user", "content": ""}))) == [
        ("W4.3", "messages[0].content")]
    assert rules_of(chat_refusals(chat_body({"role": "user", "content": []}))) == [
        ("W4.3", "messages[0].content")]
    assert chat_refusals(chat_body(USER, CALLING, tool("k1"), tool("k2"))) == []


def test_W4_4_tool_calls_have_short_ids_valid_names_and_string_arguments() -> None:
    bad = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "i" * 41, "type": "function", "function": {"name": "t", "arguments": "{}"}},
        {"id": "k2", "type": "function", "function": {"name": "read.file", "arguments": {}}}]}
    assert rules_of(chat_refusals(chat_body(USER, bad, tool("i" * 41), tool("k2")))) == [
        ("W4.4", "messages[1].tool_calls[0].id"),
        ("W4.4", "messages[1].tool_calls[1].function.name"),
        ("W4.4", "messages[1].tool_calls[1].function.arguments"),
        ("W4.5", "messages[2].tool_call_id")]
    again = dict(CALLING)
    assert ("W4.4", "messages[4].tool_calls[0].id") in rules_of(chat_refusals(chat_body(
        USER, CALLING, tool("k1"), tool("k2"), again, tool("k1"), tool("k2"))))


def test_W4_5_planted_a_steer_between_a_call_and_its_result_is_refused_where_it_is() -> None:
    """W4.5: the steer drained between a call and its result, a duplicate result, a
    missing result and a result with no call, each named by its rule and position."""
    steer = {"role": "user", "content": "stop"}
    found = chat_refusals(chat_body(USER, CALLING, tool("k1"), steer, tool("k2")))
    assert rules_of(found) == [("W4.5", "messages[1].role"), ("W4.5", "messages[4].role")]
    assert "The following tool_call_ids did not have response messages: k2" in found[0].message
    assert "must be a response to a preceeding message with 'tool_calls'" in found[1].message
    assert rules_of(chat_refusals(chat_body(USER, CALLING, tool("k1"), tool("k1"),
                                            tool("k2")))) == [
        ("W4.5", "messages[3].tool_call_id")]
    assert rules_of(chat_refusals(chat_body(USER, CALLING, tool("k1")))) == [
        ("W4.5", "messages[1].role")]
    assert rules_of(chat_refusals(chat_body(tool("k1"), USER))) == [("W4.5", "messages[0].role")]
    assert rules_of(chat_refusals(chat_body(USER, CALLING, tool("k9"), tool("k1"),
                                            tool("k2")))) == [
        ("W4.5", "messages[2].tool_call_id")]
    # what the plan sends for the same log instead
    history = [user_message("u", "go"), assistant("a", call("k1"), call("k2")), result("k1"),
               user_message("s", "stop"), result("k2")]
    assert chat_refusals(chat_request(HEADER, history, model="m", stream=True)) == []


def test_W4_6_tools_are_functions_with_valid_names_and_object_schemas() -> None:
    def spec(name: str, parameters: Any = None) -> dict[str, Any]:
        function: dict[str, Any] = {"name": name}
        if parameters is not None:
            function["parameters"] = parameters
        return {"type": "function", "function": function}
    found = chat_refusals(chat_body(USER, tools=[spec("ok"), spec("a.b"), spec("ok"),
                                                 spec("x", {"type": "array"})]))
    assert rules_of(found) == [("W4.6", "tools[1].function.name"),
                               ("W4.6", "tools[2].function.name"),
                               ("W4.6", "tools[3].function.parameters")]
    assert rules_of(chat_refusals(chat_body(USER, tools=[spec(f"t{n}") for n in range(129)]))) \
        == [("W4.6", "tools")]


def claude(*messages: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"model": "m", "max_tokens": 10, "messages": list(messages),
            "tools": [{"name": "t", "input_schema": {"type": "object"}}], **extra}


def m_rules(found: list[Refusal]) -> list[tuple[str, str]]:
    return [(r.rule, r.where(MESSAGES)) for r in found]


U = {"role": "user", "content": [text("go")]}
A_CALLS = {"role": "assistant", "content": [
    {"type": "tool_use", "id": "k1", "name": "t", "input": {}},
    {"type": "tool_use", "id": "k2", "name": "t", "input": {}}]}


def answer(*ids: str, after: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    return {"role": "user", "content": [
        *({"type": "tool_result", "tool_use_id": i, "content": "ok"} for i in ids), *after]}


def test_W5_1_the_body_needs_model_max_tokens_and_messages() -> None:
    assert m_rules(messages_refusals({"model": "m", "messages": [U]})) == [("W5.1", "max_tokens")]
    assert m_rules(messages_refusals(claude(max_tokens=0))) == [("W5.1", "max_tokens"),
                                                                ("W5.1", "messages")]
    assert m_rules(messages_refusals(claude(U, system=[text(" ")]))) == [("W5.1", "system")]
    assert messages_refusals(claude(U, system="be brief")) == []


def test_W5_2_roles_are_user_and_assistant() -> None:
    assert m_rules(messages_refusals(claude(U, {"role": "system", "content": "x"}, U))) == [
        ("W5.2", "messages.1.role")]


def test_W5_3_the_user_speaks_first_and_last() -> None:
    a = {"role": "assistant", "content": [text("hi")]}
    assert m_rules(messages_refusals(claude(a, U))) == [("W5.3", "messages.0.role")]
    assert m_rules(messages_refusals(claude(U, a))) == [("W5.3", "messages.1.role")]
    assert messages_refusals(claude(U, U, a, U)) == []       # same roles merge


def test_W5_4_content_and_text_are_never_empty_and_blocks_stay_in_their_role() -> None:
    assert m_rules(messages_refusals(claude({"role": "user", "content": []}))) == [
        ("W5.4", "messages.0")]
    assert m_rules(messages_refusals(claude({"role": "user", "content": [text("")]}))) == [
        ("W5.4", "messages.0.content.0")]
    found = messages_refusals(claude({"role": "user", "content": [text(" \n")]}))
    assert m_rules(found) == [("W5.4", "messages.0.content.0")]
    assert found[0].message == "text content blocks must contain non-whitespace text"
    assert m_rules(messages_refusals(claude({"role": "user", "content": [
        {"type": "thinking", "thinking": "x", "signature": "s"}, text("go")]}))) == [
        ("W5.4", "messages.0.content.0")]


def test_W5_5_planted_results_must_follow_their_calls_first_and_once() -> None:
    steer = text("stop")
    assert m_rules(messages_refusals(claude(U, A_CALLS, answer("k1", "k2")))) == []
    # results split over two messages: all belong in the next one (W7: the stricter reading)
    assert m_rules(messages_refusals(claude(U, A_CALLS, answer("k1"), answer("k2")))) == [
        ("W5.5", "messages.1"), ("W5.5", "messages.3.content.0")]
    # a steer drained between the results: text before a result
    found = messages_refusals(claude(U, A_CALLS, answer("k1", after=[steer]),
                                     {"role": "user", "content": [
                                         steer, {"type": "tool_result", "tool_use_id": "k2",
                                                 "content": "ok"}]}))
    assert ("W5.5", "messages.3") in m_rules(found)
    found = messages_refusals(claude(U, A_CALLS, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "k1", "content": "ok"}, steer,
        {"type": "tool_result", "tool_use_id": "k2", "content": "ok"}]}))
    assert m_rules(found) == [("W5.5", "messages.2")]
    assert "Did not find 2 tool_result block(s) at the beginning" in found[0].message
    # a missing result, a duplicate, a stranger, a repeated id, a bad id
    assert m_rules(messages_refusals(claude(U, A_CALLS, answer("k1")))) == [("W5.5", "messages.1")]
    assert m_rules(messages_refusals(claude(U, A_CALLS, answer("k1", "k2", "k1")))) == [
        ("W5.5", "messages.2.content.2")]
    assert m_rules(messages_refusals(claude(U, A_CALLS, answer("k1", "k2", "zz")))) == [
        ("W5.5", "messages.2.content.2")]
    assert m_rules(messages_refusals(claude(U, A_CALLS, answer("k1", "k2"), A_CALLS,
                                            answer("k1", "k2")))) == [
        ("W5.5", "messages.3.content.0"), ("W5.5", "messages.3.content.1"),
        ("W5.5", "messages.4.content.0"), ("W5.5", "messages.4.content.1")]
    bad = {"role": "assistant", "content": [{"type": "tool_use", "id": "a.b", "name": "t.x",
                                             "input": []}]}
    assert m_rules(messages_refusals(claude(U, bad, answer("a.b")))) == [
        ("W5.5", "messages.1.content.0.tool_use.id"),
        ("W5.5", "messages.1.content.0.tool_use.name"),
        ("W5.5", "messages.1.content.0.tool_use.input"),
        ("W5.5", "messages.2.content.0")]
    errored = {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "k1",
                                            "is_error": True},
                                           {"type": "tool_result", "tool_use_id": "k2"}]}
    assert m_rules(messages_refusals(claude(U, A_CALLS, errored))) == [
        ("W5.5", "messages.2.content.0.content")]


def test_W5_6_tool_blocks_need_declared_tools() -> None:
    body = claude(U, A_CALLS, answer("k1", "k2"))
    del body["tools"]
    found = messages_refusals(body)
    assert m_rules(found) == [("W5.6", "")]
    assert found[0].message.startswith("Requests which include `tool_use`")


def test_W5_7_thinking_is_signed_and_opens_the_last_tool_turn() -> None:
    unsigned = {"role": "assistant", "content": [{"type": "thinking", "thinking": "x"},
                                                 text("hi")]}
    assert m_rules(messages_refusals(claude(U, unsigned, U))) == [
        ("W5.7", "messages.1.content.0.thinking.signature")]
    thinking = {"type": "enabled", "budget_tokens": 1024}
    found = messages_refusals(claude(U, A_CALLS, answer("k1", "k2"), thinking=thinking))
    assert m_rules(found) == [("W5.7", "messages.1.content.0.type")]
    assert "Expected `thinking` or `redacted_thinking`, but found `tool_use`" in found[0].message
    opened = {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "x", "signature": "s"}, *A_CALLS["content"]]}
    assert messages_refusals(claude(U, opened, answer("k1", "k2"), thinking=thinking)) == []


def test_W5_8_tools_have_valid_unique_names_and_object_schemas() -> None:
    body = claude(U, tools=[{"name": "ok", "input_schema": {"type": "object"}},
                            {"name": "ok", "input_schema": {"type": "object"}},
                            {"name": "a.b", "input_schema": {"type": "object"}},
                            {"name": "c", "input_schema": {"type": "string"}}])
    assert m_rules(messages_refusals(body)) == [("W5.8", "tools"), ("W5.8", "tools.2.name"),
                                                ("W5.8", "tools.3.input_schema")]


def test_W6_with_send_reasoning_every_assistant_turn_sends_its_reasoning_back() -> None:
    """W6: DeepSeek's thinking mode with tools wants earlier reasoning back: with
    ``send_reasoning`` each assistant message carries it, tool-call turns included."""
    history = [user_message("u", "go"),
               assistant("a", {"type": "reasoning", "text": "first think"}, call("k1")),
               result("k1"), assistant("b", {"type": "reasoning", "text": "then"}, text("done"))]
    sent = to_openai_messages(history, send_reasoning=True)
    assert [m.get("reasoning_content") for m in sent if m["role"] == "assistant"] == [
        "first think", "then"]
    assert all("reasoning_content" not in m for m in to_openai_messages(history))


def test_W7_the_validators_take_the_stricter_reading_where_the_rule_is_uncertain() -> None:
    """W7: refused though reportedly accepted somewhere: an empty user content (Chat
    Completions), a first assistant message, an error result with no content (Messages
    API)."""
    assert chat_refusals(chat_body({"role": "user", "content": ""}))
    a = {"role": "assistant", "content": [text("hi")]}
    assert messages_refusals(claude(a, U))
    assert messages_refusals(claude(U, A_CALLS, {"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "k1", "content": "", "is_error": True},
        {"type": "tool_result", "tool_use_id": "k2", "content": "ok"}]}))


# --------------------------------------------------------------------------
# W8: the fake servers refuse what the providers refuse
# --------------------------------------------------------------------------


@pytest.mark.parametrize("dialect", [CHAT, MESSAGES])
def test_W8_the_fake_server_answers_a_refused_body_with_the_providers_400(dialect: str) -> None:
    """W8: through the real SDK; the scripted reply is not taken, and the failure is the
    adapter's BAD_REQUEST naming the provider's message."""
    broken = [user_message("u", "go"), assistant("a", call("k1"))]

    async def main() -> tuple[list[Any], int, Any]:
        reply = openai_text("never") if dialect == CHAT else anthropic_text("never")
        async with FakeServer([reply]) as server:
            if dialect == CHAT:
                model: Any = OpenAIChat("m", base_url=server.openai_base_url)
            else:
                model = AnthropicMessages("m", base_url=server.base_url)
            # the raw body of a naive mapping: the call unanswered
            raw = chat_body(*to_openai_messages(broken)[:-1], stream=True) \
                if dialect == CHAT else claude(*to_anthropic_messages(broken)[:-1],
                                               stream=True)
            client = model.client
            path = "/chat/completions" if dialect == CHAT else "/v1/messages"
            with pytest.raises(Exception) as raised:
                await client.post(path, cast_to=object, body=raw)
            return server.refusals, server.pending, raised.value
    refusals, pending, error = asyncio.run(main())
    assert pending == 1
    assert [(d, [r.rule for r in found]) for _, d, found in refusals] == [
        (dialect, ["W4.5"] if dialect == CHAT else ["W5.3", "W5.5"])]
    assert getattr(error, "status_code", None) == 400


def test_W8_a_body_that_is_not_json_is_refused() -> None:
    async def main() -> list[Any]:
        async with FakeServer() as server:
            model = OpenAIChat("m", base_url=server.openai_base_url)
            with pytest.raises(openai.BadRequestError):
                await model.client.post("/chat/completions", cast_to=object, content=b"{nope")
            return server.refusals
    assert [found[0].rule for _, _, found in asyncio.run(main())] == ["W3"]


# --------------------------------------------------------------------------
# W10: each message encoded once, and the SDK's body
# --------------------------------------------------------------------------


class _Counting(ChatCodec):
    encoded: ClassVar[list[Unit]] = []

    def encode(self, unit: Unit) -> list[dict[str, Any]]:
        _Counting.encoded.append(unit)
        return super().encode(unit)


def test_W10_a_request_encodes_only_what_was_added_since_the_last_clean_point() -> None:
    log = SessionLog()
    encoder = IncrementalEncoder(_Counting)
    _Counting.encoded = []
    for turn in range(50):
        log.append("user/message", user_message(f"u{turn}", f"question {turn}").to_json(),
                   surface_op="append")
    encoder.encode(log.history(len(log)))
    assert len(_Counting.encoded) == 50              # the first request: every message once
    for extra in range(4):
        log.append("user/message", user_message(f"x{extra}", "more").to_json(),
                   surface_op="append")
    _Counting.encoded = []
    body = encoder.encode(log.history(len(log)))
    assert len(_Counting.encoded) == 4                # the next: only the four added
    assert json.loads(body) == to_openai_messages(log.history(len(log)))


def test_W10_histories_that_do_not_extend_each_other_are_encoded_apart() -> None:
    """W10: two conversations through one adapter, and a history whose earlier messages
    changed (a compaction's replace), each get their own bytes."""
    bodies = ChatBodies()
    one = [user_message(f"a{n}", f"one {n}") for n in range(5)]
    two = [user_message(f"b{n}", f"two {n}") for n in range(5)]
    for end in range(1, 6):
        for history in (one[:end], two[:end]):
            assert json.loads(bodies.body(HEADER, history, model="m")) == chat_request(
                HEADER, history, model="m", stream=True)
    replaced = [one[0], user_message("summary", "summary"), *one[3:]]
    assert json.loads(bodies.body(HEADER, replaced, model="m"))["messages"][1] == {
        "role": "user", "content": "summary"}


@pytest.mark.parametrize("dialect", [CHAT, MESSAGES])
def test_W10_the_direct_body_is_what_the_sdk_would_have_sent(dialect: str) -> None:
    """W10: the same turns through the adapter posting its own bytes and through the SDK's
    ``create``: the fake server receives the same JSON body, headers and path."""
    async def run(direct: bool) -> tuple[list[Any], list[dict[str, str]], list[str]]:
        replies = [openai_tool_calls(("k1", "read", "{\"path\": \"a\"}")), openai_text("ok")] \
            if dialect == CHAT else [anthropic_tool_calls(("k1", "read", "{\"path\": \"a\"}")),
                                     anthropic_text("ok")]
        async with FakeServer(replies) as server:
            model: Any = (OpenAIChat("m", base_url=server.openai_base_url, api_key="k",
                                     direct=direct, options={"temperature": 0.5})
                          if dialect == CHAT else
                          AnthropicMessages("m", base_url=server.base_url, api_key="k",
                                            direct=direct, options={"temperature": 0.5}))

            async def read(tool_call: ToolCall) -> str:
                return "text"
            async with Agent(model, system="be brief",
                             tools=[Tool("read", read, "exclusive", "Read.",
                                         {"type": "object"})]) as agent:
                agent.followup("hi")
                agent.inject(user_message("c", "cwd /", plugin_source("fs")))
                await agent.when_idle(timeout=60)
            assert server.refusals == []
            keep = ("authorization", "x-api-key", "content-type", "anthropic-version", "accept")
            return ([r.json for r in server.requests],
                    [{k: v for k, v in r.headers.items() if k in keep} for r in server.requests],
                    [r.path for r in server.requests])
    assert asyncio.run(run(True)) == asyncio.run(run(False))


def test_W2_2_a_call_whose_outcome_is_unknown_after_a_crash_is_answered_by_the_repair() -> None:
    """W2.2, S12: the interrupted calls of a crashed session get the repair's results, sent
    as those calls' results (an error the model reads), first in the next user message."""
    from machine.store.repair import NOT_STARTED_TEXT, OUTCOME_UNKNOWN_TEXT, closers
    from machine.store.testing import sample_session
    events = sample_session()                     # turn 3 open: c2 started, c3 not
    log = SessionLog([*events, *closers(events)])
    history = [*log.history(len(log)), user_message("next", "go on")]
    chat = to_openai_messages(history)
    assert chat[-3:] == [{"role": "tool", "tool_call_id": "c2", "content": OUTCOME_UNKNOWN_TEXT},
                         {"role": "tool", "tool_call_id": "c3", "content": NOT_STARTED_TEXT},
                         {"role": "user", "content": "go on"}]
    assert to_anthropic_messages(history)[-1]["content"] == [
        {"type": "tool_result", "tool_use_id": "c2", "content": OUTCOME_UNKNOWN_TEXT,
         "is_error": True},
        {"type": "tool_result", "tool_use_id": "c3", "content": NOT_STARTED_TEXT,
         "is_error": True},
        text("go on")]
    accepted(HEADER, history)
