"""Commands (rules R5, R16, R17, R20.2-R20.4, P3, P9): each argument taken and checked, then the
routing of a send, a cancel, dispose, a direct append. None of them advances the loop (P3)."""
from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from machine import decisions
from machine import events as ev
from machine.core.records import APPEND, LOOP_TYPES, frozen_message
from machine.errors import (
    EXITS,
    CoreFailedError,
    DisposedError,
    InvariantError,
    TurnstileError,
    ValidationError,
)
from machine.events import Event
from machine.io import Durable
from machine.jsonvalue import JsonLike, snapshot
from machine.vocabulary import (
    CancelCause,
    Message,
    SendOptions,
    failure_text,
    validate_user_message,
)

if TYPE_CHECKING:
    from machine.core.state import CoreState


def check_live(core: CoreState) -> None:
    """R17.3, P16: only dispose() may be called once the core is torn down or stopped."""
    if core.disposed:
        raise DisposedError("the agent is disposed; only dispose() may be called")
    failure = core.failure
    if failure is not None:
        raise CoreFailedError(f"the core stopped after an internal failure "
                              f"({failure.message}); only dispose() may be called")


def send(core: CoreState, message: JsonLike, options: JsonLike) -> None:
    """R5: validate (options first, then the message), snapshot, route. (Each argument is
    taken first, V6, so validating it runs none of the caller's code.)"""
    check_live(core)
    opts = SendOptions.from_json(snapshot(options))
    route(core, validate_user_message(snapshot(message)), opts)


def send_preset(core: CoreState, message: JsonLike, preset: SendOptions) -> None:
    """V10: a send with one of the presets (followup, steer, inject)."""
    check_live(core)
    route(core, validate_user_message(snapshot(message)), preset)


def route(core: CoreState, message: Message, options: SendOptions) -> None:
    """R5.2-R5.5: where a send goes, by the window only (R5.6): staged context, an append at
    once, staged steering, or the inbox (asking for the wake, R5.4, before its notice). P7:
    input accepted while a cancel that cleared the inbox is being delivered is cleared by it
    (`CoreState.sweep`)."""
    swept = core.sweeping
    where = decisions.route(options.target, options.wakeup, core.accepts_next_step)
    if where == "stage-context":                    # R5.2: staged, nothing emitted
        if not core.sweep(message, "context"):
            core.outbox.stage(message, False)
        return
    if where == "append-now":                       # R5.2 / D4: appended at once
        core.emit(Durable(command_commit(core, ev.USER_MESSAGE, message, surface_op=APPEND)))
        return
    if where == "stage-steering":
        if not swept:
            core.outbox.stage(message, True)
    else:
        if not swept:
            core.inbox.enqueue(message, options.wakeup)
        if decisions.requests_wake(where, options.wakeup, core.busy, core.wake_pending):
            core.request_wake()                     # R5.4: before the enqueue notice
    steering = where == "stage-steering"
    core.emit_live(ev.INBOX_ENQUEUE, message=frozen_message(message),
                   placement="steering" if steering else "queued")
    if swept:                                       # P7: reported by the same cancel
        core.sweep(message, "steering" if steering else "queued")


def cancel(core: CoreState, cause: JsonLike, keep_inbox: object) -> None:
    """R16: cancel the current activity and (unless *keep_inbox*) what is pending."""
    check_live(core)
    parsed = CancelCause.from_json(snapshot(cause))
    if not isinstance(keep_inbox, bool):
        raise ValidationError("keepInbox", "must be a bool")
    core.cancel(parsed, keep_inbox)


def dispose(core: CoreState) -> None:
    """R17: cancel(disposed) now; teardown outputs follow once the core is quiescent. A no-op
    once torn down (R17.3)."""
    if not core.disposed:
        core.dispose()


def append(core: CoreState, type_: object, data: JsonLike, *, surface_op: JsonLike = None,
           source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
    """A direct append by extension code (R20.2): checked, committed, delivered in order;
    one of the loop's own types is refused while the core is busy (R20.4). *ignorable* marks
    an extension event a build that does not read its type may resume past (D16)."""
    check_live(core)
    if isinstance(type_, str):
        type_ = str.__str__(type_)              # a str subclass runs no code of its own here
        if type_ in LOOP_TYPES and core.busy:                   # R20.4
            core.log.check(type_, data, surface_op=surface_op,   # the log's own verdict first
                           source_event_seqs=source_event_seqs, ignorable=ignorable)
            raise InvariantError("R20.4", f"{type_} is written by the loop itself: a direct "
                                 "append of it is refused while the agent is busy")
    event = command_commit(core, type_, data, surface_op=surface_op,  # type: ignore[arg-type]
                           source_event_seqs=source_event_seqs, ignorable=ignorable)
    core.emit(Durable(event))
    return event


def command_commit(core: CoreState, type_: str, data: JsonLike | Message, *,
                   surface_op: JsonLike = None, source_event_seqs: Sequence[int] | None = None,
                   ignorable: bool = False) -> Event:
    """A command's append (P3, P16): the log's refusals as they are (L3 refuses a type that is
    not a string, typed); any other failure of the append (nothing was appended, L2) raised as
    an `InvariantError`."""
    try:
        return core.log.commit(type_, data, surface_op=surface_op,
                               source_event_seqs=source_event_seqs, ignorable=ignorable)
    except (TurnstileError, *EXITS):
        raise
    except BaseException as error:
        raise InvariantError("L2", f"{type_}: nothing was appended: "
                             f"{failure_text(error)}") from error
