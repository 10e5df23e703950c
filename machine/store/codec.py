"""The stored forms shared by the backends (S8): canonical JSON, checksums, headers, events.

Format version 2 (the one written) gives every session an identity, the header's ``uid``,
and keys every event record's checksum to it (`record_crc`): a record copied from another
session fails its checksum there (S10). Version 1 sessions (no uid, plain checksums) are
still read, and appended to in their own format (S30).
"""

from __future__ import annotations

import json
import re
import uuid
import zlib
from typing import Any, Final

from machine.errors import ValidationError
from machine.events import Event
from machine.store.errors import UnsupportedFormatError
from machine.store.repair import RawRecord
from machine.store.types import Damage, SessionInfo

__all__ = ["FORMAT_VERSION", "READ_VERSIONS", "canonical", "decode_error", "decode_event",
           "event_bytes", "header_bytes", "header_uid", "new_uid", "parse_header",
           "record_crc"]

#: The format version this code writes (S8, S30).
FORMAT_VERSION: Final = 2
#: The format versions it reads.
READ_VERSIONS: Final = frozenset({1, 2})
_HEADER_KEYS: Final = frozenset({"version", "kind", "session", "uid", "parentSession",
                                 "seedLength", "cwd"})
_UID_IN_HEADER: Final = re.compile(rb'"uid":"([0-9a-f]{32})"')


def canonical(value: Any) -> bytes:
    """Canonical JSON (S8): sorted keys, no spaces, ASCII only, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def new_uid() -> str:
    """A fresh session identity (S8): 32 random lowercase hex digits."""
    return uuid.uuid4().hex


def record_crc(raw: bytes, uid: str | None) -> int:
    """S8: an event record's checksum, the CRC-32 of the session's uid (ASCII) followed by
    the record's event text; for a version-1 session (no uid), of the text alone."""
    if uid is None:
        return zlib.crc32(raw)
    return zlib.crc32(raw, zlib.crc32(uid.encode("ascii")))


def event_bytes(event: Event) -> bytes:
    """The canonical JSON of an event (E1 form); its `record_crc` is the record's checksum."""
    return canonical(event.to_json())


def header_bytes(info: SessionInfo) -> bytes:
    """The header record (S8): the header fields plus the CRC-32 of their canonical form."""
    fields = info.to_json()
    return canonical({**fields, "crc": zlib.crc32(canonical(fields))})


def header_uid(raw: bytes) -> str | None:
    """The uid a (possibly damaged) header record names, if it can still be read (S13)."""
    found = _UID_IN_HEADER.search(raw)
    return found[1].decode("ascii") if found else None


def decode_error(error: BaseException) -> str:
    if isinstance(error, json.JSONDecodeError):
        return f"invalid JSON: {error.msg} (column {error.colno})"
    if isinstance(error, UnicodeDecodeError):
        return f"not UTF-8 ({error.reason})"
    if isinstance(error, RecursionError):
        return "invalid JSON: nested too deeply"
    return f"not a session event: {error}"


def parse_header(raw: bytes, session_id: str,
                 offset: int | None = 0) -> tuple[SessionInfo | None, Damage | None]:
    """A header record: its info, or the damage that makes it unusable (S8, S10).

    Raises `UnsupportedFormatError` for an intact header of a version this code does not
    read (S9, S30).
    """
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as error:
        return None, Damage("undecodable", None, offset, f"header: {decode_error(error)}")
    if not isinstance(value, dict) or value.get("kind") != "header":
        return None, Damage("header", None, offset, "not a header record")
    crc = value.pop("crc", None)
    try:
        actual = zlib.crc32(canonical(value))
    except ValueError:   # NaN and the like: not a header this code wrote
        return None, Damage("header", None, offset, "the header holds a non-JSON number")
    if crc != actual:
        return None, Damage("checksum-mismatch", None, offset,
                            f"header: stored crc {crc!r}, computed {actual}")
    version = value.get("version")
    if type(version) is not int or version not in READ_VERSIONS:
        raise UnsupportedFormatError(f"session {session_id!r} has format version "
                                     f"{version!r}; this code reads versions "
                                     f"{', '.join(map(str, sorted(READ_VERSIONS)))}")
    extra = set(value) - _HEADER_KEYS
    try:
        if extra:
            raise ValidationError("header", f"unexpected field(s) {sorted(extra)}")
        uid = value.get("uid")
        if version == 1 and "uid" in value:
            raise ValidationError("header.uid", "a version-1 header has no uid")
        if version == 2 and uid is None:
            raise ValidationError("header.uid", "a version-2 header needs a uid")
        info = SessionInfo(value.get("session"), value.get("parentSession"),  # type: ignore[arg-type]
                           value.get("seedLength", 0), value.get("cwd"), uid)
    except ValidationError as error:
        return None, Damage("header", None, offset, str(error))
    if info.session_id != session_id:
        return info, Damage("header", None, offset,
                            f"the header names session {info.session_id!r}")
    return info, None


def decode_event(index: int, offset: int | None, crc: object, raw: bytes,
                 stored_seq: int | None = None, *, uid: str | None = None) -> RawRecord:
    """One event record from its stored checksum and text (S8): the event or its damage.

    *uid* is the session's identity (None for a version-1 session): the checksum covers it,
    so a record taken from another session is reported as a checksum mismatch (S10)."""
    actual = record_crc(raw, uid)
    if crc != actual:
        whose = "" if uid is None else (" for this session (a damaged record, or one copied "
                                        "from another session)")
        return RawRecord(index, offset, None, Damage(
            "checksum-mismatch", index, offset,
            f"stored crc {crc!r}, computed {actual}{whose}"), stored_seq)
    try:
        event = Event.from_json(json.loads(raw))
    except (ValueError, TypeError, RecursionError, OverflowError) as error:
        return RawRecord(index, offset, None,
                         Damage("undecodable", index, offset, decode_error(error)), stored_seq)
    return RawRecord(index, offset, event, None, stored_seq)
