"""`ModelAgent.copy` and `ModelAgent.state_parts`: the reference model's state is explicit data.

For every corpus vector (``specs/conformance/vectors``) the model is copied at every
position -- before the first step, after each input and after each pulled output -- and
the copy is driven with the rest of the vector: its outputs (or refusals), its read-only
state after each step and its log events must be the original's. The original goes on
through the same steps and must give the same again, whatever its copies did meanwhile.
At each position the copy's `state_parts` equal the original's and the two share no
mutable object.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from machine.conformance.subjects import fake_clock
from machine.conformance.vectors import (
    Step,
    Vector,
    config_from_json,
    find_vectors,
    load_vector,
    seed_events,
)
from machine.core import CoreConfig
from machine.io import Effect, input_from_json
from machine.jsonvalue import JsonLike
from machine.log import SessionLog

if TYPE_CHECKING:
    # The same files: setup.py installs model/ as machine._model, which mypy cannot follow.
    from model import ModelAgent
else:
    from machine._model import ModelAgent

CORPUS = Path(__file__).resolve().parent.parent / "specs" / "conformance" / "vectors"
VECTORS = [load_vector(path) for path in find_vectors([CORPUS])]

#: one step's observation: what the step gave (an output's JSON, None for "no output",
#: or the refusal), then the read-only state after it and the log's length
Observation = tuple[object, ...]


def _start(vector: Vector) -> ModelAgent:
    log = SessionLog(seed_events(vector.seed), clock=fake_clock)
    return ModelAgent(config_from_json(vector.config), log=log)


def _read_only(agent: ModelAgent) -> tuple[object, ...]:
    return (agent.status, agent.accepts_next_step, agent.pending_queued, agent.pending_steering,
            agent.pending_context, agent.wake_pending, agent.retry_pending, agent.is_quiescent,
            agent.disposing, agent.disposed, agent.failure, agent.outstanding_effects,
            tuple(agent.signal_reason(signal) for signal in range(1, 12)), len(agent.log))


def _apply(agent: ModelAgent, step: Step) -> Observation:
    """Apply one vector step as the conformance runner does: an input is fed (a refusal is
    observed as its class and message), an expected output is one pull."""
    result: object
    if step.kind == "in":
        try:
            agent.feed(input_from_json(step.value))
            result = "accepted"
        except Exception as error:
            result = (type(error).__name__, str(error))
    else:
        output = agent.next_output()
        result = None if output is None else output.to_json()
    return (result, *_read_only(agent))


def _events(agent: ModelAgent) -> list[dict[str, JsonLike]]:
    return [event.to_json() for event in agent.log.events]


def _mutables(agent: ModelAgent) -> dict[int, object]:
    """Every mutable object reachable from the agent's attributes (its log and its static
    configuration aside), by id: lists, dicts, sets, deques and non-frozen dataclasses."""
    found: dict[int, object] = {}
    todo: list[object] = [value for name, value in vars(agent).items()
                          if name not in ("log", "config", "_mint")]
    while todo:
        value = todo.pop()
        if isinstance(value, (str, bytes, int, float, type(None))):
            continue
        if isinstance(value, (list, dict, set, deque)) or (
                dataclasses.is_dataclass(value) and not isinstance(value, type)
                and not type(value).__dataclass_params__.frozen):  # type: ignore[attr-defined]
            if id(value) in found:
                continue
            found[id(value)] = value
        if isinstance(value, dict):
            todo.extend(value.values())
        elif isinstance(value, (list, tuple, set, frozenset, deque)):
            todo.extend(value)
        elif dataclasses.is_dataclass(value) and not isinstance(value, type):
            todo.extend(getattr(value, f.name) for f in dataclasses.fields(value))
    return found


def _assert_independent(original: ModelAgent, copy: ModelAgent) -> None:
    assert copy.log is not original.log
    shared = set(_mutables(original)) & set(_mutables(copy))
    assert not shared, [type(_mutables(original)[i]).__name__ for i in shared]


@pytest.mark.parametrize("vector", VECTORS, ids=[vector.id for vector in VECTORS])
def test_a_copy_at_every_position_has_the_original_future(vector: Vector) -> None:
    steps = vector.steps
    reference_agent = _start(vector)
    reference = [_apply(reference_agent, step) for step in steps]
    reference_log = _events(reference_agent)

    original = _start(vector)
    for position in range(len(steps) + 1):
        copy = original.copy()
        parts = original.state_parts()
        assert copy.state_parts() == parts, position
        _assert_independent(original, copy)
        length = len(original.log)

        for offset, step in enumerate(steps[position:]):  # the copy, to the end
            assert _apply(copy, step) == reference[position + offset], (position, offset)
        assert _events(copy) == reference_log, position

        # the copy's future changed nothing of the original's
        assert original.state_parts() == parts, position
        assert len(original.log) == length, position
        if position < len(steps):  # the original, one step further
            assert _apply(original, steps[position]) == reference[position], position
    assert _events(original) == reference_log


def test_the_corpus_is_all_there() -> None:
    assert len(VECTORS) > 200
    assert sum(len(vector.steps) for vector in VECTORS) > 10_000


# --------------------------------------------------------------------------
# A mid-turn agent, by hand
# --------------------------------------------------------------------------

CONFIG = CoreConfig(request_options={"provider": "test", "model": "test-model"},
                    tool_modes={"read": "parallel"}, max_parallel_tool_calls=2)


def _message(text: str) -> dict[str, JsonLike]:
    return {"id": f"m-{text}", "role": "user", "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"}}


def _tool_call(call_id: str) -> dict[str, JsonLike]:
    return {"type": "tool-call", "id": call_id, "name": "read", "arguments": "{}"}


def mid_turn_agent() -> tuple[ModelAgent, list[Effect]]:
    """A model in a tool batch: two parallel calls executing, a follow-up queued, steering
    and context staged, a cancel's notice being observed. Returns the outstanding effects."""
    agent = ModelAgent(CONFIG, clock=lambda: 0)
    agent.followup(_message("go"))
    executing: list[Effect] = []
    for _ in range(200):
        output = agent.next_output()
        if output is None:
            break
        if not isinstance(output, Effect):
            continue
        kind, effect = output.kind, output.id
        if kind == "prompt-submit":
            agent.resolve(effect, {"kind": "allow"})
        elif kind == "request":
            agent.resolve(effect, {"config": dict(CONFIG.request_options)})
        elif kind == "model":
            agent.chunk(effect, _tool_call("c1"))
            agent.chunk(effect, _tool_call("c2"))
            agent.chunk(effect, {"type": "finish", "kind": "stop"})
            agent.end(effect)
        elif kind == "tool-execute":
            executing.append(output)
        elif kind in ("tick", "step", "system-prompt", "tool-prepare"):
            agent.resolve(effect, None)
    assert [e.kind for e in executing] == ["tool-execute", "tool-execute"]
    agent.followup(_message("later"))
    agent.steer(_message("steer"))
    agent.inject(_message("context"))
    return agent, executing


def _finish(agent: ModelAgent) -> list[JsonLike]:
    """Drive an agent to the end of its work with fixed answers; its outputs' JSON."""
    seen: list[JsonLike] = []
    for _ in range(500):
        output = agent.next_output()
        if output is None:
            return seen
        seen.append(output.to_json())
        if isinstance(output, Effect):
            if output.kind == "model":
                agent.chunk(output.id, {"type": "text", "text": "done"})
                agent.chunk(output.id, {"type": "finish", "kind": "stop"})
                agent.end(output.id)
            elif output.kind == "request":
                agent.resolve(output.id, {"config": dict(CONFIG.request_options)})
            elif output.kind == "prompt-submit":
                agent.resolve(output.id, {"kind": "allow"})
            else:
                agent.resolve(output.id, None)
    return seen


def _settle_tools(agent: ModelAgent, executing: list[Effect]) -> None:
    for effect in reversed(executing):
        agent.resolve(effect.id, {"content": [{"type": "text", "text": f"ok {effect.id}"}]})


def test_feeding_the_copy_leaves_the_original_as_it_was() -> None:
    agent, executing = mid_turn_agent()
    twin, _ = mid_turn_agent()  # the same history, never copied
    parts, events = agent.state_parts(), _events(agent)
    assert twin.state_parts() == parts

    copy = agent.copy()
    assert copy.state_parts() == parts
    _assert_independent(agent, copy)
    copy.cancel({"kind": "user"})
    _settle_tools(copy, executing)
    copied_outputs = _finish(copy)
    assert len(copy.log) > len(events)
    assert agent.state_parts() == parts  # nothing of the copy's reached the original
    assert _events(agent) == events

    # and the original goes on as the agent that was never copied
    _settle_tools(agent, executing)
    _settle_tools(twin, executing)
    outputs = _finish(agent)
    assert outputs == _finish(twin)
    assert _events(agent) == _events(twin)
    assert agent.state_parts() == twin.state_parts()
    assert "agent/cancel-requested" in _live_types(copied_outputs)  # the copy's own cancel
    assert "agent/cancel-requested" not in _live_types(outputs)


def _live_types(outputs: list[JsonLike]) -> list[JsonLike]:
    return [o.get("type") for o in outputs if isinstance(o, dict) and o.get("out") == "live"]


def test_a_copy_of_a_copy_and_its_state_parts() -> None:
    agent, executing = mid_turn_agent()
    agent.cancel({"kind": "user"})
    outputs: list[JsonLike] = []
    while "agent/cancel-requested" not in _live_types(outputs):  # the cancel's notice is
        pulled = agent.next_output()  # observed: its scope is open (P7)
        assert pulled is not None
        outputs.append(pulled.to_json())
    copy = agent.copy()
    again = copy.copy()
    assert agent.state_parts() == copy.state_parts() == again.state_parts()
    _assert_independent(agent, again)
    _assert_independent(copy, again)
    futures: list[list[JsonLike]] = []
    for each in (agent, copy, again):
        each.followup(_message("after"))  # accepted while the notice is observed (P7, D9)
        _settle_tools(each, executing)
        futures.append(_finish(each))
    assert futures[0] == futures[1] == futures[2]
    assert _events(agent) == _events(copy) == _events(again)


def test_state_parts_are_plain_values() -> None:
    """The parts hold no frame or record object of the model, only plain values."""
    agent, _ = mid_turn_agent()

    def walk(value: Any) -> None:
        assert type(value).__module__ != ModelAgent.__module__, value
        if isinstance(value, (tuple, list)):
            for item in value:
                walk(item)

    walk(agent.state_parts())
