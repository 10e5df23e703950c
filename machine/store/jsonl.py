"""The JSONL session store: one file per session, one checksummed record per line (S8, S9).

File ``<root>/<session>.jsonl``::

    {"crc":…,"kind":"header","session":"s1","version":1}
    {"crc":3735928559,"event":{"data":{…},"seq":0,"time":…,"type":"turn/start"}}
    …

Every line is ASCII JSON with sorted keys and no spaces. An event record's
``crc`` is the CRC-32 of the event text exactly as stored between
``"event":`` and the closing brace; the header's is the CRC-32 of the header
object without its ``crc`` in the same canonical form. The file is only ever
appended to (one ``write`` per append), and ``flush`` is ``fsync``. Creation
and salvage write a complete temporary file and move it into place.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from machine.errors import ValidationError
from machine.events import Event
from machine.store.base import BaseStore, StoredSession
from machine.store.codec import FORMAT_VERSION, decode_event, event_bytes, header_bytes, parse_header
from machine.store.errors import (
    DamageError,
    SessionExistsError,
    SessionNotFoundError,
    StoreWriteError,
    UnsupportedFormatError,
)
from machine.store.repair import RawRecord
from machine.store.types import Damage, SessionInfo, check_session_id

__all__ = ["FORMAT_VERSION", "JsonlStore", "encode_header", "encode_record", "parse_jsonl"]

SUFFIX: Final = ".jsonl"
_RECORD: Final = re.compile(rb'\{"crc":(0|[1-9][0-9]{0,9}),"event":(.*)\}', re.DOTALL)
_RECORD_HEAD: Final = b'{"crc":'


def encode_record(event: Event) -> bytes:
    """One event record line (S8), newline included."""
    raw = event_bytes(event)
    return b'{"crc":%d,"event":%s}\n' % (zlib.crc32(raw), raw)


def encode_header(info: SessionInfo) -> bytes:
    """The header line (S8), newline included."""
    return header_bytes(info) + b"\n"


# --------------------------------------------------------------------------
# Parsing (pure)
# --------------------------------------------------------------------------


def _parse_record(index: int, offset: int, line: bytes) -> RawRecord:
    """One event line (S8): the event, or why it is not one (S10)."""
    match = _RECORD.fullmatch(line)
    if match is None:
        detail = "empty line" if not line else "not a {crc, event} record"
        return RawRecord(index, offset, None, Damage("undecodable", index, offset, detail))
    return decode_event(index, offset, int(match[1]), match[2])


def _is_torn(tail: bytes, *, header: bool, session_id: str) -> bool:
    """S9: is an unterminated final line what an interrupted append leaves behind?

    That is the start of a record line (printable ASCII, possibly followed by
    zero fill) that does not parse as a complete JSON value, or the complete
    record itself without its newline. Anything else (a complete value with
    bytes after it, a control byte, a record that fails its checksum) is damage.
    """
    body = tail.rstrip(b"\0")
    if any(byte < 0x20 or byte > 0x7E for byte in body):
        return False
    head = b"{" if header else _RECORD_HEAD
    if not (body.startswith(head) or head.startswith(body)):
        return False
    try:
        _, end = json.JSONDecoder().raw_decode(body.decode("ascii"))
    except (ValueError, RecursionError):
        return True  # incomplete: the write stopped inside the record
    if end != len(body) or body != tail:
        return False
    if header:
        try:
            return parse_header(body, session_id)[1] is None
        except UnsupportedFormatError:
            return False
    return _parse_record(0, 0, body).damage is None


def parse_jsonl(data: bytes, session_id: str) -> StoredSession:
    """Split a session file into its header and records (S8–S10). Pure; never raises
    except `UnsupportedFormatError` for a header of another format version."""
    terminated = data.rfind(b"\n") + 1
    body_end = len(data)
    torn = 0
    if terminated < len(data) and _is_torn(data[terminated:], header=terminated == 0,
                                           session_id=session_id):
        torn, body_end = len(data) - terminated, terminated
    lines: list[tuple[int, bytes]] = []
    offset = 0
    while offset < body_end:
        newline = data.find(b"\n", offset, body_end)
        stop = body_end if newline < 0 else newline
        lines.append((offset, data[offset:stop]))
        offset = stop + 1
    if not lines:
        return StoredSession(None, Damage("header", None, 0, "the file has no header record"),
                             (), torn, body_end)
    info, header_damage = parse_header(lines[0][1], session_id)
    records = [_parse_record(index, line_offset, line)
               for index, (line_offset, line) in enumerate(lines[1:])]
    return StoredSession(info, header_damage, records, torn, body_end)


# --------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _Handle:
    path: Path
    fd: int
    size: int


class JsonlStore(BaseStore[_Handle]):
    """Sessions as JSONL files in the directory *root* (created if missing).

    *fsync* false skips every ``fsync`` (for tests and throwaway sessions):
    records still reach the operating system at each append.
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        super().__init__()
        self.root = Path(root)
        self.root.mkdir(parents=True, exist_ok=True)
        self._fsync = fsync

    def path(self, session_id: str) -> Path:
        """The file of a session."""
        return self.root / f"{check_session_id(session_id)}{SUFFIX}"

    # -- primitives ---------------------------------------------------------------

    def _exists(self, session_id: str) -> bool:
        return self.path(session_id).exists()

    def _list(self) -> list[str]:
        names: list[str] = []
        for entry in self.root.iterdir():
            stem = entry.name[:-len(SUFFIX)]
            if entry.name.endswith(SUFFIX) and entry.is_file():
                try:
                    names.append(check_session_id(stem))
                except ValidationError:
                    continue
        return sorted(names)

    def _read(self, session_id: str) -> StoredSession:
        try:
            data = self.path(session_id).read_bytes()
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.root}") from None
        return parse_jsonl(data, session_id)

    def _read_info(self, session_id: str) -> SessionInfo:
        try:
            with self.path(session_id).open("rb") as file:
                first = file.readline()
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.root}") from None
        stored = parse_jsonl(first, session_id)
        if stored.header_damage is not None:
            raise DamageError(session_id, [stored.header_damage])
        assert stored.info is not None
        return stored.info

    def _create(self, info: SessionInfo, events: Sequence[Event]) -> _Handle:
        path = self.path(info.session_id)
        data = encode_header(info) + b"".join(encode_record(event) for event in events)
        temporary = self._temporary(info.session_id)
        self._write_file(temporary, data)
        try:
            os.link(temporary, path)  # atomic and exclusive
        except FileExistsError:
            raise SessionExistsError(f"session {info.session_id!r} already exists") from None
        except OSError:  # no hard links here: exclusive create, then write
            try:
                self._write_file(path, data, exclusive=True)
            except FileExistsError:
                raise SessionExistsError(
                    f"session {info.session_id!r} already exists") from None
        finally:
            temporary.unlink(missing_ok=True)
        self._sync_dir()
        return self._open(path)

    def _reopen(self, session_id: str, stored: StoredSession) -> _Handle:
        path = self.path(session_id)
        if stored.torn_bytes:
            assert stored.valid_length is not None
            os.truncate(path, stored.valid_length)
        handle = self._open(path)
        if stored.torn_bytes:
            try:
                self._sync(handle)
            except BaseException:
                self._release(handle)
                raise
        return handle

    def _salvage(self, info: SessionInfo, stored: StoredSession, kept: Sequence[Event],
                 closers: Sequence[Event]) -> tuple[_Handle, str]:
        path = self.path(info.session_id)
        original = path.read_bytes()
        number = 1
        while (backup := path.with_name(f"{path.name}.damaged-{number}")).exists():
            number += 1
        self._write_file(backup, original, exclusive=True)
        data = (encode_header(info) + b"".join(encode_record(e) for e in kept)
                + b"".join(encode_record(e) for e in closers))
        temporary = self._temporary(info.session_id)
        self._write_file(temporary, data)
        os.replace(temporary, path)
        self._sync_dir()
        return self._open(path), str(backup)

    def _write(self, handle: _Handle, events: Sequence[Event]) -> None:
        data = b"".join(encode_record(event) for event in events)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(handle.fd, view):]
        except OSError as error:
            try:
                os.ftruncate(handle.fd, handle.size)
            except OSError:
                raise StoreWriteError(f"cannot append to {handle.path}: {error}; the file may "
                                      "now end in a torn record", recovered=False) from error
            raise StoreWriteError(f"cannot append to {handle.path}: {error}") from error
        handle.size += len(data)

    def _sync(self, handle: _Handle) -> None:
        if self._fsync:
            os.fsync(handle.fd)

    def _release(self, handle: _Handle) -> None:
        os.close(handle.fd)

    # -- file helpers ---------------------------------------------------------------

    def _open(self, path: Path) -> _Handle:
        fd = os.open(path, os.O_WRONLY | os.O_APPEND)
        return _Handle(path, fd, os.fstat(fd).st_size)

    def _temporary(self, session_id: str) -> Path:
        return self.root / f".{session_id}{SUFFIX}.tmp-{os.getpid()}-{os.urandom(4).hex()}"

    def _write_file(self, path: Path, data: bytes, *, exclusive: bool = False) -> None:
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        fd = os.open(path, flags, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
