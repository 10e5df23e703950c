"""Bounded exhaustive exploration (ASSURANCE §2) at the CI depth, and proof that it can fail.

The CI depths are sized for about three minutes on a 2-core machine; the
``deep`` profile (``TURNSTILE_PROFILE=deep`` or ``make check-deep``) goes deeper.
"""

from __future__ import annotations

import os

import pytest

from machine.core import AgentCore, CoreConfig
from machine.explore import COMMANDS, Explorer, _counter, state_key
from machine.invariants import AgentInvariantError, InvariantMonitor, next_status_ok, window_ok
from model import ModelAgent

EXPLORE_CONFIG = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=False)

DEEP = os.environ.get("TURNSTILE_PROFILE") == "deep"
DEFAULT_DEPTH = 9 if DEEP else 7
ALL_COMMANDS_DEPTH = 7 if DEEP else 5


def _model() -> ModelAgent:
    return ModelAgent(EXPLORE_CONFIG, clock=_counter())


def test_R20_1_exhaustive_default_alphabet_machine_equals_model() -> None:
    """Every state reachable in DEFAULT_DEPTH decisions: invariants hold and the reference
    model produces the same outputs and read-only state."""
    result = Explorer(config=EXPLORE_CONFIG, other=_model).run(DEFAULT_DEPTH)
    assert result.failure is None, f"{result.failure}\n{result.failure.steps if result.failure else ''}"
    assert result.states > 40_000 if not DEEP else result.states > 1_000_000
    print(f"\nexplore depth {DEFAULT_DEPTH}: {result.states} states, "
          f"{result.states_per_second:,.0f} states/s")


def test_R20_1_exhaustive_all_commands_machine_equals_model() -> None:
    result = Explorer(config=EXPLORE_CONFIG, commands=tuple(COMMANDS), other=_model).run(
        ALL_COMMANDS_DEPTH)
    assert result.failure is None, f"{result.failure}\n{result.failure.steps if result.failure else ''}"
    assert result.states > 10_000


def test_explorer_catches_a_planted_context_loss(monkeypatch: pytest.MonkeyPatch) -> None:
    """A cancel that silently drops staged context (breaking D6 / R20.1c) is found, with a
    shortest reproduction whose last decision is a cancel."""
    original = AgentCore._clear_into

    def lossy(self: AgentCore, inbox_slot: object, context_slot: object) -> None:
        original(self, inbox_slot, context_slot)  # type: ignore[arg-type]
        if context_slot is not None:
            context_slot.queued.clear()  # type: ignore[attr-defined]

    monkeypatch.setattr(AgentCore, "_clear_into", lossy)
    result = Explorer().run(6)
    assert result.failure is not None
    assert "R20.1c" in str(result.failure)
    inputs = [step for step in result.failure.steps if "in" in step]
    assert "cancel" in [step["in"] for step in inputs]


def test_explorer_catches_a_planted_status_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """A continue-or-idle that re-announces running (breaking D1) is found."""
    monkeypatch.setattr(AgentCore, "_claim", _claim_always_running(AgentCore._claim))
    result = Explorer().run(6)
    assert result.failure is not None and "R20.1a" in str(result.failure)


def _claim_always_running(claim):  # type: ignore[no-untyped-def]
    from machine import events as ev
    from machine.events import LiveEvent
    from machine.io import Live
    from machine.jsonvalue import FrozenDict

    def wrapped(self):  # type: ignore[no-untyped-def]
        if self.lifecycle.busy:
            yield Live(LiveEvent(ev.STATUS, FrozenDict({"status": "running"})))
        yield from claim(self)
    return wrapped


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
def test_explore_refuses_numbers_out_of_range(argv: list[str], problem: str,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 14.10: `explore --seconds -5` and `--seconds nan` were accepted (exit 0)."""
    from machine.cli import main
    assert main(["explore", *argv, "--quiet"]) == 2
    assert problem in capsys.readouterr().err
