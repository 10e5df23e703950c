"""The pure decisions (machine/decisions.py): CrossHair contracts and property tests.

`crosshair check` verifies every PEP 316 contract symbolically with a per-condition
timeout of 4 s (ASSURANCE §3); one run over a copy with a plausible bug planted in each
rewritten contract's function shows that no contract is vacuous. The property tests
restate each rule independently; in the deep profile they run under the
hypothesis-crosshair backend too.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import TypedDict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from machine import decisions

ROOT = Path(__file__).resolve().parent.parent
DEEP = os.environ.get("TURNSTILE_PROFILE") == "deep"


class _Backend(TypedDict, total=False):
    """The keyword arguments of `settings` the deep profile sets."""

    backend: str


BACKEND: _Backend = {"backend": "crosshair"} if DEEP else {}
CONTRACT_FILES = ["machine/decisions.py", "machine/checking/invariants.py"]


def _crosshair(*paths: str) -> subprocess.CompletedProcess[str]:
    exe = shutil.which("crosshair", path=str(Path(sys.executable).parent)) or "crosshair"
    return subprocess.run([exe, "check", *paths, "--per_condition_timeout", "4"],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_crosshair_verifies_every_contract() -> None:
    result = _crosshair(*CONTRACT_FILES)
    assert result.returncode == 0, result.stdout + result.stderr


#: Plausible one-line bugs, each breaking a rule a contract states (not the function's body).
PLANTED = {
    # D2: a cancel that forgets a pending retry (R16.1).
    "cancel_effective": (
        "return has_owner or retry_pending or (not keep_inbox and (queued > 0 or staged > 0))",
        "return has_owner or (not keep_inbox and (queued > 0 or staged > 0))"),
    # R6.1: a wake requested while busy.
    "requests_wake": (
        "return route_taken == \"queue\" and wakeup and not busy and not wake_pending",
        "return route_taken == \"queue\" and wakeup and not wake_pending"),
    # R7.10 / R26.3: retained steering no longer holds the context back.
    "rejected_flush_appends": (
        "return outbox_size > 0 and not outbox_has_steering", "return outbox_size > 0"),
    # R10.11: an error result replaced by the aborted result.
    "tool_result_aborted": (
        "return settled_while_aborted and not body_is_error and not from_prepare",
        "return settled_while_aborted and not from_prepare"),
    # R10.11: an aborted result's concludesTurn still counted.
    "concludes": (
        "return concludes_turn and not is_error and not replaced_by_abort",
        "return concludes_turn and not is_error"),
    # R15.1: an abort reported as an error; found through classify's postcondition.
    "classify": ('return outcome not in ("aborted", "disposed")',
                 'return outcome != "disposed"'),
}


def test_crosshair_finds_planted_bugs(tmp_path: Path) -> None:
    """Each planted bug violates a contract, and CrossHair names the function (one run for
    all of them, in one planted copy, to keep this test's time modest)."""
    source = (ROOT / "machine/decisions.py").read_text()
    planted = source
    for function, (correct, wrong) in PLANTED.items():
        assert planted.count(correct) == 1, function
        planted = planted.replace(correct, wrong)
    target = tmp_path / "planted_decisions.py"
    target.write_text(planted)
    result = _crosshair(str(target))
    assert result.returncode != 0
    for function in PLANTED:
        assert f"error: false when calling {function}(" in result.stdout, (function, result.stdout)


targets = st.sampled_from(["next-turn", "next-step"])


@settings(**BACKEND)
@given(targets, st.booleans(), st.booleans())
def test_R5_2_R5_3_route(target: str, wakeup: bool, window_open: bool) -> None:
    where = decisions.route(target, wakeup, window_open)
    if target == "next-step" and not wakeup:
        assert where == ("stage-context" if window_open else "append-now")
    elif target == "next-step" and window_open:
        assert where == "stage-steering"
    else:
        assert where == "queue"


@settings(**BACKEND)
@given(st.booleans(), st.booleans(), st.booleans())
def test_R6_1_wake_only_for_queued_waking_items_when_idle(wakeup: bool, busy: bool,
                                                         pending: bool) -> None:
    assert decisions.requests_wake("queue", wakeup, busy, pending) == (wakeup and not busy
                                                                       and not pending)
    assert not decisions.requests_wake("stage-steering", wakeup, busy, pending)


@settings(**BACKEND)
@given(st.lists(st.booleans(), max_size=6))
def test_R7_10_rejected_flush_only_without_steering(staged: list[bool]) -> None:
    assert decisions.rejected_flush_appends(any(staged), len(staged)) == (
        bool(staged) and not any(staged))


@settings(**BACKEND)
@given(st.integers(0, 20), st.integers(0, 20))
def test_R8_3_inherited_take(inherited: int, size: int) -> None:
    assert decisions.inherited_take(inherited, size) == min(inherited, size)


@settings(**BACKEND)
@given(st.booleans(), st.booleans(), st.booleans(), st.booleans())
def test_R8_4_after_step(calls: bool, concluded: bool, took: bool, staged: bool) -> None:
    following = decisions.after_step(calls, concluded, took, staged)
    if concluded:
        assert following == "close"
    elif calls or took or staged:
        assert following == "next-step"
    else:
        assert following == "turn-stopping"


@settings(**BACKEND)
@given(st.booleans(), st.booleans(), st.booleans(), st.integers(0, 3), st.integers(0, 3))
def test_R16_1_cancel_effective(owner: bool, retry: bool, keep: bool, queued: int,
                                staged: int) -> None:
    assert decisions.cancel_effective(owner, retry, keep, queued, staged) == (
        owner or retry or (not keep and queued + staged > 0))


@given(st.lists(st.text(max_size=3), max_size=4),
       st.lists(st.tuples(st.text(max_size=3), st.booleans()), max_size=4), st.booleans())
def test_R16_2_D6_cancel_reports(queued: list[str], staged: list[tuple[str, bool]],
                                 keep: bool) -> None:
    inbox_report, context_report = decisions.cancel_reports(queued, staged, keep)
    if keep:
        assert (inbox_report, context_report) == ([], [])
    else:
        assert inbox_report == queued + [m for m, s in staged if s]
        assert context_report == [m for m, s in staged if not s]


@settings(**BACKEND)
@given(st.sampled_from([None, "user", "parent", "disposed"]), st.booleans())
def test_R15_classify(cause: str | None, request_failure: bool) -> None:
    outcome = decisions.classify(cause, request_failure)
    expected = ({"user": "aborted", "parent": "aborted", "disposed": "disposed"}[cause]
                if cause else ("request-failure" if request_failure else "failure"))
    assert outcome == expected
    assert decisions.reports_error(outcome) == (cause is None)


@settings(**BACKEND)
@given(st.booleans(), st.booleans(), st.booleans())
def test_R10_11_R10_6_tool_results(aborted: bool, is_error: bool, from_prepare: bool) -> None:
    replaced = decisions.tool_result_aborted(aborted, is_error, from_prepare)
    assert replaced == (aborted and not is_error and not from_prepare)
    assert decisions.concludes(True, is_error, replaced) == (not is_error and not replaced)
    assert not decisions.concludes(False, is_error, replaced)


@settings(**BACKEND)
@given(st.booleans(), st.booleans(), st.booleans())
def test_R9_6_header_reason(logged: bool, has_header: bool, changed: bool) -> None:
    reason = decisions.header_reason(logged, has_header, changed)
    if not logged:
        assert reason == ("resume" if has_header else "initial")
    else:
        assert reason == ("change" if changed else None)


@pytest.mark.parametrize("name", [n for n in dir(decisions) if not n.startswith("_")
                                  and callable(getattr(decisions, n))
                                  and getattr(getattr(decisions, n), "__module__", "")
                                  == "machine.decisions"])
def test_every_decision_has_a_contract(name: str) -> None:
    """A postcondition, or a stated reason why none would prove anything of its own."""
    doc = getattr(decisions, name).__doc__ or ""
    assert "post:" in doc or "No contract of its own:" in doc, f"{name} has no postcondition"
