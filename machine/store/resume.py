"""Resume and persistence wiring (§23, S18): seed an agent from a store, feed a store from an agent."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace

from machine.core import AgentCore, CoreConfig
from machine.events import CORE_EVENT_TYPES, Event
from machine.io import Durable, Effect, Output
from machine.jsonvalue import JsonLike
from machine.log import SessionLog
from machine.store.errors import UnreadableSessionError
from machine.store.types import LoadMode, LoadResult, SessionStore
from machine.vocabulary import ErrorInfo

__all__ = ["StoreSink", "check_readable", "resume_core", "resume_from"]


def check_readable(session_id: str, events: Sequence[Event], reads: Iterable[str] = ()) -> None:
    """D16, S34: refuse to resume a session this build cannot read faithfully.

    Every event's type must be one of the core's own, or one of *reads* (the extension types
    the resuming application reads: its plugins' types), unless its writer marked the event
    ``ignorable``. The first event that is neither raises `UnreadableSessionError` naming it:
    a build that went on would derive its history and state from part of the session."""
    known = CORE_EVENT_TYPES.union(reads)
    for event in events:
        if event.type not in known and not event.ignorable:
            raise UnreadableSessionError(
                f"session {session_id!r} cannot be resumed by this build: event {event.seq} "
                f"has type {event.type!r}, which it does not read, and its writer did not mark "
                "it ignorable; pass the extension types the application reads (reads=...), or "
                "resume with the build that wrote it", seq=event.seq, event_type=event.type)


def resume_core(store: SessionStore, session_id: str, config: CoreConfig | None = None, *,
                mode: LoadMode = "strict", clock: Callable[[], float] | None = None,
                mint_id: Callable[[str, int], str] | None = None,
                reads: Iterable[str] = ()) -> AgentCore:
    """S18 (§23): load (and repair) a stored session and seed a new agent with it.

    The agent's config is *config* with ``session_start='resume'``; its log
    is seeded with the loaded, repaired events, so turn numbering continues
    and its first request records ``request/header {reason:'resume'}`` (or
    ``initial`` when the log has no header yet). The session stays open in
    *store*: wire a `StoreSink` to persist what the agent appends. A session holding an
    event of a type neither the core's nor in *reads*, not marked ignorable, is released
    again and refused with `UnreadableSessionError` (D16, S34).
    """
    result = store.load(session_id, mode)
    try:
        check_readable(session_id, result.events, reads)
    except UnreadableSessionError:
        store.release(session_id)
        raise
    return resume_from(result, config, clock=clock, mint_id=mint_id, reads=reads)


def resume_from(result: LoadResult, config: CoreConfig | None = None, *,
                clock: Callable[[], float] | None = None,
                mint_id: Callable[[str, int], str] | None = None,
                reads: Iterable[str] = ()) -> AgentCore:
    """`resume_core` for a session already loaded (refused as `resume_core` refuses it, the
    session left as it is)."""
    check_readable(result.info.session_id, result.events, reads)
    base = config if config is not None else CoreConfig()
    log = SessionLog(result.events, clock=clock)
    return AgentCore(replace(base, session_start="resume"), log=log, mint_id=mint_id)


class StoreSink:
    """Persists an agent's durable outputs into an open session of a store (§21.5, S16).

    Call it with every output a driver pulls (it appends each `Durable`
    event, in seq order), and answer the core's ``flush`` effect with
    `answer_flush`, which makes everything appended so far durable.
    """

    def __init__(self, store: SessionStore, session_id: str) -> None:
        self.store = store
        self.session_id = session_id

    def __call__(self, output: Output) -> None:
        if isinstance(output, Durable):
            self.store.append(self.session_id, output.event)

    def flush(self) -> None:
        self.store.flush(self.session_id)

    def answer_flush(self, effect: Effect) -> tuple[str, JsonLike | ErrorInfo]:
        """An answer to a ``flush`` effect: ``("resolve", None)``, or ``("raise", error)``."""
        try:
            self.store.flush(self.session_id)
        except Exception as error:
            return "raise", ErrorInfo.from_exception(error)
        return "resolve", None
