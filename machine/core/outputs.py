"""Outputs, effects and completions (rules P1-P10, C10): the output queue and how a pull
advances the loop, the mailbox of buffered completions (P6), effect records and release
(P5), commits of the loop's own events."""
from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Final, Literal

from machine import events as ev
from machine.core.records import (
    APPEND,
    DONE,
    Action,
    _Aborted,
    _AbortNotice,
    _CancelRequested,
    _Controller,
    _DiscardSlot,
    _EffectRecord,
    _Mail,
    _Queued,
    _Wait,
)
from machine.core.state import CoreState
from machine.errors import (
    EXITS,
    ProtocolError,
)
from machine.events import LiveEvent
from machine.io import (
    MODEL,
    Control,
    Durable,
    Effect,
    EffectKind,
    Live,
    Output,
)
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
    JsonLike,
    shown,
    snapshot,
)
from machine.vocabulary import (
    ErrorInfo,
    Message,
)

#: The classes of the outputs a phase may give (machine.io's ``Output``).
OUTPUT_TYPES: Final = frozenset((Durable, Live, Effect, Control))


class Outputs(CoreState):
    """Pulling outputs and taking completions; the loop's output primitives."""

    # The two entry points of the layers above that a pull needs (machine.core.admission,
    # machine.core.commands); declared here so that this layer reads alone.
    def _advance_idle(self) -> bool:
        raise NotImplementedError

    def _stop(self, error: BaseException) -> None:
        raise NotImplementedError

    def resolve(self, effect: int, value: JsonLike = None) -> None:
        self._complete(effect, "resolve", value)

    def fail(self, effect: int, error: ErrorInfo) -> None:
        if not isinstance(error, ErrorInfo):
            raise ProtocolError(f"effect {effect}: a raise needs an ErrorInfo, not {type(error).__name__}")
        self._complete(effect, "raise", ErrorInfo.checked(error))    # V2: however built

    def chunk(self, effect: int, chunk: JsonLike) -> None:
        self._complete(effect, "chunk", chunk)

    def end(self, effect: int) -> None:
        self._complete(effect, "end", None)

    def _complete(self, effect: int, kind: str, value: JsonLike) -> None:
        if type(effect) is not int:
            raise ProtocolError(f"effect id must be an integer, not {shown(effect)}")
        record = self._effects.get(effect)
        if record is None:
            if effect in self._abandoned:                       # P16: accepted, dropped
                if kind != "chunk":
                    self._abandoned.discard(effect)
                return
            # Why no set of completed ids: ids are issued in order from 0, and each issued
            # one is outstanding, abandoned or completed, so an issued id found in neither
            # of the first two is completed (a set would grow with every effect, P10).
            if 0 <= effect < self._next_effect:
                raise ProtocolError(f"effect {effect} was already completed")
            raise ProtocolError(f"effect {effect} was never requested")
        if kind in ("chunk", "end") and record.kind != MODEL:
            raise ProtocolError(f"effect {effect} is a {record.kind!r} effect; only a model "
                                f"effect takes {kind!r}")
        if kind == "resolve" and record.kind == MODEL:
            raise ProtocolError(f"effect {effect} is a model stream: complete it with chunk, "
                                "end or raise")
        if kind != "raise" and value is not None:
            value = snapshot(value)     # V6, P6: the value as it is at the call
        if kind != "chunk":
            del self._effects[effect]                           # completed (P10)
        self._mail.append((effect, kind, value))

    def next_output(self) -> Output | None:
        """The next output, or None when the core waits for an input."""
        out = self._out
        while True:
            if out:
                self._retro = None      # the previous output's delivery has ended (P7)
                item = out.popleft()
                if isinstance(item, _DiscardSlot):
                    live = item.materialise()
                    if live is None:
                        continue
                    return live
                if isinstance(item, _CancelRequested):
                    self._retro = item.retro            # P7: its delivery opens the window
                    item.retro.fresh = 0
                    return item.output
                if isinstance(item, _AbortNotice):
                    return item.materialise()
                return item
            # Advance the loop by one step. Why inline (this runs once per output): one call
            # fewer, and an output the loop gives with nothing queued before it is handed out
            # at once rather than queued and taken back (the same output, in the same order).
            frames = self._frames
            if not frames:
                try:
                    if not self._advance_idle():
                        return None
                except BaseException as error:  # P16: never escapes, never half-advanced
                    self._stop(error)
                    if isinstance(error, EXITS):
                        raise           # P16: the core has stopped; the exit goes on
                continue
            sent: object = None
            if self._wait is not None:
                sent = self._take_mail(self._wait)
                if sent is None:
                    return None         # P7: nothing pulled, the position stays
                self._wait = None
            self._retro = None          # the loop moves on: the position is over (P7)
            frame = frames[-1]
            try:
                while True:             # run phases until one gives an output or waits
                    try:
                        action = frame.phase(self, frame, sent)
                    except Exception as error:
                        action = self._unwind(error)
                        frame = frames[-1]
                    kind = action.__class__
                    if kind in OUTPUT_TYPES or kind is _Wait:   # the usual cases first
                        break
                    if action is DONE:                  # the activity ends; its caller goes on
                        frames.pop()
                        if not frames:
                            break
                        sent = frame.result
                        frame = frames[-1]
                    else:                               # a sub-activity starts
                        # Why not cast/isinstance: this runs several times per output; what
                        # is neither an output, a wait nor DONE is a frame (`Action`).
                        frame = action  # type: ignore[assignment]
                        frames.append(frame)
                        sent = None
            except BaseException as error:      # P16: the loop cannot go on
                self._stop(error)
                if isinstance(error, EXITS):
                    raise               # P16: the core has stopped; the exit goes on
                continue
            if kind is _Wait:
                self._wait = action.ids  # type: ignore[union-attr]  # Why: as above, no cast
            elif action is DONE:                # the loop has ended
                continue
            elif out:
                out.append(action)  # type: ignore[arg-type]  # only an output is left
            else:
                return action  # type: ignore[return-value]  # only an output is left

    def _unwind(self, error: Exception) -> Action:
        """A phase raised *error*: the frames above the nearest one with an armed handler are
        dropped, and the handler (disarmed first) says what happens next. With none, the
        error goes on (P16: the core stops)."""
        frames = self._frames
        while frames:
            frame = frames[-1]
            handler = frame.handler
            if handler is not None:
                # Why no guard around it: a handler only starts the failed turn's closing;
                # should it raise, no frame below it has a handler, so the core stops (P16).
                frame.handler = None
                return handler(self, frame, error)
            frames.pop()
        raise error

    def drain_outputs(self) -> list[Output]:
        """Pull every output available now (no observers act in between)."""
        outputs: list[Output] = []
        while (output := self.next_output()) is not None:
            outputs.append(output)
        return outputs

    def _emit(self, item: _Queued) -> None:
        retro = self._retro
        if retro is not None:
            # P7: before what the cancel being delivered still has pending (reports, abort)
            for index, queued in enumerate(self._out):
                if queued is retro.inbox_slot or queued is retro.abort:
                    self._out.insert(index, item)
                    return
        self._out.append(item)

    def _emit_live(self, type_: str, **payload: Frozen) -> None:
        self._emit(Live(LiveEvent(type_, FrozenDict(payload))))

    def _take_mail(self, ids: frozenset[int]) -> _Mail | None:
        if self._mail and self._mail[0][0] in ids:  # Why: usually the oldest mail is the one
            return self._mail.popleft()
        for index, mail in enumerate(self._mail):
            if mail[0] in ids:
                del self._mail[index]
                return mail
        return None

    def _new_effect(self, kind: EffectKind, payload: FrozenDict,
                    history: Sequence[Message] | None = None) -> Effect:
        effect_id = self._next_effect
        self._next_effect += 1
        self._effects[effect_id] = _EffectRecord(kind, payload)
        return Effect(effect_id, kind, payload, history)

    def _release(self, effect_id: int) -> Control | None:
        """P5: stop consuming a model stream; drop what is buffered for it. Returns the
        ``release`` notice, or None when the stream had already ended (nothing to stop)."""
        self._mail = deque(m for m in self._mail if m[0] != effect_id)
        if self._effects.pop(effect_id, None) is None:
            return None                     # P10: a later completion is refused (`_complete`)
        return Control("release", FrozenDict({"effect": effect_id}))

    def _commit(self, type_: str, data: Mapping[str, Frozen] | Message, *,
                surface: bool = False, sources: Sequence[int] | None = None) -> Durable:
        if isinstance(data, dict):
            # Why adopt, not FrozenDict(data): the loop builds *data* here from frozen values
            # (its type says so, and mypy --strict checks every call), so the copy and the
            # per-value check of the constructor would find nothing; the log's checks (L2)
            # still judge the event.
            data = FrozenDict._adopt(data)
        return Durable(self.log.commit(type_, data, surface_op=APPEND if surface else None,
                                       source_event_seqs=sources))

    def _check_signal(self) -> None:
        ctrl = self._ctrl
        if ctrl is not None and ctrl.aborted:
            raise _Aborted()

    def _new_controller(self, kind: Literal["admission", "run"]) -> _Controller:
        self._next_signal += 1
        ctrl = _Controller(self._next_signal, kind)
        self._ctrl = ctrl
        self._owner = ctrl
        return ctrl

    def _warn(self, text: str) -> Live:
        return Live(LiveEvent(ev.WARNING, FrozenDict({"text": text})))

    def _signal(self) -> int:
        assert self._ctrl is not None
        return self._ctrl.signal
