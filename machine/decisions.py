"""The pure decisions of the agent loop, with contracts (spec §R; checked by CrossHair).

Each function decides one thing from plain values and carries PEP 316
pre/post-conditions in its docstring; ``crosshair check machine/decisions.py``
verifies them symbolically (ASSURANCE §3), and the core calls exactly these
functions, so what CrossHair checks is what runs.
"""

from __future__ import annotations

from typing import Literal

Route = Literal["stage-context", "append-now", "stage-steering", "queue"]
Next = Literal["next-step", "turn-stopping", "close"]
Outcome = Literal["aborted", "disposed", "request-failure", "failure"]


def route(target: str, wakeup: bool, window_open: bool) -> Route:
    """R5.2–R5.3: where a send goes; routing reads only the window (R5.6).

    pre: target in ('next-turn', 'next-step')
    post: (__return__ in ('stage-context', 'append-now')) == (target == 'next-step' and not wakeup)
    post: (__return__ in ('stage-context', 'stage-steering')) == (window_open and target == 'next-step')
    post: __return__ != 'queue' or target == 'next-turn' or not window_open
    """
    if target == "next-step" and not wakeup:
        return "stage-context" if window_open else "append-now"
    if target == "next-step" and window_open:
        return "stage-steering"
    return "queue"


def requests_wake(route_taken: str, wakeup: bool, busy: bool, wake_pending: bool) -> bool:
    """R5.4, R6.1: a queued waking item asks for the wake, ignored while busy or pending.

    Each condition is one sentence of the rules: R6.1 drops the request while busy and
    while a wake is pending; only a queued placement asks (R5.4: staged and appended input
    never wakes, R6.3 c); a quiet item never asks (R5.7); and from idle with nothing pending
    a waking queued item must ask, or it would never run (R6.2, R7.1).

    pre: route_taken in ('stage-context', 'append-now', 'stage-steering', 'queue')
    post: not (__return__ and busy)
    post: not (__return__ and wake_pending)
    post: route_taken == 'queue' or not __return__
    post: wakeup or not __return__
    post: __return__ or busy or wake_pending or not wakeup or route_taken != 'queue'
    """
    return route_taken == "queue" and wakeup and not busy and not wake_pending


def rejected_flush_appends(outbox_has_steering: bool, outbox_size: int) -> bool:
    """R7.10 step 2: the rejected-admission context append happens only when no steering is
    staged (retained steering included, R26.3) and something is staged.

    The guarantees: staged steering anywhere keeps everything staged (R7.10.2, R26.3); an
    empty outbox appends nothing; and staged context alone is written between turns (R26.3,
    R11.3: the rejected admission is where retained context goes when no steering holds it).
    The precondition states what an outbox is: steering staged means something is staged.

    pre: outbox_size >= 0
    pre: outbox_size > 0 or not outbox_has_steering
    post: not (__return__ and outbox_has_steering)
    post: outbox_size > 0 or not __return__
    post: __return__ or outbox_has_steering or outbox_size == 0
    """
    return outbox_size > 0 and not outbox_has_steering


def inherited_take(inherited: int, outbox_size: int) -> int:
    """R8.3.1 / R11.2: the inherited run-start drain takes exactly the items retained before the
    admission, or fewer if the outbox now holds fewer; the rest drain takes the others.

    pre: inherited >= 0 and outbox_size >= 0
    post: 0 <= __return__ <= inherited and __return__ <= outbox_size
    post: __return__ == inherited or __return__ == outbox_size
    """
    return min(inherited, outbox_size)


def after_step(had_calls: bool, concluded: bool, took_steering: bool,
               steering_staged: bool) -> Next:
    """R8.4 / R9.10: what follows a completed step.

    post: (__return__ == 'close') == concluded
    post: concluded or (__return__ == 'next-step') == (had_calls or took_steering or steering_staged)
    """
    if concluded:
        return "close"
    if (had_calls and not concluded) or took_steering or steering_staged:
        return "next-step"
    return "turn-stopping"


def cancel_effective(has_owner: bool, retry_pending: bool, keep_inbox: bool,
                     queued: int, staged: int) -> bool:
    """R16.1: a cancel acts when there is an owner, a pending retry, or (without keepInbox)
    anything queued or staged (context included); otherwise it is a no-op.

    pre: queued >= 0 and staged >= 0
    post: __return__ == (has_owner or retry_pending or (not keep_inbox and queued + staged > 0))
    """
    return has_owner or retry_pending or (not keep_inbox and (queued > 0 or staged > 0))


def cancel_reports(queued: list[str], staged: list[tuple[str, bool]],
                   keep_inbox: bool) -> tuple[list[str], list[str]]:
    """R16.2 step 2 / D6: what an effective cancel discards: (queued then steering, contexts),
    each in FIFO order; nothing with keepInbox.

    post: keep_inbox or len(__return__[0]) + len(__return__[1]) == len(queued) + len(staged)
    post: not keep_inbox or __return__ == ([], [])
    post: keep_inbox or __return__[0][:len(queued)] == queued
    """
    if keep_inbox:
        return [], []
    steering = [message_id for message_id, is_steering in staged if is_steering]
    contexts = [message_id for message_id, is_steering in staged if not is_steering]
    return [*queued, *steering], contexts


def classify(aborted_cause: str | None, request_failure: bool) -> Outcome:
    """R15: an aborted signal wins over everything; its reason is the first cause (R16.3).

    The last postcondition is R15's table read across, composed with `reports_error`:
    ``agent/error`` is emitted exactly when the controller was not aborted (R15.1 emits
    none; R15.2 and R15.3 emit one).

    pre: aborted_cause in (None, 'user', 'parent', 'disposed')
    post: (__return__ in ('aborted', 'disposed')) == (aborted_cause is not None)
    post: (__return__ == 'disposed') == (aborted_cause == 'disposed')
    post: aborted_cause is not None or (__return__ == 'request-failure') == request_failure
    post: reports_error(__return__) == (aborted_cause is None)
    """
    if aborted_cause is not None:
        return "disposed" if aborted_cause == "disposed" else "aborted"
    return "request-failure" if request_failure else "failure"


def reports_error(outcome: str) -> bool:
    """R15.1–R15.3: every failure except an abort emits agent/error.

    No contract of its own: over its four outcomes, any postcondition would restate this
    table. What R15 guarantees (an error is reported exactly when the controller was not
    aborted) is a postcondition of `classify`, composed with this function.
    """
    return outcome not in ("aborted", "disposed")


def tool_result_aborted(settled_while_aborted: bool, body_is_error: bool, from_prepare: bool) -> bool:
    """R10.11: a dispatched body that settles successfully after the abort is committed as the
    canonical aborted result; error results and prepare's final results keep their own.

    One postcondition per clause of R10.11: nothing is replaced without an abort (a body
    that settled before it keeps its result); the three cases that keep their own result;
    and the replacement itself, for a successful dispatched body settling while aborted.

    post: settled_while_aborted or not __return__
    post: not (body_is_error and __return__)
    post: not (from_prepare and __return__)
    post: __return__ or not settled_while_aborted or body_is_error or from_prepare
    """
    return settled_while_aborted and not body_is_error and not from_prepare


def concludes(concludes_turn: bool, is_error: bool, replaced_by_abort: bool) -> bool:
    """R10.6: concludesTurn counts only on results that are not errors.

    The guarantees: only a result that asks concludes; an error result never does (R10.6);
    a result replaced by the aborted result never does (R10.11: its concludesTurn is void,
    whatever the body said); and a non-error result that asks does (R10.6: "one such result
    makes the turn end").

    post: concludes_turn or not __return__
    post: not (is_error and __return__)
    post: not (replaced_by_abort and __return__)
    post: __return__ or not concludes_turn or is_error or replaced_by_abort
    """
    return concludes_turn and not is_error and not replaced_by_abort


def header_reason(header_logged: bool, log_has_header: bool, changed: bool) -> str | None:
    """R9.6: the request/header reason, or None when nothing is appended.

    post: (__return__ == 'initial') == (not header_logged and not log_has_header)
    post: (__return__ == 'resume') == (not header_logged and log_has_header)
    post: (__return__ is None) == (header_logged and not changed)
    """
    if not header_logged:
        return "resume" if log_has_header else "initial"
    return "change" if changed else None
