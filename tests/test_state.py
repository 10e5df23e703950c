"""The core's state in one place and the couplings of its machines (specs/core.md R4.11,
`machine.core.state`)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from machine.checking.invariants import AgentInvariantError, InvariantMonitor
from machine.conformance.checker import run_vector
from machine.conformance.subjects import LocalSubject
from machine.conformance.vectors import find_vectors, load_vector
from machine.core import AgentCore, state_of
from machine.core.records import Controller
from machine.core.state import CoreState
from machine.io import Effect

CORPUS = Path(__file__).resolve().parent.parent / "specs" / "conformance" / "vectors"


class CouplingSubject(LocalSubject):
    """The core in process, its couplings checked after every input and every output."""

    def __init__(self) -> None:
        super().__init__()
        self.checked = 0

    def _check(self, where: str) -> None:
        problems = self.core.coupling_problems()
        assert problems == [], (where, problems)
        self.checked += 1

    def feed(self, value: dict[str, Any]) -> tuple[str, str] | None:
        refused = super().feed(value)
        self._check(f"after input {value.get('in')}")
        return refused

    def pull(self, count: int) -> list[dict[str, Any] | None]:
        outputs: list[dict[str, Any] | None] = []
        for _ in range(count):
            output = super().pull(1)
            outputs += output
            if output[0] is None:
                break
            self._check(f"at output {output[0]}")
        return outputs


def test_R4_11_the_couplings_hold_at_every_input_and_output_of_every_vector() -> None:
    subject = CouplingSubject()
    vectors = [load_vector(path) for path in find_vectors([CORPUS])]
    for vector in vectors:
        outcome = run_vector(vector, subject)
        assert outcome.status == "passed", (vector.id, outcome)
    assert len(vectors) > 200 and subject.checked > 10_000


def _running_core() -> tuple[AgentCore, Effect]:
    """A core in the middle of a turn, waiting for its step hook."""
    core = AgentCore()
    core.drain_outputs()
    core.followup({"id": "m1", "role": "user", "content": [{"type": "text", "text": "go"}],
                   "source": {"kind": "user"}})
    while True:
        effects = [o for o in core.drain_outputs() if isinstance(o, Effect)]
        for effect in effects:
            if effect.kind == "prompt-submit":
                core.resolve(effect.id, {"kind": "allow"})
            elif effect.kind == "step":
                return core, effect
            else:
                core.resolve(effect.id, None)


@pytest.mark.parametrize(("number", "breaking"), [
    ("(1)", lambda state: setattr(state.window, "state", "closed")),
    ("(2)", lambda state: setattr(state, "_owner", None)),
    ("(2)", lambda state: setattr(state, "_owner", Controller(99, "run"))),
    ("(3)", lambda state: setattr(state, "_wake_effect", 7)),
    ("(4)", lambda state: setattr(state, "_pending_retry", True)),
    ("(5)", lambda state: state._frames.clear()),
    ("(6)", lambda state: setattr(state, "_disposed", True)),
    ("(7)", lambda state: setattr(state, "_failure", object())),
])
def test_R4_11_each_broken_coupling_is_named_and_the_monitor_refuses_it(
        number: str, breaking: Any) -> None:
    core, _ = _running_core()
    monitor = InvariantMonitor(core, core)
    assert core.coupling_problems() == []
    monitor.poll()
    breaking(state_of(core))
    problems = core.coupling_problems()
    assert any(p.startswith(number) for p in problems), problems
    with pytest.raises(AgentInvariantError) as caught:
        monitor.poll()
    assert caught.value.rule == "R4.11"


def test_R4_11_the_couplings_hold_in_an_idle_and_a_torn_down_core() -> None:
    core = AgentCore()
    assert core.coupling_problems() == []
    core.dispose()
    core.drain_outputs()
    assert core.disposed and core.coupling_problems() == []


def test_R4_the_state_is_declared_in_one_place() -> None:
    """R4: every attribute a core holds is set by `CoreState.__init__`; no layer above it
    adds state of its own (a driven core has exactly the attributes of a fresh one)."""
    fresh = set(vars(CoreState()))
    core, _ = _running_core()
    assert set(vars(state_of(core))) == fresh and set(vars(core)) == {"_state"}
    assert {"inbox", "outbox", "window", "lifecycle"} <= fresh


def test_R4_the_spec_inventory_maps_one_to_one_onto_the_state() -> None:
    """specs/core.md's table "R4 in the implementation" names every attribute of
    `CoreState` but its configuration, log and id minting, and no other."""
    text = (Path(__file__).resolve().parent.parent / "specs" / "core.md").read_text(
        encoding="utf-8")
    table = text[text.index("**R4 in the implementation.**"):]
    table = table[:table.index("\n\n", table.index("| rule |"))]
    named: set[str] = set()
    for row in [line for line in table.splitlines() if line.startswith("|")][2:]:
        named |= set(re.findall(r"`(_?[a-z_]+)`", row.split("|")[3]))
    attributes = set(vars(CoreState())) - {"config", "log", "_mint"}
    assert attributes <= named, f"not in the table: {sorted(attributes - named)}"
    others = named - attributes
    methods = {name for name in others if hasattr(AgentCore, name) or hasattr(CoreState, name)}
    log_reads = {"open_turn", "open_step", "last_turn"}
    assert others - methods - log_reads == set(), sorted(others - methods - log_reads)


def test_R4_11_a_wait_without_a_loop_is_named_on_its_own() -> None:
    """R4.11 (5), its second half: an idle core (so the first half holds) whose loop is
    said to wait for a completion, with no loop to wait in."""
    core = AgentCore()
    assert core.coupling_problems() == []
    state_of(core)._wait = frozenset({0})
    assert core.coupling_problems() == ["(5) the loop waits but does not exist"]


def test_R4_11_the_owner_coupling_says_whether_the_owner_is_missing_or_extra() -> None:
    """R4.11 (2): the problem names which way the coupling broke."""
    core, _ = _running_core()
    state = state_of(core)
    state._owner = None
    assert [p for p in core.coupling_problems() if p.startswith("(2)")] == [
        f"(2) an abort owner is missing while the lifecycle is {state.lifecycle.state!r}"]
    idle = CoreState()
    idle._owner = idle._ctrl = Controller(1, "run")
    assert [p for p in idle.coupling_problems() if p.startswith("(2)")] == [
        "(2) an abort owner exists while the lifecycle is 'idle'"]


def test_R4_11_a_torn_down_core_and_a_stopped_core_name_their_broken_coupling() -> None:
    """R4.11 (6) and (7), each broken on its own in an idle core, named in full."""
    torn = CoreState()
    torn._disposed = True                       # torn down without disposing
    assert torn.coupling_problems() == [
        "(6) torn down, but not disposing, not idle, or holding input"]
    stopped = CoreState()
    stopped._failure = object()                 # type: ignore[assignment]  # stopped (P16)
    stopped._frames.append(object())            # type: ignore[arg-type]  # ... with a loop
    assert stopped.coupling_problems() == ["(7) the core stopped but still waits for something"]
