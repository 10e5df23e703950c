"""Bounded exhaustive exploration (ASSURANCE §2): every configuration at its CI depth, the
rule families it must reach, and proof that it can fail.

Each configuration of `machine.checking.search.CONFIGURATIONS` (a fresh agent; inside a turn; a
failed turn's recovery; a parallel pool larger than its limit; a resumed session) is
explored with the reference model compared at every step. The CI depths are sized for
about half a minute of CPU in all; the ``deep`` profile (``TURNSTILE_PROFILE=deep`` or
``make check-deep``) goes deeper.
"""

from __future__ import annotations

import gc
import os
import random
from collections.abc import Callable
from typing import Any

import pytest

from machine.checking.invariants import AgentInvariantError, InvariantMonitor, next_status_ok, window_ok
from machine.checking.key import core_parts, exact_text, implementation_parts, renamed, state_key
from machine.checking.reach import FAMILIES, ROWS
from machine.checking.search import CONFIGURATIONS, Explorer, ExploreResult, Node, classic_explorer
from machine.core import AgentCore, commands
from machine.core.state import CoreState
from machine.events import LiveEvent
from machine.io import Live
from machine.jsonvalue import FrozenDict, freeze
from machine.log import SessionLog

DEEP = os.environ.get("TURNSTILE_PROFILE") == "deep"

#: The families each configuration is there to reach (the union must be all of FAMILIES).
EXPECTED: dict[str, set[str]] = {
    "idle": {"R5.2-now", "R5.2-staged", "R5.3", "R5.7", "R6", "R7", "R7.10", "R8.3-after-rejection",
             "R10.4-contexts", "R12.4", "R13", "R14", "R16", "R16.5"},
    "turn": {"R10", "R10.4-contexts", "R10.7", "R10.9", "R11", "R13.3", "R15.1", "R15.2",
             "R16.3", "R16.3-dispose", "R17"},
    "recovering": {"R13.2.3", "R13.3", "R13.4-chain", "R13.5-flush", "R16.3-dispose"},
    "parallel": {"R10.2", "R10.2-limit", "R10.7", "R10.11", "R10.9"},
    "seeded": {"R9.6-resume", "R17"},
}
#: The sequences in which planted bugs went unseen at the CI depths (issue 28), as the
#: families that mark them, each with how many decisions the search must still have left
#: once a path has reached it: the wrong outcome of a retry decided there shows only when
#: the failed turn's flush is answered next.
SEQUENCES: dict[str, tuple[int, str]] = {
    "R13.4-chain": (0, "two consecutive failed runs: the retry run's failure is recovered "
                       "with the first as a prior failure"),
    "R13.5-flush": (1, "a cancel during the failed turn's flush, its retry pending (D2)"),
    "R8.3-after-rejection": (0, "a blocked admission that kept steering staged, then a "
                                "second prompt whose run start drains it"),
    "R10.4-contexts": (0, "a tool result with additional contexts, committed and drained"),
    "R16.3-dispose": (0, "a cancel after a dispose aborted the activity: the dispose's cause "
                         "stays"),
    "R13.2.3": (1, "a retry authorized after a cancel aborted the failed step's signal"),
}

_results: dict[str, ExploreResult] = {}


def explored(name: str) -> ExploreResult:
    """The exploration of one configuration at its depth (run once per session)."""
    if name not in _results:
        configuration = CONFIGURATIONS[name]
        depth = configuration.deep_depth if DEEP else configuration.ci_depth
        _results[name] = configuration.explorer().run(depth)
    return _results[name]


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_R20_1_exhaustive_machine_equals_model(name: str) -> None:
    """Every state reachable within the configuration's depth: R20.1 holds (the ledger from
    each command on), the session invariants hold, and the reference model produces the same
    outputs, exceptions and read-only state."""
    result = explored(name)
    assert result.failure is None, f"{result.failure}\n{result.failure.steps if result.failure else ''}"
    assert result.exhausted
    missing = EXPECTED[name] - result.families
    assert not missing, f"configuration {name!r} no longer reaches {sorted(missing)}"
    print(f"\nexplore {name} depth {result.depth}: {result.states} states in "
          f"{result.seconds:.1f} s; families {len(result.families)}/{len(FAMILIES)}; "
          f"R19 cells {len(result.cells)}")


def test_R20_1_the_ci_depths_reach_the_sequences_planted_bugs_hid_in() -> None:
    """R13.4, R13.5 (D2), R8.3, R10.4, R16.3, R13.2.3: each sequence of `SEQUENCES` is reached
    by some configuration at its CI depth with the decisions it needs still to spare (a
    bug planted in each went unseen before the scenario macro-decisions, the recovering
    configuration and dispose inside a turn)."""
    short: list[str] = []
    for family, (spare, what) in SEQUENCES.items():
        at = {name: explored(name).depth - explored(name).first_reached[family]
              for name in CONFIGURATIONS if family in explored(name).first_reached}
        if not any(left >= spare for left in at.values()):
            short.append(f"{family} ({what}): decisions left where reached {at}, "
                         f"{spare} needed")
    assert not short, "\n".join(short)


def test_R20_1_exhaustive_reaches_every_rule_family() -> None:
    """Across the configurations, every rule family of `machine.checking.reach.FAMILIES` is exercised
    (a family no exploration reaches is a family nothing here checks exhaustively)."""
    reached: set[str] = set()
    rows: set[int] = set()
    for name in CONFIGURATIONS:
        result = explored(name)
        reached |= result.families
        rows |= {row for row, _ in result.cells}
    missing = [family for family in FAMILIES if family not in reached]
    assert not missing, "never reached: " + ", ".join(f"{f} ({FAMILIES[f]})" for f in missing)
    print(f"\nexplore: all {len(FAMILIES)} rule families reached; commands issued at "
          f"{len(rows)} of the {len(ROWS)} R19 rows")


# --------------------------------------------------------------------------
# Quick explorations: the same checks at small depths, for runs that repeat the test
# selection many times (``TURNSTILE_MUTATION=1``, set by ``make mutation``). Elsewhere they
# are skipped: the CI depths above cover the same ground deeper.
# --------------------------------------------------------------------------

QUICK = os.environ.get("TURNSTILE_MUTATION") == "1"
QUICK_DEPTH = int(os.environ.get("TURNSTILE_MUTATION_DEPTH", "5"))
quick_only = pytest.mark.skipif(not QUICK, reason="quick exploration (TURNSTILE_MUTATION=1); "
                                "test_R20_1_exhaustive_* cover this deeper")


@quick_only
def test_R20_1_quick_exploration_of_the_default_alphabet() -> None:
    """R20.1 (the monitor) and the log's session invariants at every state within QUICK_DEPTH
    of a fresh agent, over the classic alphabet."""
    result = classic_explorer().run(QUICK_DEPTH)
    assert result.failure is None, f"{result.failure}\n{result.failure.steps if result.failure else ''}"


@quick_only
def test_R20_1_quick_exploration_of_every_command() -> None:
    """The same with every command in the alphabet, one level less deep."""
    result = classic_explorer(commands=("followup", "steer", "inject", "quiet", "cancel",
                                        "cancel-keep", "dispose")).run(max(QUICK_DEPTH - 1, 1))
    assert result.failure is None, f"{result.failure}\n{result.failure.steps if result.failure else ''}"


# --------------------------------------------------------------------------
# Soundness: the state key covers both implementations and the ledger
# --------------------------------------------------------------------------


def _drop_injects_at_turn_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Planted: an inject issued while `turn/end` is observed is accepted and never written
    (the D4 bug). The core then is exactly where it was before the inject."""
    route = commands.route

    def dropping(core: CoreState, message: Any, options: Any) -> None:
        if (options.target == "next-step" and not options.wakeup
                and core.lifecycle.state == "closing"):
            return
        route(core, message, options)

    monkeypatch.setattr(commands, "route", dropping)


def _core_only_key(self: Explorer, node: Node) -> str:
    return state_key(node.core)


def test_explorer_catches_a_dropping_core_that_a_core_only_key_prunes(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """followup, run to turn/end, inject: the dropping core lands on the state it had one
    decision earlier. Keyed by the core alone that node is pruned before the model's next
    output is compared; keyed by both implementations and the ledger it is compared, and the
    difference is reported with the inject as its last input."""
    _drop_injects_at_turn_end(monkeypatch)
    result = CONFIGURATIONS["idle"].explorer(commands=("followup", "inject")).run(3)
    assert result.failure is not None and "differs" in str(result.failure)
    inputs = [step["in"] for step in result.failure.steps if "in" in step]
    assert inputs[0] == "followup" and inputs[-1] == "inject"
    monkeypatch.setattr(Explorer, "key", _core_only_key)
    blind = CONFIGURATIONS["idle"].explorer(commands=("followup", "inject")).run(3)
    assert blind.failure is None


def test_explorer_without_a_model_catches_the_drop_by_the_ledger(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the model, the monitor's ledger (in the key) catches the same drop: the
    accepted inject is never appended, staged or reported (R20.1c)."""
    _drop_injects_at_turn_end(monkeypatch)
    result = CONFIGURATIONS["idle"].explorer(with_model=False, commands=("followup", "inject")).run(3)
    assert result.failure is not None and "R20.1c" in str(result.failure)
    monkeypatch.setattr(Explorer, "key", _core_only_key)
    blind = CONFIGURATIONS["idle"].explorer(with_model=False,
                                            commands=("followup", "inject")).run(3)
    assert blind.failure is None


def test_R20_1_the_key_holds_the_model_s_state_when_the_two_logs_agree() -> None:
    """Two nodes with the same core, the same log in both implementations and the same
    ledger, but a reference model in another state (a prompt queued, a retry pending: what
    the log does not show yet) have different keys, so the search never prunes one for the
    other; an unchanged copy keys alike."""
    explorer = CONFIGURATIONS["idle"].explorer()
    path = (("cmd", "followup"), ("macro", "to:model"))
    node = explorer.replay(path)
    assert node.other is not None and len(node.core.log) > 0
    assert explorer.key(explorer.replay(path)) == explorer.key(node)
    changes: dict[str, Callable[[Any], object]] = {
        "a prompt queued": lambda model: model.followup({
            "id": "q9", "role": "user", "content": [], "source": {"kind": "user"}}),
        "a retry pending": lambda model: setattr(model, "_pending_retry", True),
        "a prior failure": lambda model: model._prior_failures.append({"message": "x"}),
    }
    for what, change in changes.items():
        other = explorer.replay(path)
        model: Any = other.other
        change(model)
        assert [e.to_json() for e in model.log.events] == [
            e.to_json() for e in node.core.log.events], "the logs still agree"
        assert explorer.key(other) != explorer.key(node), what


# --------------------------------------------------------------------------
# Macro-decisions, configurations, reports
# --------------------------------------------------------------------------


def test_macro_decisions_run_to_their_landmark() -> None:
    explorer = Explorer()
    node = explorer.replay([("cmd", "followup"), ("macro", "to:turn/end")])
    assert node.outputs[-1].to_json()["type"] == "turn/end"
    node = explorer.replay([("cmd", "followup"), ("macro", "to:model")])
    assert node.outputs[-1].to_json()["kind"] == "model"
    explorer.apply(node, ("macro", "defaults"))          # the model answered with text
    assert not node.core.outstanding() and node.core.next_output() is not None
    settled = explorer.replay([("cmd", "followup"), ("macro", "settle")])
    assert settled.core.is_quiescent and not settled.core.outstanding()
    assert [o.to_json().get("type") for o in settled.outputs][-2:] == ["agent/settled",
                                                                        "agent/status"]


def test_scenario_macro_decisions_play_their_sequence_and_are_offered_only_where_they_apply(
        ) -> None:
    """R7.10, R8.3: ``block-followup`` blocks the admission, issues a second prompt and stops
    at its admission, in the same busy interval; R10.4: ``tool-contexts`` answers each tool
    body with a context and stops after the step, whose drain wrote the context. Neither is
    offered while no effect of its kind is outstanding."""
    explorer = CONFIGURATIONS["idle"].explorer()
    admitting = explorer.replay([("cmd", "followup"), ("macro", "defaults")])
    while explorer.pull(admitting) is not None:
        pass
    offered = [action for action, _ in explorer._probe(admitting, ())]
    assert ("macro", "block-followup") in offered and ("macro", "tool-contexts") not in offered
    explorer.apply(admitting, ("cmd", "steer"))
    explorer.apply(admitting, ("macro", "block-followup"))
    kinds = [o.to_json().get("kind") or o.to_json().get("type") for o in admitting.outputs]
    assert kinds[-1] == "prompt-submit" and kinds.count("prompt-submit") == 2
    assert "rejected-admission" in [o.to_json().get("purpose") for o in admitting.outputs]
    assert "agent/status" in kinds and kinds.count("agent/status") == 1   # still busy
    explorer.apply(admitting, ("macro", "to:model"))
    assert "R8.3-after-rejection" in admitting.families.reached
    calling = explorer.replay([("cmd", "followup"), ("macro", "to:model"),
                               ("ans", "model", "call")])
    while explorer.pull(calling) is not None:
        pass
    assert ("macro", "tool-contexts") in [a for a, _ in explorer._probe(calling, ())]
    explorer.apply(calling, ("macro", "tool-contexts"))
    assert calling.outputs[-1].to_json()["type"] == "step/end"
    context = [o.to_json() for o in calling.outputs if o.to_json().get("type") == "user/message"]
    assert context[-1]["data"]["source"] == {"kind": "plugin", "plugin": "p"}
    assert "R10.4-contexts" in calling.families.reached


def test_a_configuration_starts_from_its_prefix_and_seed() -> None:
    node = CONFIGURATIONS["parallel"].explorer().replay(CONFIGURATIONS["parallel"].prefix)
    assert [e.kind for e in node.core.outstanding()] == ["tool-execute"]
    seeded = CONFIGURATIONS["seeded"].explorer().replay(())
    assert seeded.core.log.last_turn == 1 and seeded.other is not None


def test_explorer_refuses_unknown_alphabet_entries() -> None:
    with pytest.raises(ValueError, match="unknown command"):
        Explorer(commands=("shout",))
    with pytest.raises(ValueError, match="unknown macro"):
        Explorer(macros=("to:nowhere",))
    with pytest.raises(ValueError, match="unknown model answer"):
        Explorer(answers={"model": ("poem",)})


# --------------------------------------------------------------------------
# Planted bugs found without the model (the monitor alone)
# --------------------------------------------------------------------------


def test_explorer_catches_a_planted_context_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel that silently drops staged context (breaking D6 / R20.1c) is found, with a
    shortest reproduction whose last decision is a cancel."""
    original = CoreState._clear_into

    def lossy(self: CoreState, inbox_slot: Any, context_slot: Any) -> None:
        original(self, inbox_slot, context_slot)
        context_slot.queued.clear()

    monkeypatch.setattr(CoreState, "_clear_into", lossy)
    result = Explorer(commands=("followup", "inject", "cancel")).run(4)
    assert result.failure is not None
    assert "R20.1c" in str(result.failure)
    inputs = [step for step in result.failure.steps if "in" in step]
    assert "cancel" in [step["in"] for step in inputs]


def test_explorer_catches_a_planted_status_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A continue-or-idle that re-announces running (breaking D1) is found."""
    claim = CoreState.claim

    def always_running(self: CoreState) -> Any:
        message, controller, _was_busy = claim(self)
        return message, controller, False   # every claim of the interval announces running

    monkeypatch.setattr(CoreState, "claim", always_running)
    result = Explorer(commands=("followup",)).run(3)
    assert result.failure is not None and "R20.1a" in str(result.failure)


def test_state_key_is_symmetric_in_message_names() -> None:
    """Messages are distinguished only by identity: renaming ids gives the same key."""
    a, b = AgentCore(), AgentCore()
    a.followup({"id": "m1", "role": "user", "content": [], "source": {"kind": "user"}})
    b.followup({"id": "m7", "role": "user", "content": [], "source": {"kind": "user"}})
    assert state_key(a) == state_key(b)
    b.followup({"id": "m8", "role": "user", "content": [], "source": {"kind": "user"}})
    assert state_key(a) != state_key(b)


def test_R20_1a_status_contract() -> None:
    assert next_status_ok(None, "running") and not next_status_ok(None, "idle")
    assert next_status_ok("running", "idle") and not next_status_ok("idle", "idle")


def test_R20_1e_window_contract() -> None:
    assert window_ok("idle", False) and not window_ok("idle", True) and window_ok("running", True)


def test_monitor_reports_a_discard_before_enqueue() -> None:
    core = AgentCore()
    monitor = InvariantMonitor(core, core)
    from machine.events import LiveEvent
    from machine.io import Live
    from machine.jsonvalue import freeze
    bogus = Live(LiveEvent("agent/inbox/discard", freeze({"messages": [
        {"id": "x", "role": "user", "content": [], "source": {"kind": "user"}}]})))  # type: ignore[arg-type]
    with pytest.raises(AgentInvariantError, match=r"R20\.1b"):
        monitor.output(bogus)


@pytest.mark.parametrize(("argv", "problem"), [
    (["--seconds", "-5"], "argument --seconds: '-5': must be a positive, finite number"),
    (["--seconds", "nan"], "argument --seconds: 'nan': must be a positive, finite number"),
    (["--seconds", "inf"], "argument --seconds: 'inf': must be a positive, finite number"),
    (["--seconds", "0"], "argument --seconds: '0': must be a positive, finite number"),
    (["--depth", "-1"], "argument --depth: '-1': must be 0 or more"),
    (["--depth", "2.5"], "argument --depth: '2.5' is not an integer"),
])
def test_PROTOCOL_5_1_explore_refuses_numbers_out_of_range(
        argv: list[str], problem: str, capsys: pytest.CaptureFixture[str]) -> None:
    """PROTOCOL.md 5.1: a numeric option out of range or not finite is a usage error (exit
    2) naming the option (a regression of issue 14.10: `explore --seconds -5` and
    `--seconds nan` were accepted, exit 0)."""
    from machine.cli.main import main
    assert main(["explore", *argv, "--quiet"]) == 2
    assert problem in capsys.readouterr().err


def test_R4_12_copying_states_reaches_exactly_the_states_replaying_reaches() -> None:
    """The explorer's copies (R4.12) are the states a replay from the root makes: the same
    states and transitions, machine alone and with the reference model."""
    def classic(copy: bool) -> Explorer:
        return classic_explorer(copy_states=copy)

    def idle_with_model(copy: bool) -> Explorer:
        return CONFIGURATIONS["idle"].explorer(copy_states=copy)

    for make, depth in ((classic, 4), (idle_with_model, 3)):
        copied, replayed = make(True).run(depth), make(False).run(depth)
        assert copied.failure is None and replayed.failure is None
        assert (copied.states, copied.transitions) == (replayed.states, replayed.transitions)
        assert copied.families == replayed.families and copied.cells == replayed.cells


def _defined_key_text(explorer: Explorer, node: Node) -> tuple[bytes, str]:
    """A key's text by its definition: ``repr`` of the canonical parts (the core's state, the
    other implementation's, the monitor's ledger) with ids renamed after the log's."""
    texts = explorer._texts
    core, other = node.core, node.other
    _, log_digest, tokens = texts.chain(core.log)
    other_parts: object = None
    if other is not None:
        other_log = getattr(other, "log", None)
        same_log: object = None
        if isinstance(other_log, SessionLog):
            raw_core, raw_other = texts.chain(core.log)[0], texts.chain(other_log)[0]
            same_log = "=core" if raw_other == raw_core else raw_other
        other_parts = (same_log, implementation_parts(other, texts, with_log=False))
    text = repr((core_parts(core, texts, with_log=False), other_parts, node.monitor.ledger()))
    return log_digest, renamed(text, tokens)


@pytest.mark.parametrize("name", list(CONFIGURATIONS))
def test_the_key_is_the_renamed_text_of_the_state_it_is_defined_as(name: str) -> None:
    """The explorer writes its keys piece by piece from templates (ids kept apart, ranked
    after): along random paths of every configuration, machine alone and with the model,
    the text it digests is exactly the renamed ``repr`` of the canonical parts."""
    rng = random.Random(2026)
    checked = 0
    for with_model in (False, True):
        explorer = CONFIGURATIONS[name].explorer(with_model=with_model)
        for _ in range(12):
            actions = explorer.prefix
            node = explorer.replay(actions)
            for _ in range(rng.randrange(2, 12)):
                children = explorer._probe(node, actions)
                if not children:
                    break
                action = rng.choice(children)[0]
                explorer.apply(node, action)
                actions = (*actions, action)
                assert explorer.key_text(node) == _defined_key_text(explorer, node), actions
                checked += 1
    assert checked > 50


def test_the_key_tells_apart_json_values_that_compare_equal_in_python() -> None:
    """``1``, ``1.0`` and ``true`` are different JSON, and so are two key orders: the text a
    key takes of a frozen value keeps them apart (Python's ``==`` does not)."""
    one, real, true = (freeze({"n": value}) for value in (1, 1.0, True))
    assert one == real == true
    assert len({exact_text(one), exact_text(real), exact_text(true)}) == 3
    assert exact_text(freeze({"a": 1, "b": 2})) != exact_text(freeze({"b": 2, "a": 1}))
    message = {"id": "m1", "role": "user", "content": [{"type": "text", "text": "x"}],
               "source": {"kind": "user"}}
    payloads = [freeze({"message": message, "placement": placement})
                for placement in ("queued", "steering")]
    assert all(isinstance(payload, FrozenDict) for payload in payloads)
    texts = {exact_text(Live(LiveEvent("agent/inbox/enqueue", payload)))  # type: ignore[arg-type]
             for payload in payloads}
    assert len(texts) == 2


def test_a_run_pauses_the_cyclic_collector_and_leaves_it_as_it_found_it() -> None:
    """The search pauses the cyclic collector while it runs (its heap only grows) and
    restores it: enabled stays enabled, disabled stays disabled."""
    seen: list[bool] = []

    def progress(states: int, frontier: int, seconds: float) -> None:
        seen.append(gc.isenabled())

    assert gc.isenabled()
    explorer = classic_explorer()
    original = explorer.key

    def key(node: Node) -> bytes:
        seen.append(gc.isenabled())
        return original(node)
    explorer.key = key  # type: ignore[method-assign]
    assert explorer.run(2, progress=progress).failure is None
    assert seen and not any(seen) and gc.isenabled()
    gc.disable()
    try:
        classic_explorer().run(2)
        assert not gc.isenabled()
    finally:
        gc.enable()
