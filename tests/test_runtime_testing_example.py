"""machine.checking.testing: property-test handlers, tools and observers against the real core.

The worked example (also in the README): a prompt-submit handler that blocks
prompts containing 'secret' never makes a blocked prompt leave a trace in the
log, however commands, partial deliveries and effect answers interleave.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from machine.checking.testing import (
    Deliver,
    Interleaving,
    Issue,
    Respond,
    environment,
    interleavings,
    message_ids,
    run_sync,
    user_messages,
)
from machine.cli.runner import parse_script, run_script
from machine.core import CoreConfig
from machine.io import Cancel, Durable, Send
from machine.jsonvalue import FrozenDict
from machine.runtime import Block, Hooks, Next, PromptDecision, PromptSubmit, Tool, ToolCall, ToolResult
from machine.vocabulary import FOLLOWUP, SendOptions

FAST = settings(max_examples=60, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow])


# -- the worked example ------------------------------------------------------------------------


@FAST
@given(interleavings(texts=st.sampled_from(["hello", "my secret plan", "status?", "secret"])))
def test_a_blocking_handler_never_lets_a_blocked_prompt_leave_a_trace(run: Interleaving) -> None:
    blocked: set[str] = set()

    async def no_secrets(submit: PromptSubmit, next_: Next[PromptDecision]) -> PromptDecision:
        if "secret" in submit.message.text:
            blocked.add(submit.message.id)
            return Block("contains a secret")
        return await next_()

    hooks = Hooks()
    hooks.prompt_submit.use(no_secrets)
    driver = run.run(environment(hooks=hooks))

    assert not blocked & message_ids(driver.core.log.events)


# -- the helpers themselves ------------------------------------------------------------------


@FAST
@given(interleavings(tools=("note",)))
def test_tool_contexts_never_precede_a_result_of_their_step(run: Interleaving) -> None:
    """A second example: a tool whose results carry contexts, checked against every order."""
    async def note(call: ToolCall) -> ToolResult:
        context = {"id": f"ctx-{call.call_id}", "role": "user", "content": [
            {"type": "text", "text": "noted"}], "source": {"kind": "plugin", "plugin": "notes"}}
        return ToolResult([{"type": "text", "text": "ok"}],  # type: ignore[arg-type]
                          additional_contexts=(context,))  # type: ignore[arg-type]

    driver = run.run(environment(tools=[Tool("note", note)]))
    events = driver.core.log.events
    for index, event in enumerate(events):
        if event.type == "user/message" and str(event.data["id"]).startswith("ctx-"):
            later = events[index + 1:]
            step_end = next(i for i, e in enumerate(later) if e.type == "step/end")
            assert all(e.type != "tool/result" for e in later[:step_end])


def test_an_interleaving_is_data_and_runs_on_the_scripted_driver() -> None:
    hi = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "hi"}],
          "source": {"kind": "user"}}
    run = Interleaving((Issue(Send(hi, FOLLOWUP, preset="followup")), Deliver(5), Respond(),
                        Issue(Cancel({"kind": "user"})), Respond(5)))
    driver = run.run()
    assert run.inputs() == [{"in": "followup", "message": hi},
                            {"in": "cancel", "cause": {"kind": "user"}}]
    assert [o.event.type for o in driver.outputs if isinstance(o, Durable)] == []   # discarded
    script = driver.script()
    inputs = script["inputs"]
    assert isinstance(inputs, list)
    assert [i["in"] for i in inputs if isinstance(i, dict)] == ["followup", "resolve", "cancel"]
    replayed = list(run_script(parse_script(json.dumps(script))))
    assert replayed == [o.to_json() for o in driver.outputs]


@settings(max_examples=25, deadline=None, database=None)
@given(interleavings())
@example(
    run=Interleaving(actions=(Issue(command=Send(message={'id': 'm1',
         'role': 'user',
         'content': [{'type': 'text', 'text': 'hi'}],
         'source': {'kind': 'user'}},
        options=SendOptions(target='next-turn', wakeup=True),
        preset='followup')),
      Deliver(count=1),
      Deliver(count=1),
      Deliver(count=3),
      Respond(pick=0),
      Issue(command=Cancel(cause={'kind': 'user'}, keep_inbox=False)),
      Deliver(count=1),
      Deliver(count=1),
      Deliver(count=1),
      Issue(command=Send(message={'id': 'm2',
         'role': 'user',
         'content': [{'type': 'text', 'text': 'hi'}],
         'source': {'kind': 'user'}},
        options=SendOptions(target='next-turn', wakeup=True),
        preset='followup')),
      Issue(command=Send(message={'id': 'm3',
         'role': 'user',
         'content': [{'type': 'text', 'text': 'hi'}],
         'source': {'kind': 'user'}},
        options=SendOptions(target='next-turn', wakeup=True),
        preset='followup')),
      Issue(command=Send(message={'id': 'm4',
         'role': 'user',
         'content': [{'type': 'text', 'text': 'hi'}],
         'source': {'kind': 'user'}},
        options=SendOptions(target='next-turn', wakeup=True),
        preset='followup')),
      Deliver(count=1),
      Issue(command=Send(message={'id': 'm5',
         'role': 'user',
         'content': [{'type': 'text', 'text': 'hi'}],
         'source': {'kind': 'user'}},
        options=SendOptions(target='next-turn', wakeup=True),
        preset='followup'))),
     replies=(),
     config=CoreConfig(request_options=FrozenDict({'provider': 'test', 'model': 'test-model'}),
      tool_modes={'echo': 'exclusive'},
      max_parallel_tool_calls=2,
      session_start='startup',
      publish=True)),
).via('discovered failure')
@example(
    run=Interleaving(actions=(Issue(command=Send(message={'id': 'm1',
         'role': 'user',
         'content': [{'type': 'text', 'text': 'hi'}],
         'source': {'kind': 'user'}},
        options=SendOptions(target='next-turn', wakeup=True),
        preset='followup')),
      Deliver(count=1),
      Deliver(count=1),
      Deliver(count=2),
      Respond(pick=0),
      Issue(command=Cancel(cause={'kind': 'user'}, keep_inbox=False)),
      Deliver(count=1),
      Deliver(count=1),
      Deliver(count=2),
      Issue(command=Send(message={'id': 'm2',
         'role': 'user',
         'content': [{'type': 'text', 'text': 'hi'}],
         'source': {'kind': 'user'}},
        options=SendOptions(target='next-turn', wakeup=True),
        preset='followup'))),
     replies=(),
     config=CoreConfig(request_options=FrozenDict({'provider': 'test', 'model': 'test-model'}),
      tool_modes={'echo': 'exclusive'},
      max_parallel_tool_calls=2,
      session_start='startup',
      publish=True)),
).via('discovered failure')
def test_a_recorded_interleaving_is_a_script_turnstile_run_reproduces(run: Interleaving) -> None:
    driver = run.run()
    try:
        script = driver.script()
    except ValueError:
        return
    assert list(run_script(parse_script(json.dumps(script)))) == [
        o.to_json() for o in driver.outputs]


def test_run_sync_completes_handlers_that_do_not_wait_and_refuses_those_that_do() -> None:
    async def quick() -> int:
        await asyncio.sleep(0)
        return 42

    async def waits() -> None:
        await asyncio.get_running_loop().create_future()

    assert run_sync(quick()) == 42
    with pytest.raises(RuntimeError):
        run_sync(waits())


@settings(max_examples=20, deadline=None)
@given(user_messages())
def test_the_value_strategies_are_re_exported(message: Any) -> None:
    assert message.role == "user"
