"""Commands (rules R5, R6.1, R16, R17, P3, P9): routing of every send, the wake request,
cancel and its scope (P7, D9), dispose and teardown, direct appends, and the stop of P16."""
from __future__ import annotations

from collections.abc import Sequence

from machine import decisions
from machine import events as ev
from machine.core.outputs import Outputs
from machine.core.records import (
    APPEND,
    LOOP_TYPES,
    _AbortNotice,
    _CancelRequested,
    _DiscardSlot,
    _message_id,
    _Retro,
    frozen_json,
    frozen_message,
)
from machine.errors import (
    EXITS,
    CoreFailedError,
    DisposedError,
    InvariantError,
    ProtocolError,
    TurnstileError,
    ValidationError,
)
from machine.events import Event, LiveEvent
from machine.io import (
    TICK,
    Append,
    Cancel,
    Chunk,
    Dispose,
    Durable,
    End,
    Input,
    Live,
    Observer,
    Raise,
    Resolve,
    Send,
)
from machine.jsonvalue import (
    FrozenDict,
    JsonLike,
    shown,
    snapshot,
)
from machine.machines import Lifecycle, Window
from machine.vocabulary import (
    DISPOSED_CAUSE,
    FOLLOWUP,
    INJECT,
    STEER,
    CancelCause,
    Message,
    SendOptions,
    failure_text,
    internal_error,
    validate_user_message,
)


class Commands(Outputs):
    """The caller's commands; none of them advances the loop (P3)."""

    def send(self, message: JsonLike, options: JsonLike) -> None:
        """R5: validate (options first, then the message), snapshot, route. (Each argument is
        taken first, V6, so validating it runs none of the caller's code.)"""
        self._check_live()
        opts = SendOptions.from_json(snapshot(options))
        self._route(validate_user_message(snapshot(message)), opts)

    def followup(self, message: JsonLike) -> None:
        self._check_live()
        self._route(validate_user_message(snapshot(message)), FOLLOWUP)

    def steer(self, message: JsonLike) -> None:
        self._check_live()
        self._route(validate_user_message(snapshot(message)), STEER)

    def inject(self, message: JsonLike) -> None:
        self._check_live()
        self._route(validate_user_message(snapshot(message)), INJECT)

    def cancel(self, cause: JsonLike, keep_inbox: bool = False) -> None:
        """R16: cancel the current activity and (unless *keep_inbox*) what is pending."""
        self._check_live()
        parsed = CancelCause.from_json(snapshot(cause))
        if not isinstance(keep_inbox, bool):
            raise ValidationError("keepInbox", "must be a bool")
        self._cancel(parsed, keep_inbox)

    def dispose(self) -> None:
        """R17: cancel(disposed) now; teardown outputs follow once the core is quiescent."""
        if self._disposed:
            return
        self._disposing = True
        self._cancel(DISPOSED_CAUSE, False)

    def append(self, type: str, data: JsonLike, *, surface_op: JsonLike = None,
               source_event_seqs: Sequence[int] | None = None, ignorable: bool = False) -> Event:
        """A direct append by extension code (R20.2): checked, committed, delivered in order.
        *ignorable* marks an extension event a build that does not read its type may resume
        past (D16)."""
        self._check_live()
        if not isinstance(type, str):           # the log refuses it, typed (L3)
            return self._emit_appended(self._command_commit(
                type, data, surface_op=surface_op, source_event_seqs=source_event_seqs,
                ignorable=ignorable))
        type = str.__str__(type)                # a str subclass runs no code of its own here
        if type in LOOP_TYPES and self.lifecycle.busy:          # R20.4
            self.log.check(type, data, surface_op=surface_op,    # the log's own verdict first
                           source_event_seqs=source_event_seqs, ignorable=ignorable)
            raise InvariantError("R20.4", f"{type} is written by the loop itself: a direct "
                                 "append of it is refused while the agent is busy")
        return self._emit_appended(self._command_commit(type, data, surface_op=surface_op,
                                                        source_event_seqs=source_event_seqs,
                                                        ignorable=ignorable))

    def _emit_appended(self, event: Event) -> Event:
        self._emit(Durable(event))
        return event

    def _command_commit(self, type_: str, data: JsonLike | Message, *,
                        surface_op: JsonLike = None,
                        source_event_seqs: Sequence[int] | None = None,
                        ignorable: bool = False) -> Event:
        """A command's append (P3, P16): the log's refusals as they are; any other failure of
        the append (nothing was appended, L2) raised as an `InvariantError`."""
        try:
            return self.log.commit(type_, data, surface_op=surface_op,
                                   source_event_seqs=source_event_seqs, ignorable=ignorable)
        except (TurnstileError, *EXITS):
            raise
        except BaseException as error:
            raise InvariantError("L2", f"{type_}: nothing was appended: "
                                 f"{failure_text(error)}") from error

    def _check_live(self) -> None:
        if self._disposed:
            raise DisposedError("the agent is disposed; only dispose() may be called")
        if self._failure is not None:                           # P16
            raise CoreFailedError(f"the core stopped after an internal failure "
                                  f"({self._failure.message}); only dispose() may be called")

    def _route(self, message: Message, options: SendOptions) -> None:
        retro = self._retro
        cleared = retro is not None and retro.inbox_slot is not None
        where = decisions.route(options.target, options.wakeup, self.window.is_open)  # R5.2-R5.3
        if where == "stage-context":                    # R5.2: staged, nothing emitted
            if cleared:                                 # P7: cleared by the same cancel
                assert retro is not None and retro.context_slot is not None
                retro.context_slot.queued.append(message)
                retro.fresh += 1
            else:
                self.outbox.stage(message, False)
            return
        if where == "append-now":                       # R5.2 / D4: appended at once
            self._emit(Durable(self._command_commit(ev.USER_MESSAGE, message, surface_op=APPEND)))
            return
        if where == "stage-steering":
            if not cleared:
                self.outbox.stage(message, True)
        else:
            if not cleared:
                self.inbox.enqueue(message, options.wakeup)
            if decisions.requests_wake(where, options.wakeup, self.lifecycle.busy,
                                       self.wake_pending):
                self._request_wake()                    # R5.4: before the enqueue notice
        self._emit_live(ev.INBOX_ENQUEUE, message=frozen_message(message),
                        placement="steering" if where == "stage-steering" else "queued")
        if cleared:                                     # P7: reported by the same cancel
            assert retro is not None and retro.inbox_slot is not None
            group = retro.inbox_slot.steering if where == "stage-steering" else retro.inbox_slot.queued
            group.append(message)
            retro.fresh += 1

    def _request_wake(self) -> None:
        """R6.1: ignored while busy or while a wake is pending."""
        if self.lifecycle.state != "idle":
            return
        self.lifecycle.fire("request_wake")
        effect = self._new_effect(TICK, FrozenDict._adopt({"purpose": "wake"}))
        self._wake_effect = effect.id
        self._emit(effect)

    def _cancel(self, cause: CancelCause, keep: bool) -> None:
        retro = self._retro
        if retro is not None:
            self._join(retro, cause, keep)
            return
        effective = decisions.cancel_effective(self._owner is not None, self._pending_retry, keep,
                                               len(self.inbox), len(self.outbox))     # R16.1
        if not effective:                               # R16.1: a no-op arms nothing
            return
        inbox_slot = _DiscardSlot(ev.INBOX_DISCARD) if not keep else None
        context_slot = _DiscardSlot(ev.CONTEXT_DISCARD) if not keep else None
        scope = _Retro(inbox_slot, context_slot)
        self._emit_cancel_requested(cause, scope)       # R16.2 step 1
        if inbox_slot is not None and context_slot is not None:   # R16.2 step 2
            self._clear_into(inbox_slot, context_slot)
            self._emit(inbox_slot)
            self._emit(context_slot)
        self._pending_retry = False                     # R16.2 step 3 (D2)
        owner = self._owner                             # R16.2 step 4
        if owner is not None and owner.reason is None:  # R16.3: the first cause wins
            owner.reason = cause
            scope.abort = _AbortNotice(owner.signal, cause)
            self._emit(scope.abort)

    def _join(self, scope: _Retro, cause: CancelCause, keep: bool) -> None:
        """P7, D9: a cancel issued while the ``agent/cancel-requested`` of *scope* is being
        delivered runs, as in the original, inside that cancel's observer phase: ahead of its
        clear and its abort. It does something only if it has something new to clear: when
        *scope* cleared the inbox, the input accepted at this position (already moved into its
        reports); when *scope* kept it, whatever is queued or staged. Then it queues its own
        notice, and it is the cancel that aborts the controller (its cause becomes the reason
        of the scope's pending ``abort``). A joined cancel with nothing new to clear is a
        no-op, so an observer that cancels on every notice ends."""
        if keep:
            return
        if scope.inbox_slot is not None:
            if scope.fresh == 0:
                return
            scope.fresh = 0
            self._emit_cancel_requested(cause, scope)
        else:
            if not (len(self.inbox) or len(self.outbox)):
                return
            self._emit_cancel_requested(cause, scope)
            inbox_slot, context_slot = _DiscardSlot(ev.INBOX_DISCARD), _DiscardSlot(ev.CONTEXT_DISCARD)
            self._clear_into(inbox_slot, context_slot)
            # Ahead of the scope's abort, as in the original, but never ahead of the notice
            # announcing an item they list (one accepted after the keepInbox cancel).
            listed = {m.id for m in (*inbox_slot.messages, *context_slot.queued)}
            at = len(self._out)
            for index, queued in enumerate(self._out):
                if queued is scope.abort:
                    at = index
                    break
            for index, queued in enumerate(self._out):
                if (isinstance(queued, Live) and queued.event.type == ev.INBOX_ENQUEUE
                        and _message_id(queued) in listed):
                    at = max(at, index + 1)
            self._out.insert(at, context_slot)
            self._out.insert(at, inbox_slot)
            scope.inbox_slot, scope.context_slot = inbox_slot, context_slot
        self._pending_retry = False
        owner = self._owner
        if scope.abort is not None and owner is not None:
            owner.reason = cause
            scope.abort.reason = cause

    def _emit_cancel_requested(self, cause: CancelCause, scope: _Retro) -> None:
        if cause.kind != "disposed":
            notice = Live(LiveEvent(ev.CANCEL_REQUESTED, FrozenDict({"cause": frozen_json(cause)})))
            self._emit(_CancelRequested(notice, scope))

    def _clear_into(self, inbox_slot: _DiscardSlot | None,
                    context_slot: _DiscardSlot | None) -> None:
        if inbox_slot is None or context_slot is None:
            return
        queued = self.inbox.discard() if len(self.inbox) else []
        steering, contexts = self.outbox.clear() if len(self.outbox) else ([], [])
        inbox_slot.queued.extend(queued)
        inbox_slot.steering.extend(steering)
        context_slot.queued.extend(contexts)

    def feed(self, item: Input) -> None:
        """Apply one input value (rule P9)."""
        if isinstance(item, Send):
            self.send(item.message, item.options)
        elif isinstance(item, Cancel):
            self.cancel(item.cause, item.keep_inbox)
        elif isinstance(item, Dispose):
            self.dispose()
        elif isinstance(item, Observer):
            pass                        # P14: an observer's failure or veto never reaches the core
        elif isinstance(item, Append):
            self.append(item.type, item.data, surface_op=item.surface_op,
                        source_event_seqs=item.source_event_seqs, ignorable=item.ignorable)
        elif isinstance(item, Resolve):
            self.resolve(item.effect, item.value)
        elif isinstance(item, Raise):
            self.fail(item.effect, item.error)
        elif isinstance(item, Chunk):
            self.chunk(item.effect, item.chunk)
        elif isinstance(item, End):
            self.end(item.effect)
        else:                           # P9, P10: only the inputs of P9
            raise ProtocolError(f"not an input: {shown(item)}")

    def _stop(self, error: BaseException) -> None:
        """P16: the loop failed where it could not fail a turn in order (a closing append
        refused twice, or a failure outside any turn): the core stops. Its machines are reset
        (so the status is idle), what it waited for is abandoned (later completions are
        accepted and dropped), pending input stays pending until dispose() reports it, and
        ``agent/error`` names the failure."""
        info = internal_error(error)
        self._failure = info
        self._frames.clear()
        self._wait = None
        self._mail.clear()
        self._abandoned.update(self._effects)
        self._effects.clear()
        self._wake_effect = None
        self._owner = None
        self._ctrl = None
        self._pending_retry = False
        self._retro = None              # P7: no cancel is being delivered any more
        if self._disposing:             # R17.4: no item is claimed any more; report them
            self._cancel(DISPOSED_CAUSE, False)
        was_busy = self.lifecycle.busy
        self.lifecycle = Lifecycle()
        self.window = Window()
        self._emit(Live(LiveEvent(ev.ERROR, FrozenDict({"turn": self._turn, "step": self._step,
                                                        "error": frozen_json(info)}))))
        if was_busy:
            self._emit_live(ev.STATUS, status="idle")

    def _teardown(self) -> None:
        """R17.1 step 3: report anything still pending, then the two disposed notices."""
        if len(self.inbox) or len(self.outbox):
            inbox_slot, context_slot = _DiscardSlot(ev.INBOX_DISCARD), _DiscardSlot(ev.CONTEXT_DISCARD)
            self._clear_into(inbox_slot, context_slot)
            self._emit(inbox_slot)
            self._emit(context_slot)
        self._disposed = True
        self._emit_live(ev.AGENT_DISPOSED)
        self._emit_live(ev.SESSION_DISPOSED)
