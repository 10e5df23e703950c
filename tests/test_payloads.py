"""Typed views of event data and payloads (specs/vocabulary.md E5) and the plain forms of frozen
values (V22)."""

from __future__ import annotations

import asyncio
import json

import pytest
from hypothesis import HealthCheck, given, settings

from machine import FrozenDict, FrozenList, freeze, json_default, thaw
from machine.checking.testing import Interleaving, interleavings
from machine.errors import ValidationError
from machine.events import SURFACE_TYPES, Event, LiveEvent
from machine.io import Durable, Live, Output
from machine.payloads import (
    DURABLE_VIEWS,
    LIVE_VIEWS,
    AgentErrorData,
    AssistantChunkData,
    AssistantMessageData,
    ExtensionData,
    InboxDequeueData,
    RequestHeaderData,
    SettledData,
    SteeringMessageData,
    ToolResultData,
    TurnEndData,
    TurnStartData,
    UserMessageData,
)
from machine.runtime import (
    Agent,
    Block,
    ModelFailure,
    Next,
    PromptDecision,
    PromptSubmit,
    ScriptedModel,
    StepContext,
    Tool,
    ToolCall,
    calls_reply,
    text_reply,
)
from machine.vocabulary import Message, plugin_source, user_message


def _every_kind_of_output() -> list[Output]:
    """A session that produces every durable and live type of the catalog."""
    async def read(call: ToolCall) -> str:
        return "text"

    async def guard(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        if submit.message.text == "blocked":
            return Block("no")
        if submit.message.text == "broken":
            raise RuntimeError("handler broke")
        return await next_()

    steered: list[bool] = []

    async def step(context: StepContext) -> None:
        if context.turn == 1:
            agent.append("todo/write", {"todos": [{"text": "a", "done": False}]})
        if context.turn == 2 and not steered:
            steered.append(True)
            agent.steer("steer now")

    model = ScriptedModel([text_reply("hello", pieces=2),
                           calls_reply(("c1", "read", '{"path": "a"}')), text_reply("read"),
                           text_reply("steered"),
                           ModelFailure("down", "SERVER_ERROR", status=500)])
    agent = Agent(model, tools=[Tool("read", read)])
    agent.hooks.prompt_submit.use(guard)
    agent.hooks.step.use(step)
    outputs: list[Output] = []
    agent.observe(outputs.append)

    async def main() -> None:
        async with agent:
            agent.inject(user_message("ctx", "context", plugin_source("p")))
            agent.followup("hi")
            await agent.when_idle()
            agent.followup("use the tool")
            await agent.when_idle()
            agent.followup("blocked")
            agent.followup("broken")
            await agent.when_idle()
            agent.followup("fails")
            await agent.when_idle()
            agent.append("x-telemetry/sample", {"n": 1})
            agent.followup("queued one")
            agent.followup("queued two")
            agent.cancel()
            agent.steer("stays")                      # no turn is running: a queued prompt
            agent.followup(user_message("q3", "quiet"))
            await agent.when_idle()
    asyncio.run(main())
    return outputs


OUTPUTS = _every_kind_of_output()
EVENTS = [o.event for o in OUTPUTS if isinstance(o, Durable)]
NOTICES = [o.event for o in OUTPUTS if isinstance(o, Live)]


def test_E5_the_session_covers_the_catalog() -> None:
    assert {e.type for e in EVENTS} == set(DURABLE_VIEWS) | {"x-telemetry/sample"}
    missing = set(LIVE_VIEWS) - {n.type for n in NOTICES}
    assert missing <= {"agent/context/discard"}, missing


@pytest.mark.parametrize("event", EVENTS, ids=lambda e: f"{e.seq}-{e.type}")
def test_E5_every_durable_event_has_its_view_and_only_its_own(event: Event) -> None:
    view = event.view
    if event.type not in DURABLE_VIEWS:
        assert view == ExtensionData(event.type, event.data)
        return
    assert not isinstance(view, ExtensionData)
    assert event.type == type(view).TYPE
    assert event.data_as(type(view)) == view
    other = TurnEndData if event.type != "turn/end" else TurnStartData
    with pytest.raises(ValidationError, match=f"has no {other.__name__}"):
        event.data_as(other)


@pytest.mark.parametrize("notice", NOTICES, ids=lambda n: n.type)
def test_E5_every_notification_has_its_view(notice: LiveEvent) -> None:
    view = notice.view
    assert not isinstance(view, ExtensionData)
    assert notice.type == type(view).TYPE
    assert notice.payload_as(type(view)) == view
    with pytest.raises(ValidationError, match="has no TurnEndData"):
        notice.payload_as(TurnEndData)


def test_E5_message_is_uniform_over_the_surface_types() -> None:
    for event in EVENTS:
        if event.type in SURFACE_TYPES:
            where = event.data if event.type == "user/message" else event.data["message"]
            assert event.message == Message.from_json(where)
        else:
            with pytest.raises(ValidationError, match="carries no message"):
                event.message  # noqa: B018
    steering = next(e for e in EVENTS if e.type == "steering/message")
    assert steering.message.text == "steer now"
    assert steering.data_as(SteeringMessageData).turn == 2
    user = next(e for e in EVENTS if e.type == "user/message")
    assert user.data_as(UserMessageData).message == user.message
    for notice in NOTICES:
        if notice.type in ("agent/inbox/enqueue", "agent/inbox/dequeue"):
            assert notice.message == Message.from_json(notice.payload["message"])
        else:
            with pytest.raises(ValidationError, match="carries no message"):
                notice.message  # noqa: B018


def test_E5_views_give_typed_fields() -> None:
    end = next(e for e in EVENTS if e.type == "turn/end").data_as(TurnEndData)
    assert (end.turn, end.reason.kind) == (1, "completed")
    chunk = next(e for e in EVENTS if e.type == "assistant/chunk").data_as(AssistantChunkData)
    assert (chunk.chunk_type, chunk.text) == ("text", "hel")
    message = next(e for e in EVENTS if e.type == "assistant/message").data_as(
        AssistantMessageData)
    assert message.message.text == "hello" and message.usage is None
    result = next(e for e in EVENTS if e.type == "tool/result").data_as(ToolResultData)
    assert (result.call_id, result.is_error, result.text) == ("c1", False, "text")
    header = next(e for e in EVENTS if e.type == "request/header").data_as(RequestHeaderData)
    assert header.reason == "initial" and header.config["provider"] == "scripted"
    settled = next(n for n in NOTICES if n.type == "agent/settled").payload_as(SettledData)
    assert settled.reason.kind == "completed"
    error = next(n for n in NOTICES if n.type == "agent/error").payload_as(AgentErrorData)
    assert error.error.rendered() == "down"
    dequeue = next(n for n in NOTICES if n.type == "agent/inbox/dequeue")
    assert dequeue.payload_as(InboxDequeueData).placement == "queued"


def test_E5_a_view_names_a_missing_or_mistyped_field() -> None:
    with pytest.raises(ValidationError, match=r"data\.turn: is missing"):
        Event("turn/end", 0, 0, FrozenDict({"reason": {"kind": "completed"}})).view  # noqa: B018
    with pytest.raises(ValidationError, match=r"data\.step: must be an integer"):
        Event("step/start", 0, 0, FrozenDict({"turn": 1, "step": "one"})).view  # noqa: B018
    with pytest.raises(ValidationError, match=r"payload\.text"):
        LiveEvent("agent/warning", FrozenDict()).view  # noqa: B018


FAST = settings(max_examples=25, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(interleavings())
def test_E5_every_event_of_random_runs_decodes(run: Interleaving) -> None:
    driver = run.run()
    for output in driver.outputs:
        if isinstance(output, Durable | Live):
            output.event.view  # noqa: B018  (raises if a shape does not decode)


# --------------------------------------------------------------------------
# V22: plain forms
# --------------------------------------------------------------------------


def test_V22_frozen_values_print_readably_and_thaw_to_fresh_plain_data() -> None:
    value = freeze({"kind": "completed", "usage": {"in": 5}, "list": [1, {"a": [2]}]})
    assert isinstance(value, FrozenDict)
    assert repr(value) == ("FrozenDict({'kind': 'completed', 'usage': {'in': 5}, "
                           "'list': [1, {'a': [2]}]})")
    assert str(value) == '{"kind": "completed", "usage": {"in": 5}, "list": [1, {"a": [2]}]}'
    listed = freeze([1, {"a": "é"}])
    assert repr(listed) == "FrozenList([1, {'a': 'é'}])" and str(listed) == '[1, {"a": "é"}]'
    plain = thaw(value)
    assert plain == {"kind": "completed", "usage": {"in": 5}, "list": [1, {"a": [2]}]}
    plain["usage"]["in"] = 6
    assert value["usage"] == {"in": 5}


def test_V22_json_dumps_with_json_default_encodes_frozen_and_library_values() -> None:
    event = Event("turn/end", 3, 1.5, FrozenDict({"turn": 1, "reason": {"kind": "completed"}}))
    text = json.dumps({"event": event, "data": event.data, "list": FrozenList([1, 2]),
                       "message": user_message("m", "hi")}, default=json_default)
    assert json.loads(text) == {
        "event": event.to_json(), "data": {"turn": 1, "reason": {"kind": "completed"}},
        "list": [1, 2], "message": user_message("m", "hi").to_json()}
    assert json.dumps(FrozenList([1, "a"])) == '[1, "a"]'       # a tuple: no help needed
    with pytest.raises(TypeError, match="FrozenDict is not JSON serializable"):
        json.dumps(event.data)
    with pytest.raises(TypeError, match="object is not JSON serializable"):
        json.dumps({"x": object()}, default=json_default)


def test_V22_events_and_notices_print_their_data_plainly() -> None:
    event = Event("steering/message", 7, 2, FrozenDict({"turn": 1, "message": user_message(
        "s", "go").to_json()}), "append", FrozenList([5]))
    assert repr(event) == ("Event(seq=7, type='steering/message', data={'turn': 1, 'message': "
                           "{'id': 's', 'role': 'user', 'content': [{'type': 'text', 'text': "
                           "'go'}], 'source': {'kind': 'user'}}}, surface_op='append', "
                           "source_event_seqs=[5], time=2)")
    assert repr(LiveEvent("agent/status", FrozenDict({"status": "idle"}))) == \
        "LiveEvent('agent/status', {'status': 'idle'})"
