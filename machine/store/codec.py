"""The stored forms shared by the backends (S8): canonical JSON, checksums, headers, events."""

from __future__ import annotations

import json
import zlib
from typing import Any, Final

from machine.errors import ValidationError
from machine.events import Event
from machine.store.errors import UnsupportedFormatError
from machine.store.repair import RawRecord
from machine.store.types import Damage, SessionInfo

__all__ = ["FORMAT_VERSION", "canonical", "decode_error", "decode_event", "event_bytes",
           "header_bytes", "parse_header"]

FORMAT_VERSION: Final = 1
_HEADER_KEYS: Final = frozenset({"version", "kind", "session", "parentSession", "seedLength",
                                 "cwd"})


def canonical(value: Any) -> bytes:
    """Canonical JSON (S8): sorted keys, no spaces, ASCII only, no NaN."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False).encode("ascii")


def event_bytes(event: Event) -> bytes:
    """The canonical JSON of an event (E1 form); its CRC-32 is the record's checksum."""
    return canonical(event.to_json())


def header_bytes(info: SessionInfo) -> bytes:
    """The header record (S8): the header fields plus the CRC-32 of their canonical form."""
    fields = info.to_json()
    return canonical({**fields, "crc": zlib.crc32(canonical(fields))})


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

    Raises `UnsupportedFormatError` for an intact header of another version.
    """
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError) as error:
        return None, Damage("undecodable", None, offset, f"header: {decode_error(error)}")
    if not isinstance(value, dict) or value.get("kind") != "header":
        return None, Damage("header", None, offset, "not a header record")
    crc = value.pop("crc", None)
    actual = zlib.crc32(canonical(value))
    if crc != actual:
        return None, Damage("checksum-mismatch", None, offset,
                            f"header: stored crc {crc!r}, computed {actual}")
    if value.get("version") != FORMAT_VERSION:
        raise UnsupportedFormatError(f"session {session_id!r} has format version "
                                     f"{value.get('version')!r}; this code reads version "
                                     f"{FORMAT_VERSION}")
    extra = set(value) - _HEADER_KEYS
    try:
        if extra:
            raise ValidationError("header", f"unexpected field(s) {sorted(extra)}")
        info = SessionInfo(value.get("session"), value.get("parentSession"),  # type: ignore[arg-type]
                           value.get("seedLength", 0), value.get("cwd"))
    except ValidationError as error:
        return None, Damage("header", None, offset, str(error))
    if info.session_id != session_id:
        return info, Damage("header", None, offset,
                            f"the header names session {info.session_id!r}")
    return info, None


def decode_event(index: int, offset: int | None, crc: object, raw: bytes,
                 stored_seq: int | None = None) -> RawRecord:
    """One event record from its stored checksum and text (S8): the event or its damage."""
    actual = zlib.crc32(raw)
    if crc != actual:
        return RawRecord(index, offset, None, Damage(
            "checksum-mismatch", index, offset, f"stored crc {crc!r}, computed {actual}"),
            stored_seq)
    try:
        event = Event.from_json(json.loads(raw))
    except (ValueError, TypeError, RecursionError, OverflowError) as error:
        return RawRecord(index, offset, None,
                         Damage("undecodable", index, offset, decode_error(error)), stored_seq)
    return RawRecord(index, offset, event, None, stored_seq)
