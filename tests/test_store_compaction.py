"""Compaction (§25; specs/persistence.md S19–S21)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine import events as ev
from machine.checking.scripted import Driver, ScriptedEnvironment, text_reply
from machine.core import AgentCore, CoreConfig
from machine.errors import ValidationError
from machine.io import FLUSH, MODEL, STEP_HOOK, Effect
from machine.log import SessionLog, derive_history, validate_events
from machine.store import (
    CompactionError,
    JsonlStore,
    StoreSink,
    checkpoint_message,
    choose_compaction_range,
    compact,
    surface_nodes,
)
from machine.store.testing import LogBuilder, sample_session
from machine.vocabulary import user_message


def in_turn_3() -> LogBuilder:
    """The balanced sample, then turn 3 open at its first step (between two steps)."""
    b = LogBuilder(sample_session(open_tail=False))
    b.turn(3)
    b.user("third")
    return b


def texts(log: SessionLog) -> list[str]:
    return [m.text or m.id for m in log.history(len(log))]


def test_S19_surface_nodes_are_the_derived_history_with_origins() -> None:
    b = in_turn_3()
    nodes = surface_nodes(b.log.events)
    assert tuple(n.message for n in nodes) == derive_history(b.log.events)
    assert [n.origin for n in nodes] == [e.seq for e in b.log.events if e.is_surface]


def test_S19_a_checkpoint_replaces_a_range_including_between_turn_messages() -> None:
    b = in_turn_3()
    log = b.log
    assert log[9].type == ev.USER_MESSAGE and log[8].type == ev.TURN_END  # between turns
    summary = checkpoint_message("cp1", "summary of turn 1 and the injection")
    event = compact(log, 0, 9, summary)
    shadowed = [e.seq for e in log.events[:10] if e.is_surface]
    assert event.type == ev.USER_MESSAGE
    assert event.surface_op == {"op": "replace", "start": 0, "end": 9}
    assert event.source_event_seqs == shadowed
    assert event.data["source"] == {"kind": "plugin", "plugin": "compact"}
    assert texts(log)[0] == "summary of turn 1 and the injection"
    assert texts(log)[1:] == ["more", "ok", "i2", "i3", "third"]
    assert tuple(log.history(len(log))) == derive_history(log.events)
    assert validate_events(log.events) is None


def test_S20_refused_outside_an_open_turn() -> None:
    log = LogBuilder(sample_session(open_tail=False)).log
    with pytest.raises(CompactionError) as raised:
        compact(log, 0, 9, checkpoint_message("cp", "x"))
    assert raised.value.code == "COMPACTION_OUTSIDE_TURN"
    assert len(log) == len(sample_session(open_tail=False))


def test_S20_refused_when_the_range_cuts_a_call_from_its_result() -> None:
    log = in_turn_3().log
    assert log[4].type == ev.ASSISTANT_MESSAGE and log[6].type == ev.TOOL_RESULT
    for start, end in ((0, 5), (6, 9)):  # call in, result out; result in, call out
        with pytest.raises(CompactionError) as raised:
            compact(log, start, end, checkpoint_message("cp", "x"))
        assert raised.value.code == "COMPACTION_CUTS_TOOL_CALL"
    compact(log, 0, 6, checkpoint_message("cp", "x"))  # call and result together: fine


def test_S20_refused_when_a_call_of_the_open_step_is_unanswered() -> None:
    b = in_turn_3()
    b.step(3, 1)
    am = b.assistant(3, 1, "calling", calls=["c9"])
    with pytest.raises(CompactionError, match="still unanswered") as raised:
        compact(b.log, 0, am.seq, checkpoint_message("cp", "x"))
    assert raised.value.code == "COMPACTION_CUTS_TOOL_CALL"
    assert choose_compaction_range(b.log, keep_tail=0) == (0, am.seq - 2)  # stops before it


def test_S20_empty_ranges_and_bad_arguments() -> None:
    log = in_turn_3().log
    with pytest.raises(CompactionError) as raised:
        compact(log, 1, 1, checkpoint_message("cp", "x"))  # a turn/start: no surface node
    assert raised.value.code == "COMPACTION_EMPTY_RANGE"
    with pytest.raises(ValidationError):
        compact(log, 5, 2, checkpoint_message("cp", "x"))
    with pytest.raises(ValidationError):
        compact(log, 0, len(log), checkpoint_message("cp", "x"))
    with pytest.raises(ValidationError, match="compact"):
        compact(log, 0, 2, user_message("cp", "not a checkpoint"))


def test_S21_the_chooser_keeps_a_tail_and_never_cuts_a_call() -> None:
    log = in_turn_3().log
    nodes = surface_nodes(log.events)  # origins 0 2 4 6 9 11 13 16 17 19
    assert choose_compaction_range(log, keep_tail=3) == (0, 13)
    assert choose_compaction_range(log, keep_tail=6) == (0, 6)
    assert choose_compaction_range(log, keep_tail=7) == (0, 2)  # (0, 4) would cut c1
    assert choose_compaction_range(log, keep_tail=8) == (0, 2)
    assert choose_compaction_range(log, keep_tail=len(nodes)) is None
    assert choose_compaction_range(log, keep_tail=8, min_nodes=3) is None
    assert choose_compaction_range(list(log.events), keep_tail=3) == (0, 13)
    with pytest.raises(ValidationError):
        choose_compaction_range(log, keep_tail=-1)


def test_S21_repeated_compaction_shadows_the_earlier_checkpoint() -> None:
    b = in_turn_3()
    log = b.log
    first = compact(log, 0, 9, checkpoint_message("cp1", "first summary"))
    b.step(3, 1)
    b.assistant(3, 1, "a3")
    b.step_end(3, 1)
    b.user("later", plugin="p")
    start, end = choose_compaction_range(log, keep_tail=1) or (0, 0)
    second = compact(log, start, end, checkpoint_message("cp2", "second summary"))
    assert first.seq in second.source_event_seqs  # type: ignore[operator]
    assert texts(log) == ["second summary", "later"]
    assert tuple(log.history(len(log))) == derive_history(log.events)


def test_S21_a_tail_older_than_the_checkpoint_limits_the_range() -> None:
    """The checkpoint's seq is above the tail it kept: a seq range holding both the
    checkpoint and older nodes would shadow that tail too, so the chooser stops short."""
    log = in_turn_3().log
    checkpoint = compact(log, 0, 9, checkpoint_message("cp1", "first summary"))
    assert choose_compaction_range(log, keep_tail=1) == (checkpoint.seq, checkpoint.seq)
    assert choose_compaction_range(log, keep_tail=0) == (11, checkpoint.seq)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10), st.integers(1, 3))
def test_S21_chosen_ranges_are_always_accepted(keep_tail: int, rounds: int) -> None:
    log = in_turn_3().log
    for number in range(rounds):
        chosen = choose_compaction_range(log, keep_tail)
        if chosen is None:
            break
        before = surface_nodes(log.events)
        compact(log, *chosen, checkpoint_message(f"cp{number}", f"summary {number}"))
        after = surface_nodes(log.events)
        kept = before[len(before) - keep_tail:] if keep_tail else []
        assert after[len(after) - len(kept):] == kept if kept else True
        assert after[0].message.id == f"cp{number}"
    assert validate_events(log.events) is None
    assert tuple(log.history(len(log))) == derive_history(log.events)


def test_compaction_from_the_step_hook_is_persisted_and_reaches_the_request(
        tmp_path: Path) -> None:
    """Through AgentCore.append: the driver, the store and the next request all see it."""
    store = JsonlStore(tmp_path)
    store.create("s")
    sink = StoreSink(store, "s")
    core = AgentCore(CoreConfig(request_options={"provider": "t", "model": "m"}))
    env = ScriptedEnvironment(replies=[text_reply("one"), text_reply("two")])
    env.handlers[FLUSH] = sink.answer_flush
    compacted: list[Any] = []

    def step_hook(effect: Effect) -> tuple[str, None]:
        if effect.payload["turn"] == 2 and not compacted:
            chosen = choose_compaction_range(core.log, keep_tail=1)
            assert chosen is not None
            compacted.append(compact(core, *chosen, checkpoint_message("cp", "summary")))
        return "resolve", None

    env.handlers[STEP_HOOK] = step_hook
    driver = Driver(core, env)
    driver.on(sink)
    core.followup(user_message("p1", "first"))
    driver.run()
    core.inject(user_message("ctx", "between turns", {"kind": "plugin", "plugin": "x"}))
    core.followup(user_message("p2", "second"))
    driver.run()
    request = driver.effects(MODEL)[1].history
    assert request is not None
    assert [m.id for m in request] == ["cp", "p2"]
    assert compacted[0].source_event_seqs == [1, 6, 9]  # first, one, between turns
    store.close()
    stored = JsonlStore(tmp_path).load("s").events
    assert list(stored) == list(core.log.events)
    assert derive_history(stored)[0].id == "cp"
