"""R4.13, the loop's declared graph (`machine.core.loop`), and where the core changes its state:
only `machine.core.state` moves the machines and writes the implicit machines' attributes
(R4, R4.11), and the core composes its parts instead of stacking classes."""

from __future__ import annotations

import ast
import importlib
import inspect
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scenario_helpers import Scenario, plant_phase

import machine.core
from machine.checking.invariants import AgentInvariantError, InvariantMonitor
from machine.checking.scripted import calls_reply
from machine.conformance.checker import run_vector
from machine.conformance.subjects import LocalSubject
from machine.conformance.vectors import find_vectors, load_vector
from machine.core import AgentCore, admission, loop, step, tools
from machine.core.loop import Action, ClaimFrame, StepFrame
from machine.core.records import Wait
from machine.core.state import CoreState
from machine.log import SessionLog

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "machine" / "core"
CORPUS = ROOT / "specs" / "conformance" / "vectors"


@pytest.fixture
def recorded() -> Iterator[set[tuple[str, str]]]:
    """What of the declared graph the loop takes while the test runs (`loop.seen`)."""
    loop.seen = set()
    try:
        yield loop.seen
    finally:
        loop.seen = None


# --------------------------------------------------------------------------
# The declaration
# --------------------------------------------------------------------------


def test_R4_13_every_declared_phase_has_its_function_and_every_function_its_phase() -> None:
    loop.verify()                           # raises naming what disagrees
    bound = {key for key in loop._bound}
    declared = {(kind.name, p.name) for kind in loop.KINDS for p in kind.phases
                if p.name != "finished"}
    assert bound == declared
    for kind in loop.KINDS:
        assert kind.name == kind.frame.KIND
        names = [p.name for p in kind.phases]
        assert len(names) == len(set(names)), kind.name
        assert kind.entry == names[0]


def _reach(edges: dict[str, set[str]], start: set[str]) -> set[str]:
    reached, todo = set(start), list(start)
    while todo:
        for to in edges[todo.pop()] - reached:
            reached.add(to)
            todo.append(to)
    return reached


def test_R4_13_each_kind_s_phases_are_reachable_from_its_entry_and_lead_to_an_end() -> None:
    """No phase of the declaration is unreachable (from the entry, or from the handler a
    caught failure goes to), and from each one the activity can end, but for the phase that
    only raises (the step's interrupted stream)."""
    for kind in loop.KINDS:
        edges = {p.name: set(p.goes) for p in kind.phases}
        handler = {kind.handler} if kind.handler is not None else set()
        assert _reach(edges, {kind.entry} | handler) == set(edges), kind.name
        ending = {p.name for p in kind.phases if p.ends}
        for p in kind.phases:
            assert _reach(edges, {p.name}) & ending or p.name == "interrupted", (kind.name, p)


def test_R4_13_the_loop_takes_every_declared_step(recorded: set[tuple[str, str]]) -> None:
    """The declaration is exact: the whole corpus, and the few failures it has no vector for
    (an invalid finalized result, a refused turn/end, a refused rejected-tail append, an
    abort before a call's prepare), take every declared phase change, start, wait and end."""
    subject = LocalSubject()
    for path in find_vectors([CORPUS]):
        outcome = run_vector(load_vector(path), subject)
        assert outcome.status == "passed", outcome
    _invalid_finalized_result()
    _refused_once("turn/end")
    _refused_rejected_tail_append()
    _aborted_before_prepare()
    assert loop.declared_steps() - recorded == set()
    assert recorded <= loop.declared_steps()


def _invalid_finalized_result() -> None:
    s = Scenario(calls_reply(("c1", "t", "{}")), "done")
    s.handle("tool-finalize", lambda _e: ("resolve", {"content": 5}))
    s.followup("go")
    s.run()
    assert s.errors() and "invalid tool result" in s.errors()[0][2]


def _refused_once(event_type: str) -> None:
    original = SessionLog.commit
    refused = [False]

    def commit(self: SessionLog, *args: Any, **kwargs: Any) -> Any:
        if args[0] == event_type and not refused[0]:
            refused[0] = True
            raise RuntimeError(f"{args[0]} refused once")
        return original(self, *args, **kwargs)

    SessionLog.commit = commit  # type: ignore[method-assign]
    try:
        s = Scenario("hi")
        s.followup("go")
        s.run()
    finally:
        SessionLog.commit = original  # type: ignore[method-assign]
    assert refused[0] and s.types()[-1] == event_type and s.core.failure is None


def _refused_rejected_tail_append() -> None:
    original = SessionLog.commit

    def commit(self: SessionLog, *args: Any, **kwargs: Any) -> Any:
        if args[0] == "user/message":
            raise RuntimeError("refused")
        return original(self, *args, **kwargs)

    s = Scenario()
    s.hold("prompt-submit")
    s.followup("go")
    s.run()
    s.inject("staged while admitting")
    SessionLog.commit = commit  # type: ignore[method-assign]
    try:
        s.resolve("prompt-submit", {"kind": "block", "reason": "no"})
    finally:
        SessionLog.commit = original  # type: ignore[method-assign]
    assert s.warned("staged context could not be written") and s.core.pending_context == 1


def _aborted_before_prepare() -> None:
    s = Scenario(calls_reply(("c1", "t", "{}")), "done")
    s.observe("tool/call", lambda _d: s.cancel(), once=True)
    s.followup("go")
    s.run()
    assert not s.effects("tool-prepare")


# --------------------------------------------------------------------------
# The check
# --------------------------------------------------------------------------


def _monitored(core: AgentCore) -> InvariantMonitor:
    return InvariantMonitor(core, core)


def _drive(core: AgentCore, monitor: InvariantMonitor) -> None:
    """followup, then answer every effect with the well-behaved environment until quiet."""
    core.followup({"id": "m1", "role": "user", "content": [{"type": "text", "text": "go"}],
                   "source": {"kind": "user"}})
    while True:
        while (output := core.next_output()) is not None:
            monitor.output(output)
        monitor.poll()
        outstanding = core.outstanding()
        if not outstanding:
            return
        effect = outstanding[0]
        answer: Any = {"prompt-submit": {"kind": "allow"}, "system-prompt": "sys",
                       "request": {"config": {"provider": "p", "model": "m"}}}.get(effect.kind)
        if effect.kind == "model":
            core.chunk(effect.id, {"type": "text", "text": "hi"})
            core.chunk(effect.id, {"type": "finish", "kind": "stop"})
            core.end(effect.id)
        else:
            core.resolve(effect.id, answer)


@pytest.mark.parametrize(("how", "named"), [
    ("skip", "claim: dequeue -> await_decision while submit runs (it skips dequeue)"),
    ("jump", "claim: submit -> await_decision is not a declared phase change"),
])
def test_R4_13_a_phase_change_off_the_graph_is_named_by_the_monitor(
        monkeypatch: pytest.MonkeyPatch, how: str, named: str) -> None:
    """Planted: the claim leaves out its dequeue notice, either passing through the phase
    that gives it without running it (two declared changes in a row) or going straight to
    the wait for the decision (a change the claim does not declare)."""
    submit = admission.claim_submit

    def skipping(core: CoreState, frame: ClaimFrame, sent: object) -> Action:
        action = submit(core, frame, sent)
        if frame.phase is admission.claim_dequeue:
            if how == "jump":
                loop._set_slot(frame, admission.claim_submit)   # as if submit had set none
            frame.phase = admission.claim_await_decision
        return action
    plant_phase(monkeypatch, admission, "claim_submit", skipping)
    core = AgentCore()
    with pytest.raises(AgentInvariantError) as caught:
        _drive(core, _monitored(core))
    assert caught.value.rule == "R4.13" and named in str(caught.value)
    loop.take_violations()


def test_R4_13_an_undeclared_wait_and_end_are_each_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted one at a time: a step that, after its header, waits for a completion at a
    phase that declares no wait; one that ends at its first phase, which is not an end."""
    header = step.step_header

    def waiting(core: CoreState, frame: StepFrame, sent: Any) -> Action:
        header(core, frame, sent)
        frame.phase = step.step_stream                  # declared: header -> stream
        return Wait(frozenset({10_000}))                # ... but stream is no wait

    def ending(core: CoreState, frame: StepFrame, sent: object) -> Action:
        return loop.DONE

    for target, planted, words in (("step_header", waiting, "step: it waits at stream"),
                                   ("step_begin", ending, "step: it ends at begin")):
        with monkeypatch.context() as patch:
            plant_phase(patch, step, target, planted)
            core = AgentCore()
            with pytest.raises(AgentInvariantError, match=words) as caught:
                _drive(core, _monitored(core))
            assert caught.value.rule == "R4.13"
        loop.take_violations()


def test_R4_13_an_undeclared_start_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: a claim that starts a tool batch, which no claim declares."""
    def claiming(core: CoreState, frame: ClaimFrame, sent: object) -> Action:
        frame.phase = admission.claim_submit
        return tools.tool_batch([])
    plant_phase(monkeypatch, admission, "claim_begin", claiming)
    core = AgentCore()
    with pytest.raises(AgentInvariantError, match="claim: at submit it starts a BatchFrame, "
                                                  "which it does not declare"):
        _drive(core, _monitored(core))
    loop.take_violations()


def test_R4_13_the_check_costs_nothing_until_it_is_asked_for() -> None:
    """A fresh interpreter stores a phase in the frame's slot; once the check is on, a
    phase is written through it."""
    probe = ("import machine.core.loop as l, machine.core; "
             "print(type(l.Frame.__dict__['phase']).__name__, l.CHECKING); "
             "l.check_phase_changes(); print(type(l.Frame.__dict__['phase']).__name__, l.CHECKING)")
    lines = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                           check=True, cwd=ROOT).stdout.split("\n")
    assert lines[:2] == ["member_descriptor False", "property True"]


# --------------------------------------------------------------------------
# One place for the state's changes (R4, R4.11), and composition
# --------------------------------------------------------------------------


def _sources() -> dict[str, ast.Module]:
    return {path.name: ast.parse(path.read_text(encoding="utf-8"))
            for path in sorted(CORE.glob("*.py"))}


def test_R4_11_only_the_state_module_fires_a_machine_or_writes_the_state() -> None:
    """No module of the core but `machine.core.state` fires a machine's trigger, or assigns
    (or mutates in place) an attribute of the state's implicit machines (``_owner``,
    ``_pending_retry``, ``_frames``, ...): they change only through its operations."""
    implicit = {name for name in vars(CoreState()) if name.startswith("_")}
    mutators = {"append", "appendleft", "clear", "pop", "popleft", "insert", "update", "add",
                "discard", "remove", "extend"}
    found: list[str] = []
    for name, tree in _sources().items():
        if name == "state.py":
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                if node.func.attr == "fire":
                    found.append(f"{name}:{node.lineno}: .fire(")
                target = node.func.value
                if (node.func.attr in mutators and isinstance(target, ast.Attribute)
                        and target.attr in implicit):
                    found.append(f"{name}:{node.lineno}: {target.attr}.{node.func.attr}(")
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                targets = [node.target]
            for target in targets:
                for part in ast.walk(target):
                    if isinstance(part, ast.Attribute) and part.attr in implicit:
                        found.append(f"{name}:{getattr(node, 'lineno', '?')}: {part.attr} =")
    assert found == []


def test_R4_11_the_machines_fire_from_the_state_module_s_operations() -> None:
    """Every trigger of the window and the lifecycle is fired, and only by the state's
    operations (the declared triggers are covered by tests/test_machines.py)."""
    source = (CORE / "state.py").read_text(encoding="utf-8")
    assert "self.lifecycle.fire(" in source and "self.window.fire(" in source
    fired_in = {node.name for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.FunctionDef) and ".fire(" in ast.unparse(node)}
    operations = {"request_wake", "claim", "admit", "reject", "start_run", "run_not_started",
                  "end_run", "start_flush", "retry", "go_idle", "begin_step", "enter_assembly",
                  "enter_request", "enter_stream", "enter_tools", "end_step", "enter_recovery",
                  "stop_turn", "_advance_idle"}
    assert fired_in == operations


def test_the_core_composes_its_parts_no_class_chain_is_deeper_than_two() -> None:
    """Each module of the core is functions over the state (or a small record); no class of
    the core stands on more than one other class of the library."""
    for info in pkgutil.iter_modules(machine.core.__path__):
        module = importlib.import_module(f"machine.core.{info.name}")
        for value in vars(module).values():
            if inspect.isclass(value) and value.__module__ == module.__name__:
                own = [c for c in value.__mro__ if c.__module__.startswith("machine.")]
                assert len(own) <= 2, (value, own)


def test_a_module_s_imports_say_which_other_parts_of_the_core_it_uses() -> None:
    """The rule modules import the state only for its type: the parts of the core each one
    runs are the modules it imports (admission runs a run, a run its steps, a step its tool
    batch, each the drains and failures)."""
    imported: dict[str, set[str]] = {}
    for name, tree in _sources().items():
        modules = set()
        for node in tree.body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                    "machine.core."):
                modules.add(node.module.rsplit(".", 1)[1])
        imported[name] = modules
    assert "state" not in set().union(*(imported[n] for n in (
        "admission.py", "run.py", "step.py", "tools.py", "drains.py", "failures.py",
        "commands.py")))
    assert {"run"} <= imported["admission.py"] and {"step"} <= imported["run.py"]
    assert {"tools"} <= imported["step.py"] and "step" not in imported["tools.py"]
