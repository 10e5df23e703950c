"""Snapshots of a core (specs/core.md R4.12, `AgentCore.snapshot`/`restore`/`copy`); the
log's marks and forks they rest on (L15) are tested with the log, in tests/test_log.py."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import pytest

from machine.conformance.checker import run_vector
from machine.conformance.subjects import LocalSubject
from machine.conformance.vectors import find_vectors, load_vector
from machine.core import AgentCore, CoreConfig, CoreSnapshot, loop, state_of
from machine.errors import InvariantError, NotPicklableError
from machine.io import Durable, Effect, Output, Send
from machine.jsonvalue import JsonLike
from machine.machines import Inbox, Lifecycle, Outbox, Window
from machine.vocabulary import FOLLOWUP, Message

CORPUS = Path(__file__).resolve().parent.parent / "specs" / "conformance" / "vectors"


def _msg(message_id: str, text: str = "hi") -> dict[str, JsonLike]:
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": text}],
            "source": {"kind": "user"}}


# ---------------------------------------------------------------------------
# R4.12: a restored core has the future of the core it was taken from
# ---------------------------------------------------------------------------


class RestoringSubject(LocalSubject):
    """The core in process, replaced after every input and every output by a core restored
    from its snapshot, by its copy, or by a core restored from its snapshot pickled and
    unpickled (in turn): a vector passes only if every restored core's future is the
    original's."""

    def __init__(self) -> None:
        super().__init__()
        self.restored = 0

    def _swap(self) -> None:
        before = self.core
        snapshot = before.snapshot()
        way = self.restored % 3
        if way == 1:
            self.core = before.copy()
        elif way == 2:
            unpickled = pickle.loads(pickle.dumps(snapshot))
            assert unpickled == snapshot, "an unpickled snapshot equals the snapshot"
            self.core = AgentCore.restore(unpickled)
        else:
            self.core = AgentCore.restore(snapshot)
        assert self.core.snapshot() == snapshot, "a restored core equals its snapshot"
        assert self.core.log is not before.log and len(self.core.log) == len(before.log)
        self.restored += 1

    def feed(self, value: dict[str, Any]) -> tuple[str, str] | None:
        refused = super().feed(value)
        self._swap()
        return refused

    def pull(self, count: int) -> list[dict[str, Any] | None]:
        outputs: list[dict[str, Any] | None] = []
        for _ in range(count):
            output = super().pull(1)
            outputs += output
            self._swap()
            if output[0] is None:
                break
        return outputs


def test_R4_12_a_core_restored_at_every_position_of_every_vector_continues_identically() -> None:
    subject = RestoringSubject()
    vectors = [load_vector(path) for path in find_vectors([CORPUS])]
    for vector in vectors:
        outcome = run_vector(vector, subject)
        assert outcome.status == "passed", (vector.id, outcome)
    assert len(vectors) > 200 and subject.restored > 10_000


def _mid_turn(first: str = "a", second: str = "b") -> tuple[AgentCore, Effect]:
    """A core inside a turn, waiting for its step hook, with a prompt queued behind: the
    prompts' ids are *first* (in the log by now) and *second* (queued)."""
    core = AgentCore(CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False))
    core.followup(_msg(first))
    while True:
        for output in core.drain_outputs():
            if isinstance(output, Effect):
                if output.kind == "step":
                    core.followup(_msg(second))
                    return core, output
                core.resolve(output.id, {"kind": "allow"} if output.kind == "prompt-submit"
                             else None)


def _script(core: AgentCore, effect: Effect) -> list[object]:
    """Drive *core* from its step hook to quiescence with fixed answers; what came out."""
    seen: list[object] = []
    core.resolve(effect.id, None)
    for _ in range(200):
        outputs = core.drain_outputs()
        if not outputs and not core.outstanding():
            break
        for output in outputs:
            seen.append(output.to_json(with_time=False) if isinstance(output, Durable)
                        else output.to_json())
        for pending in core.outstanding():
            kind = pending.kind
            if kind == "model":
                core.chunk(pending.id, {"type": "text", "text": "ok"})
                core.chunk(pending.id, {"type": "finish", "kind": "stop"})
                core.end(pending.id)
            elif kind == "prompt-submit":
                core.resolve(pending.id, {"kind": "allow"})
            elif kind == "request":
                core.resolve(pending.id, {"config": {"provider": "p", "model": "m"}})
            else:
                core.resolve(pending.id, None)
    return seen


def test_R4_12_restore_is_independent_of_the_original_and_repeatable() -> None:
    core, effect = _mid_turn()
    snapshot = core.snapshot()
    first = AgentCore.restore(snapshot)
    expected = _script(core, effect)            # the original goes on, appending events
    assert len(core.log) > snapshot.log_length
    assert _script(first, effect) == expected   # unaffected by the original's appends
    second = AgentCore.restore(snapshot)        # and the snapshot restores again
    assert len(second.log) == snapshot.log_length
    assert _script(second, effect) == expected
    assert snapshot == AgentCore.restore(snapshot).snapshot()


def test_R4_12_snapshots_compare_and_hash_by_value() -> None:
    core, _ = _mid_turn()
    a, b = core.snapshot(), core.copy().snapshot()
    assert a == b and hash(a) == hash(b) and len({a, b}) == 1
    core.followup(_msg("c"))
    c = core.snapshot()
    assert c != a and c.pending_queued == a.pending_queued + 1
    assert a != object() and isinstance(a, CoreSnapshot)


def test_R4_12_the_symmetric_key_equates_states_that_differ_only_in_message_ids() -> None:
    one, other = AgentCore(), AgentCore()
    one.followup(_msg("m1"))
    other.followup(_msg("zz-9"))
    assert one.snapshot() != other.snapshot()
    assert one.snapshot().key(symmetric=True) == other.snapshot().key(symmetric=True)
    other.followup(_msg("m2", "another text"))
    assert one.snapshot().key(symmetric=True) != other.snapshot().key(symmetric=True)


def test_R4_12_the_symmetric_key_renames_ids_in_the_log_and_the_state_alike() -> None:
    """The symmetry holds across the log and the rest of the state: the same turn on
    prompts named differently (swapped names included) gives one symmetric key; one more
    queued prompt does not."""
    a, _ = _mid_turn("a", "b")
    b, _ = _mid_turn("x1", "y2")
    swapped, _ = _mid_turn("b", "a")
    assert len(a.log) > 0 and a.snapshot() != b.snapshot()
    assert a.snapshot().key(symmetric=True) == b.snapshot().key(symmetric=True)
    assert swapped.snapshot().key(symmetric=True) == a.snapshot().key(symmetric=True)
    c, _ = _mid_turn("a", "a2")
    c.followup(_msg("c3"))
    assert c.snapshot().key(symmetric=True) != a.snapshot().key(symmetric=True)


def test_R4_12_snapshots_tell_apart_states_that_differ_only_in_a_message_s_content() -> None:
    one, other = AgentCore(), AgentCore()
    one.followup(_msg("m1", "hello"))
    other.followup(_msg("m1", "goodbye"))
    assert one.snapshot() != other.snapshot()
    assert one.snapshot().key(symmetric=True) != other.snapshot().key(symmetric=True)


def _queued_key(*messages: dict[str, JsonLike]) -> tuple[object, ...]:
    """The symmetric key of an idle core holding *messages* queued, its outputs pulled (so
    the queued messages are the only place their contents are held)."""
    core = AgentCore()
    for message in messages:
        core.followup(message)
    core.drain_outputs()
    return core.snapshot().key(symmetric=True)


def test_R4_12_the_symmetric_key_of_queued_messages_keeps_their_contents_and_repeated_ids(
        ) -> None:
    assert _queued_key(_msg("m1", "hello")) != _queued_key(_msg("m1", "goodbye"))
    assert _queued_key(_msg("a", "x"), _msg("b", "y")) == _queued_key(_msg("p", "x"),
                                                                      _msg("q", "y"))
    assert _queued_key(_msg("a", "x"), _msg("a", "y")) != _queued_key(_msg("a", "x"),
                                                                      _msg("b", "y"))


def _refuse_notes(log: object, event_type: str, data: object) -> str | None:
    return "notes are refused"


def test_R4_12_a_restored_core_has_the_log_rules_of_its_snapshot() -> None:
    """L15, L10: a rule registered on the original after the snapshot does not reach the
    restored core, and one registered before it does, however often the snapshot restores."""
    core = AgentCore(CoreConfig(publish=False))
    allowing = core.snapshot()
    core.log.register_rule("x/note", _refuse_notes)
    refusing = core.snapshot()
    core.log.register_rule("x/note", lambda *_: None)
    for _ in range(2):
        assert AgentCore.restore(allowing).append("x/note", {}).type == "x/note"
        with pytest.raises(InvariantError, match="notes are refused"):
            AgentCore.restore(refusing).append("x/note", {})
    core.append("x/note", {})                               # the original's rule now
    core.log.register_rule("x/note", _refuse_notes)
    with pytest.raises(InvariantError, match="notes are refused"):
        core.copy().append("x/note", {})                    # a copy takes the rules as they are


def test_R4_12_snapshots_of_logs_with_different_rules_differ() -> None:
    """Equal snapshots have equal futures: the same state and events with a rule registered
    on one log only are different snapshots, with or without the symmetry."""
    plain = AgentCore(CoreConfig(publish=False))
    ruled = AgentCore(CoreConfig(publish=False))
    assert plain.snapshot() == ruled.snapshot()
    ruled.log.register_rule("x/note", _refuse_notes)
    assert plain.snapshot() != ruled.snapshot()
    assert plain.snapshot().key(symmetric=True) != ruled.snapshot().key(symmetric=True)
    plain.log.register_rule("x/note", _refuse_notes)
    assert plain.snapshot() == ruled.snapshot()
    assert hash(plain.snapshot()) == hash(ruled.snapshot())


def test_R4_12_a_snapshot_pickles_as_a_checkpoint_with_the_same_future() -> None:
    """A snapshot taken inside a turn, pickled and unpickled, is equal to it and restores
    (any number of times) to a core with the original's future; its log holds the events up
    to the snapshot's position only, with the log rules registered then (L15)."""
    core, effect = _mid_turn()
    core.log.register_rule("x/note", _refuse_notes)
    snapshot = core.snapshot()
    data = pickle.dumps(snapshot)
    core.log.register_rule("x/note", lambda *_: None)
    expected = _script(core, effect)                    # the original goes on
    unpickled = pickle.loads(data)
    assert isinstance(unpickled, CoreSnapshot) and unpickled == snapshot
    assert unpickled.key(symmetric=True) == snapshot.key(symmetric=True)
    assert (unpickled.status, unpickled.log_length, unpickled.pending_queued) == (
        snapshot.status, snapshot.log_length, snapshot.pending_queued)
    for _ in range(2):
        restored = AgentCore.restore(unpickled)
        assert len(restored.log) == snapshot.log_length
        with pytest.raises(InvariantError, match="notes are refused"):
            restored.append("x/note", {})
    assert _script(AgentCore.restore(unpickled), effect) == expected


def _local_clock() -> float:
    return 0.0


@pytest.mark.parametrize(("make", "part"), [
    (lambda: AgentCore(clock=lambda: 0.0), "the log's clock"),
    (lambda: AgentCore(mint_id=lambda kind, seq: f"{kind}{seq}"), "the id minting (mint_id)"),
    (lambda: _with_rule(AgentCore(), lambda *_: None), "the log rule of 'x/note'"),
], ids=["clock", "mint-id", "log-rule"])
def test_R4_12_a_snapshot_with_a_part_that_cannot_be_pickled_is_refused_naming_it(
        make: Any, part: str) -> None:
    """V9: a typed error naming the part and what to use instead, not the pickler's own
    error about a lambda; copying the snapshot still works (it is a value: the same one)."""
    snapshot = make().snapshot()
    with pytest.raises(NotPicklableError, match="a snapshot cannot be pickled") as caught:
        pickle.dumps(snapshot)
    message = str(caught.value)
    assert f"{part} (<function" in message and "<lambda>" in message
    assert "module-level functions" in message and "machine.store" in message
    assert isinstance(caught.value, pickle.PicklingError)
    assert caught.value.code == "NOT_PICKLABLE"
    assert copy.deepcopy(snapshot) is snapshot and copy.copy(snapshot) is snapshot


def _with_rule(core: AgentCore, check: Any) -> AgentCore:
    core.log.register_rule("x/note", check)
    return core


def test_R4_12_a_snapshot_with_module_functions_as_its_parts_pickles() -> None:
    """The other side: a clock, id minting and rule that are module functions pickle by
    name, and the restored core uses them."""
    core = AgentCore(CoreConfig(publish=False), clock=_local_clock, mint_id=_mint)
    core.log.register_rule("x/note", _refuse_notes)
    restored = AgentCore.restore(pickle.loads(pickle.dumps(core.snapshot())))
    assert state_of(restored)._mint is _mint and restored.log._clock is _local_clock
    assert restored.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}}).time == 0.0
    with pytest.raises(InvariantError, match="notes are refused"):
        restored.append("x/note", {})


def _mint(kind: str, seq: int) -> str:
    return f"{kind}:{seq}"


def test_R4_12_restore_takes_only_a_snapshot() -> None:
    with pytest.raises(TypeError, match="CoreSnapshot"):
        AgentCore.restore(AgentCore())  # type: ignore[arg-type]


def test_R4_12_a_snapshot_of_a_torn_down_core_restores_torn_down() -> None:
    core = AgentCore()
    core.followup(_msg("a"))
    core.dispose()
    while not core.disposed:
        core.drain_outputs()
        for effect in core.outstanding():
            core.resolve(effect.id, None)
    restored = AgentCore.restore(core.snapshot())
    assert restored.disposed and restored.status == "idle"
    with pytest.raises(Exception, match="dispos"):
        restored.feed(Send(_msg("b"), FOLLOWUP, preset="followup"))


def test_R4_12_copying_shares_immutable_values_and_copies_the_rest_once() -> None:
    """O(state): queued messages are shared, not copied; mutable records are copied once,
    so two parts of the state that share one record share its copy."""
    core, _ = _mid_turn()
    original, copy = state_of(core), state_of(core.copy())
    assert copy.inbox is not original.inbox
    assert copy.inbox._items[0][0] is original.inbox._items[0][0]
    assert copy._owner is copy._ctrl and copy._ctrl is not original._ctrl
    assert copy._frames[-1] is not original._frames[-1]


def test_R4_12_the_log_is_not_part_of_what_a_snapshot_copies() -> None:
    core, effect = _mid_turn()
    core.resolve(effect.id, None)
    outputs: list[Output] = core.drain_outputs()
    assert outputs
    snapshot = core.snapshot()
    assert snapshot.log_length == len(core.log)
    assert snapshot._log is core.log                 # by reference, up to its length


def _core_records() -> list[type]:
    """Every dataclass the core's modules define that a copy does not share."""
    import dataclasses
    import importlib
    import pkgutil

    import machine.core
    from machine.core.snapshot import _is_shared
    found: list[type] = []
    for module_info in pkgutil.iter_modules(machine.core.__path__):
        module = importlib.import_module(f"machine.core.{module_info.name}")
        for value in vars(module).values():
            if (isinstance(value, type) and dataclasses.is_dataclass(value)
                    and value.__module__ == module.__name__ and not _is_shared(value)):
                found.append(value)
    return found


@pytest.mark.parametrize("kind", _core_records(), ids=lambda kind: kind.__qualname__)
def test_R4_12_a_copied_record_copies_every_field(kind: type) -> None:
    import dataclasses

    from machine.core.snapshot import duplicate
    original: Any = object.__new__(kind)
    names = [field.name for field in dataclasses.fields(kind)]
    shared = {"shared": 1}              # one mutable value in every field: copied once
    for name in names:
        object.__setattr__(original, name, [name, shared])
    memo: dict[int, Any] = {}
    copied = duplicate(original, memo)
    assert type(copied) is kind and copied is not original
    assert memo[id(original)] is copied
    assert duplicate(original, memo) is copied
    first = getattr(copied, names[0])[1]
    for name in names:
        value = getattr(copied, name)
        assert value == [name, shared] and value is not getattr(original, name)
        assert value[1] is first and first is not shared
    loop.take_violations()      # R4.13: a list set as a frame's phase is off the graph, on purpose


def test_R4_12_copying_a_value_the_core_never_holds_is_refused_each_time() -> None:
    from machine.core.snapshot import duplicate

    class Stranger:
        pass
    for _ in range(2):
        with pytest.raises(TypeError, match=r"a core holds no .*Stranger: cannot copy it"):
            duplicate([Stranger()], {})


def _filled_machines() -> list[object]:
    """Each machine of the core with items in it (R4.1): two queued prompts, one waking;
    a context and a steering message staged; a window and a lifecycle past their start."""
    inbox, outbox, window, lifecycle = Inbox(), Outbox(), Window(), Lifecycle()
    inbox.enqueue(Message.from_json(_msg("q1")), True)
    inbox.enqueue(Message.from_json(_msg("q2")), False)
    outbox.stage(Message.from_json(_msg("c1")), False)
    outbox.stage(Message.from_json(_msg("s1")), True)
    window.state = "turn"
    lifecycle.state = "wake_pending"
    return [inbox, outbox, window, lifecycle]


@pytest.mark.parametrize("machine", _filled_machines(), ids=lambda m: type(m).__name__)
def test_R4_12_a_machine_s_copy_copies_every_slot_and_shares_no_container(machine: Any) -> None:
    """R4.1: each machine's own `copy` (which the core's copy uses for them) holds every
    slot equal and no mutable container in common; emptying the copy leaves the original
    as it was, and emptying the original leaves the copy."""
    kind = type(machine)
    copied = machine.copy()
    assert type(copied) is kind and copied is not machine
    for name in kind.__slots__:
        mine, theirs = getattr(machine, name), getattr(copied, name)
        assert mine == theirs or list(mine) == list(theirs), name
        if not isinstance(mine, (str, int)):
            assert mine is not theirs, f"{kind.__name__}.{name} is shared with the copy"
    if hasattr(machine, "snapshot"):
        before = machine.snapshot()
        assert before and copied.snapshot() == before
        (copied.discard if kind is Inbox else copied.clear)()
        assert machine.snapshot() == before and len(machine) == len(before)
        again = machine.copy()
        (machine.discard if kind is Inbox else machine.clear)()
        assert again.snapshot() == before and not machine.snapshot()


def test_R4_12_a_copy_with_staged_and_queued_input_is_independent_of_the_original() -> None:
    """R11, R16.2: a core inside a step with steering and context staged and a prompt
    queued is copied and restored; the original drains and runs on, and each copy, run
    after it, has the future the original had (nothing of what the original took, or
    appended, reaches them)."""
    core, effect = _mid_turn()
    core.steer(_msg("s1", "turn left"))
    core.inject({**_msg("c1", "the map"), "source": {"kind": "plugin", "plugin": "atlas"}})
    assert (core.pending_steering, core.pending_context, core.pending_queued) == (1, 1, 1)
    copied, snapshot = core.copy(), core.snapshot()
    expected = _script(core, effect)
    assert (core.pending_steering, core.pending_context, core.pending_queued) == (0, 0, 0)
    drained = [o for o in expected if isinstance(o, dict) and o.get("type") == "user/message"]
    assert drained, "the original drained what was staged"
    assert (copied.pending_steering, copied.pending_context, copied.pending_queued) == (1, 1, 1)
    assert _script(copied, effect) == expected
    assert _script(AgentCore.restore(snapshot), effect) == expected
