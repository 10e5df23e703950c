"""Values and the protocol of the session stores (specs/persistence.md, S1–S8)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, Protocol, TypeAlias, runtime_checkable

from machine.errors import ValidationError
from machine.events import Event
from machine.jsonvalue import JsonLike, plain_text

__all__ = [
    "DAMAGE_KINDS",
    "Damage",
    "DamageKind",
    "Inspection",
    "LoadMode",
    "LoadReport",
    "LoadResult",
    "SessionInfo",
    "SessionStore",
    "check_session_id",
]

#: S2: how a load treats damage: raise (strict) or keep the intact prefix (salvage).
LoadMode: TypeAlias = Literal["strict", "salvage"]
LOAD_MODES: Final = frozenset({"strict", "salvage"})

#: S10: the kinds of damage a load reports.
DamageKind: TypeAlias = Literal["header", "checksum-mismatch", "undecodable", "seq-gap",
                                "seq-duplicate", "invariant-violation"]
DAMAGE_KINDS: Final = frozenset({"header", "checksum-mismatch", "undecodable", "seq-gap",
                                 "seq-duplicate", "invariant-violation"})

_SESSION_ID: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")
_UID: Final = re.compile(r"[0-9a-f]{32}")


def check_session_id(session_id: object, path: str = "session_id") -> str:
    """S2: a session id is 1–200 characters of ``[A-Za-z0-9._-]`` not starting with ``.``/``-``/``_``."""
    if not isinstance(session_id, str) or _SESSION_ID.fullmatch(session_id) is None:
        raise ValidationError(path, f"{session_id!r} is not a session id (1-200 characters of "
                              "A-Z a-z 0-9 . _ -, starting with a letter or digit)")
    return session_id


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """The header of a stored session (S3): its id, fork parentage and working directory.

    ``uid`` is the session's identity (S8, format version 2): 32 lowercase hex digits minted
    when the session is created, which every event record's checksum covers, so that a
    record copied from another session is damage (S10). None for a session stored in
    format version 1, which had none. It takes no part in equality (it is storage detail).
    """

    session_id: str
    parent: str | None = None
    seed_length: int = 0
    cwd: str | None = None
    uid: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_session_id(self.session_id)
        if self.parent is not None:
            check_session_id(self.parent, "parent")
        if type(self.seed_length) is not int or self.seed_length < 0:
            raise ValidationError("seed_length", "must be a non-negative integer")
        if self.cwd is not None:
            if not isinstance(self.cwd, str):
                raise ValidationError("cwd", "must be a string or None")
            object.__setattr__(self, "cwd", plain_text(self.cwd, "cwd"))    # V23
        if self.uid is not None and (not isinstance(self.uid, str)
                                     or _UID.fullmatch(self.uid) is None):
            raise ValidationError("uid", "must be 32 lowercase hexadecimal digits or None")

    @property
    def version(self) -> int:
        """The format version of the session's stored form (S8): 2 with a uid, else 1."""
        return 1 if self.uid is None else 2

    def to_json(self) -> dict[str, JsonLike]:
        """The header fields of the stored form (S8): ``{version, kind, session, uid?, ...}``."""
        out: dict[str, JsonLike] = {"version": self.version, "kind": "header",
                                    "session": self.session_id}
        if self.uid is not None:
            out["uid"] = self.uid
        if self.parent is not None:
            out["parentSession"] = self.parent
        if self.seed_length:
            out["seedLength"] = self.seed_length
        if self.cwd is not None:
            out["cwd"] = self.cwd
        return out


@dataclass(frozen=True, slots=True)
class Damage:
    """One damaged place of a stored session (§22.5, D8, S10).

    ``record_index`` is the position of the event record (the seq it should
    hold), or None for the header; ``byte_offset`` is where the record starts
    in the file, for formats that have byte offsets (None otherwise).
    """

    kind: DamageKind
    record_index: int | None
    byte_offset: int | None
    detail: str

    def position(self) -> str:
        where = "header" if self.record_index is None else f"record {self.record_index}"
        return where if self.byte_offset is None else f"{where} at byte {self.byte_offset}"

    def __str__(self) -> str:
        return f"{self.kind} at {self.position()}: {self.detail}"

    def to_json(self) -> dict[str, JsonLike]:
        return {"kind": self.kind, "recordIndex": self.record_index,
                "byteOffset": self.byte_offset, "detail": self.detail}


@dataclass(frozen=True, slots=True)
class LoadReport:
    """What a load found and did (S12–S14).

    * ``truncated_bytes``: the size of the torn final record that was cut off (a salvage
      leaves it out of the rewritten session; the quarantined original still has it);
    * ``damage``: every damage found, in storage order (empty for a clean load);
    * ``closers_appended``: how many repair closers were appended (§22.3);
    * ``quarantine``: where a salvage load moved the damaged original (None otherwise);
    * ``live``: the session was already open in this store (§22.6), so nothing was repaired.
    """

    truncated_bytes: int = 0
    damage: tuple[Damage, ...] = ()
    closers_appended: int = 0
    quarantine: str | None = None
    live: bool = False

    @property
    def clean(self) -> bool:
        """True when there was nothing to truncate, report or close."""
        return not (self.truncated_bytes or self.damage or self.closers_appended)

    def to_json(self) -> dict[str, JsonLike]:
        return {"truncatedBytes": self.truncated_bytes,
                "damage": [d.to_json() for d in self.damage],
                "closersAppended": self.closers_appended, "quarantine": self.quarantine,
                "live": self.live}


@dataclass(frozen=True, slots=True)
class LoadResult:
    """A loaded session: the balanced log (intact prefix + closers), the report, the header."""

    events: Sequence[Event]
    report: LoadReport
    info: SessionInfo


@dataclass(frozen=True, slots=True)
class Inspection:
    """A read-only look at a stored session (S15): what a load would keep and add.

    ``events`` is the intact prefix a salvage load would keep (all events when
    there is no damage), ``closers`` the repair a load would append, and
    ``report`` what a load would report (``closers_appended`` counts ``closers``).
    """

    info: SessionInfo
    events: Sequence[Event]
    closers: tuple[Event, ...]
    report: LoadReport
    stored_records: int = field(default=0)


@runtime_checkable
class SessionStore(Protocol):
    """A durable home for session logs (S1–S8). Both backends pass the same contract."""

    def create(self, session_id: str, *, parent: str | None = None, seed_length: int = 0,
               cwd: str | None = None) -> SessionInfo:
        """Create an empty session, durably, and open it for append (S3)."""
        ...

    def load(self, session_id: str, mode: LoadMode = "strict") -> LoadResult:
        """Load, repair and open a session (S9–S14)."""
        ...

    def inspect(self, session_id: str) -> Inspection:
        """What `load` would return, without writing anything (S15)."""
        ...

    def append(self, session_id: str, event: Event) -> None:
        """Append the next event of an open session (S5)."""
        ...

    def flush(self, session_id: str) -> None:
        """Make everything appended to the session so far durable (S6)."""
        ...

    def fork(self, source_id: str, boundary: int | None = None,
             child_id: str | None = None) -> str:
        """Fork an open session at an inclusive boundary seq; returns the child's id (S17)."""
        ...

    def list_sessions(self) -> list[str]:
        """The ids of the stored sessions, sorted."""
        ...

    def info(self, session_id: str) -> SessionInfo:
        """The header of a stored session."""
        ...

    def release(self, session_id: str) -> None:
        """Flush an open session and stop treating it as live (S7)."""
        ...

    def close(self) -> None:
        """Flush and release every open session; the store is unusable afterwards (S7)."""
        ...
