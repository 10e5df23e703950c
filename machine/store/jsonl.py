"""The JSONL session store: one file per session, one checksummed record per line (S8, S9).

File ``<root>/<session>.jsonl``::

    {"crc":…,"kind":"header","session":"s1","uid":"…","version":2}
    {"crc":3735928559,"event":{"data":{…},"seq":0,"time":…,"type":"turn/start"}}
    …

Every line is ASCII JSON with sorted keys and no spaces. An event record's
``crc`` is the CRC-32 of the session's ``uid`` followed by the event text
exactly as stored between ``"event":`` and the closing brace (S8, format
version 2; a version-1 file has no uid and the CRC-32 of the text alone); the
header's is the CRC-32 of the header object without its ``crc`` in the same
canonical form. The file is only ever appended to (one ``write`` per append),
and ``flush`` is ``fsync``. Creation and salvage write a complete temporary
file and move it into place. A load streams the file (S31): it reads the
records one line at a time and keeps only what the log keeps.

A session is written by one store at a time (S33): a store that creates or loads a
session holds the advisory lock of ``<session>.jsonl.lock`` beside it (`machine.store.
filelock`) until it releases the session, and another store, in this process or any
other, is refused with `SessionLockedError` naming the holder.

Every failure of the file system (a read-only file system, a full disk, a
permission) is raised as a `StoreWriteError` or `StoreReadError` naming the
operation, the file and the operating system's own message (S5).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import shutil
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from machine.errors import ValidationError
from machine.events import Event
from machine.store.base import BaseStore, StoredSession
from machine.store.codec import (
    FORMAT_VERSION,
    decode_event,
    event_bytes,
    header_bytes,
    header_uid,
    parse_header,
    record_crc,
)
from machine.store.errors import (
    DamageError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    StoreFullError,
    StoreReadError,
    StoreReadOnlyError,
    StoreWriteError,
    UnsupportedFormatError,
)
from machine.store.filelock import HeldError, SessionLock
from machine.store.repair import RawRecord
from machine.store.types import Damage, LoadMode, LoadResult, SessionInfo, check_session_id

__all__ = ["FORMAT_VERSION", "JsonlStore", "encode_header", "encode_record", "parse_jsonl"]

SUFFIX: Final = ".jsonl"
_RECORD: Final = re.compile(rb'\{"crc":(0|[1-9][0-9]{0,9}),"event":(.*)\}', re.DOTALL)
_RECORD_HEAD: Final = b'{"crc":'
_BLOCK: Final = 1 << 16          # how much a backwards scan for the last newline reads at once
_HEADER_LIMIT: Final = 1 << 20   # a first line longer than this is not a header


def encode_record(event: Event, uid: str | None = None) -> bytes:
    """One event record line (S8), newline included, its checksum keyed to *uid* (the
    session's identity; None for a version-1 session)."""
    raw = event_bytes(event)
    return b'{"crc":%d,"event":%s}\n' % (record_crc(raw, uid), raw)


def encode_header(info: SessionInfo) -> bytes:
    """The header line (S8), newline included."""
    return header_bytes(info) + b"\n"


def _cause(error: OSError) -> str:
    """The operating system's own words for *error* (S5: the real cause)."""
    return error.strerror or str(error) or type(error).__name__


def _write_failure(error: OSError, message: str, *, recovered: bool = True) -> StoreWriteError:
    """S32: the typed error of a write that failed with *error*: read-only storage and a full
    disk or quota have their own classes, as for PostgreSQL (S28)."""
    if error.errno == errno.EROFS:
        return StoreReadOnlyError(message, recovered=recovered)
    if error.errno in (errno.ENOSPC, errno.EDQUOT):
        return StoreFullError(message, recovered=recovered)
    return StoreWriteError(message, recovered=recovered)


# --------------------------------------------------------------------------
# Parsing (pure)
# --------------------------------------------------------------------------


def _parse_record(index: int, offset: int, line: bytes, uid: str | None = None) -> RawRecord:
    """One event line (S8): the event, or why it is not one (S10)."""
    match = _RECORD.fullmatch(line)
    if match is None:
        detail = "empty line" if not line else "not a {crc, event} record"
        return RawRecord(index, offset, None, Damage("undecodable", index, offset, detail))
    return decode_event(index, offset, int(match[1]), match[2], uid=uid)


def _is_torn(tail: bytes, *, header: bool, session_id: str, uid: str | None = None) -> bool:
    """S9: is an unterminated final line what an interrupted append leaves behind?

    That is the start of a record line (at least its first byte, then printable ASCII,
    possibly followed by zero fill) that does not parse as a complete JSON value, or the
    complete record itself without its newline. Anything else (zero fill alone, a complete
    value with bytes after it, a control byte, a record that fails its checksum) is damage.
    """
    body = tail.rstrip(b"\0")
    if not body:            # nothing of a record: zero fill alone is not a torn record
        return False
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
    return _parse_record(0, 0, body, uid).damage is None


def _header_identity(info: SessionInfo | None, raw: bytes) -> str | None:
    """The uid the records are checked against: the header's, or the one a damaged header
    still names (S13)."""
    return info.uid if info is not None else header_uid(raw)


def parse_jsonl(data: bytes, session_id: str) -> StoredSession:
    """Split a session file into its header and records (S8–S10). Pure; never raises
    except `UnsupportedFormatError` for a header of another format version."""
    first_newline = data.find(b"\n")
    header_raw = data if first_newline < 0 else data[:first_newline]
    info, header_damage = (parse_header(header_raw, session_id) if first_newline >= 0
                           else (None, None))
    uid = _header_identity(info, header_raw)
    terminated = data.rfind(b"\n") + 1
    body_end = len(data)
    torn = 0
    if terminated < len(data) and _is_torn(data[terminated:], header=terminated == 0,
                                           session_id=session_id, uid=uid):
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
    if first_newline < 0:      # one unterminated line, not torn: judge it as the header
        info, header_damage = parse_header(lines[0][1], session_id)
        uid = _header_identity(info, lines[0][1])
    records = [_parse_record(index, line_offset, line, uid)
               for index, (line_offset, line) in enumerate(lines[1:])]
    return StoredSession(info, header_damage, records, torn, body_end, uid)


def _end_of_last_line(file: BinaryIO, size: int) -> int:
    """The offset just after the file's last newline (0 if it has none), read backwards."""
    position = size
    while position > 0:
        start = max(0, position - _BLOCK)
        file.seek(start)
        at = file.read(position - start).rfind(b"\n")
        if at >= 0:
            return start + at + 1
        position = start
    return 0


def _stream_jsonl(file: BinaryIO, session_id: str) -> StoredSession:
    """`parse_jsonl` over an open file, in bounded memory (S31): the header and the final
    line are read first, then the records are parsed one line at a time as the caller
    iterates them (the iterator closes the file). Takes ownership of *file*."""
    size = os.fstat(file.fileno()).st_size
    terminated = _end_of_last_line(file, size)
    if terminated == 0:            # no newline: one line at most, the header or its start
        file.seek(0)
        data = file.read()
        file.close()
        return parse_jsonl(data, session_id)
    file.seek(0)
    header_line = file.readline()
    header_raw = header_line[:-1]
    info, header_damage = parse_header(header_raw, session_id)
    uid = _header_identity(info, header_raw)
    body_end, torn = size, 0
    if terminated < size:
        file.seek(terminated)
        if _is_torn(file.read(size - terminated), header=False, session_id=session_id, uid=uid):
            torn, body_end = size - terminated, terminated
    records = _records(file, len(header_line), body_end, uid)
    return StoredSession(info, header_damage, records, torn, body_end, uid)


def _records(file: BinaryIO, offset: int, end: int, uid: str | None) -> Iterator[RawRecord]:
    """The event records between *offset* and *end*, one line at a time."""
    with file:
        file.seek(offset)
        index = 0
        while offset < end:
            line = file.readline(end - offset)
            if not line:
                return
            raw = line[:-1] if line.endswith(b"\n") else line
            yield _parse_record(index, offset, raw, uid)
            index += 1
            offset += len(line)


# --------------------------------------------------------------------------
# The store
# --------------------------------------------------------------------------


@dataclass(slots=True)
class _Handle:
    """A session open for append. The file is opened for writing at the first append, so a
    session on a read-only file system loads (and is inspected) as long as it needs no
    repair (S5). *lock* is the session's (S33); None until it could be taken (the lock
    file could not be created, on storage this process may not write), and then taken
    before the first write."""

    path: Path
    uid: str | None
    fd: int | None = None
    size: int = 0
    lock: SessionLock | None = None


class JsonlStore(BaseStore[_Handle]):
    """Sessions as JSONL files in the directory *root* (created if missing).

    *fsync* false skips every ``fsync`` (for tests and throwaway sessions):
    records still reach the operating system at each append. *lock_wait* is how long
    opening a session waits for another store that holds it (S33) before
    `SessionLockedError` (0: do not wait).
    """

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True,
                 lock_wait: float = 0.0) -> None:
        if isinstance(lock_wait, bool) or not isinstance(lock_wait, (int, float)) \
                or not 0 <= lock_wait < float("inf"):
            raise ValidationError("lock_wait", f"must be a number of seconds >= 0, not "
                                  f"{lock_wait!r}")
        super().__init__()
        self._lock_wait = float(lock_wait)
        # S33: locks a load took before its handle exists (None: to be taken at the first
        # write), handed to the handle by `_reopen` or `_salvage`.
        self._claims: dict[str, SessionLock | None] = {}
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise _write_failure(error, f"cannot create the store directory {self.root}: "
                                  f"{_cause(error)}") from error
        self._fsync = fsync

    def path(self, session_id: str) -> Path:
        """The file of a session."""
        return self.root / f"{check_session_id(session_id)}{SUFFIX}"

    def load(self, session_id: str, mode: LoadMode = "strict") -> LoadResult:
        """S9–S14, S33: take the session's lock, then load, repair and open it. A load that
        fails gives the lock back."""
        self._check_usable()
        check_session_id(session_id)
        if self.is_open(session_id) or not self._exists(session_id):
            return super().load(session_id, mode)        # S14, or not found
        try:
            self._claims[session_id] = self._lock(self.path(session_id))
        except OSError:     # no lock file can be made here: taken before the first write
            self._claims[session_id] = None
        try:
            return super().load(session_id, mode)
        finally:
            unclaimed = self._claims.pop(session_id, None)
            if unclaimed is not None:
                unclaimed.release()

    # -- primitives ---------------------------------------------------------------

    def _exists(self, session_id: str) -> bool:
        path = self.path(session_id)
        try:
            return path.exists()
        except OSError as error:
            raise StoreReadError(f"cannot look for session {session_id!r} ({path}): "
                                 f"{_cause(error)}") from error

    def _list(self) -> list[str]:
        names: list[str] = []
        try:
            entries = list(self.root.iterdir())
        except OSError as error:
            raise StoreReadError(f"cannot list the sessions in {self.root}: "
                                 f"{_cause(error)}") from error
        for entry in entries:
            stem = entry.name[:-len(SUFFIX)]
            if entry.name.endswith(SUFFIX) and entry.is_file():
                try:
                    names.append(check_session_id(stem))
                except ValidationError:
                    continue
        return sorted(names)

    def _open_for_reading(self, session_id: str) -> BinaryIO:
        path = self.path(session_id)
        try:
            return path.open("rb")
        except FileNotFoundError:
            raise SessionNotFoundError(f"no session {session_id!r} in {self.root}") from None
        except OSError as error:
            raise StoreReadError(f"cannot read session {session_id!r} ({path}): "
                                 f"{_cause(error)}") from error

    def _read(self, session_id: str) -> StoredSession:
        file = self._open_for_reading(session_id)
        try:
            return _stream_jsonl(file, session_id)
        except OSError as error:
            file.close()
            raise StoreReadError(f"cannot read session {session_id!r} "
                                 f"({self.path(session_id)}): {_cause(error)}") from error
        except BaseException:
            file.close()
            raise

    def _read_info(self, session_id: str) -> SessionInfo:
        with self._open_for_reading(session_id) as file:
            try:
                first = file.readline(_HEADER_LIMIT)
            except OSError as error:
                raise StoreReadError(f"cannot read session {session_id!r} "
                                     f"({self.path(session_id)}): {_cause(error)}") from error
        stored = parse_jsonl(first, session_id)
        if stored.header_damage is not None:
            raise DamageError(session_id, [stored.header_damage])
        assert stored.info is not None
        return stored.info

    def _create(self, info: SessionInfo, events: Sequence[Event]) -> _Handle:
        path = self.path(info.session_id)
        try:
            lock = self._lock(path)
        except SessionLockedError as held:  # S3: another store is creating or writing it
            raise SessionExistsError(f"session {info.session_id!r} already exists: {held}"
                                     ) from None
        except OSError as error:
            raise _write_failure(error, f"cannot create session {info.session_id!r} in "
                                  f"{self.root}: {_cause(error)}") from error
        try:
            self._create_file(info, events, path)
        except BaseException:
            lock.release()
            raise
        return _Handle(path, info.uid, lock=lock)

    def _create_file(self, info: SessionInfo, events: Sequence[Event], path: Path) -> None:
        with self._rewriting(info.session_id, f"cannot create session {info.session_id!r} in "
                             f"{self.root}") as temporary:
            self._write_file(temporary, self._lines(info, events, ()))
            try:
                os.link(temporary, path)  # atomic and exclusive
            except FileExistsError:
                raise SessionExistsError(f"session {info.session_id!r} already exists") from None
            except OSError as error:
                if error.errno in _NO_SPACE_OR_READ_ONLY:
                    raise
                try:  # no hard links here: exclusive create, then write
                    self._write_file(path, self._lines(info, events, ()), exclusive=True)
                except FileExistsError:
                    raise SessionExistsError(
                        f"session {info.session_id!r} already exists") from None
            self._sync_dir()

    def _reopen(self, session_id: str, stored: StoredSession) -> _Handle:
        path = self.path(session_id)
        handle = _Handle(path, stored.uid, lock=self._claims.pop(session_id, None))
        if stored.torn_bytes:
            assert stored.valid_length is not None
            try:
                os.truncate(path, stored.valid_length)
                fd = self._writable(handle)
                if self._fsync:
                    os.fsync(fd)
            except OSError as error:
                self._release(handle)
                raise _write_failure(error, f"cannot cut the torn final record of session "
                                      f"{session_id!r} ({path}): {_cause(error)}") from error
        return handle

    def _salvage(self, info: SessionInfo, stored: StoredSession, kept: Sequence[Event],
                 closers: Sequence[Event]) -> tuple[_Handle, str]:
        path = self.path(info.session_id)
        lock = self._claims.pop(info.session_id, None)
        try:
            with self._rewriting(info.session_id, f"cannot salvage session "
                                 f"{info.session_id!r} ({path})",
                                 " the session is unchanged") as temporary:
                if lock is None:
                    lock = self._lock(path)
                number = 1
                while (backup := path.with_name(f"{path.name}.damaged-{number}")).exists():
                    number += 1
                self._copy_file(path, backup)
                self._write_file(temporary, self._lines(info, kept, closers))
                os.replace(temporary, path)
                self._sync_dir()
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        return _Handle(path, info.uid, lock=lock), str(backup)

    def _write(self, handle: _Handle, events: Sequence[Event]) -> None:
        data = b"".join(encode_record(event, handle.uid) for event in events)
        try:
            fd = self._writable(handle)
        except OSError as error:
            raise _write_failure(error, f"cannot append to {handle.path}: {_cause(error)}") from error
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]
        except OSError as error:
            try:
                os.ftruncate(fd, handle.size)
            except OSError:
                raise _write_failure(error, f"cannot append to {handle.path}: {_cause(error)}; the "
                                      "file may now end in a torn record",
                                      recovered=False) from error
            raise _write_failure(error, f"cannot append to {handle.path}: {_cause(error)}") from error
        handle.size += len(data)

    def _sync(self, handle: _Handle) -> None:
        if self._fsync and handle.fd is not None:
            try:
                os.fsync(handle.fd)
            except OSError as error:
                raise _write_failure(error, f"cannot flush {handle.path}: {_cause(error)}") from error

    def _release(self, handle: _Handle) -> None:
        if handle.fd is not None:
            fd, handle.fd = handle.fd, None
            os.close(fd)
        if handle.lock is not None:
            lock, handle.lock = handle.lock, None
            lock.release()

    # -- file helpers ---------------------------------------------------------------

    def _lock(self, path: Path) -> SessionLock:
        """S33: the lock of the session file *path*, waiting up to *lock_wait*;
        `SessionLockedError` naming the holder, or the `OSError` of its lock file."""
        try:
            return SessionLock.acquire(path, wait=self._lock_wait)
        except HeldError as held:
            raise SessionLockedError(
                f"session {path.name[:-len(SUFFIX)]!r} is open for writing in another store "
                f"({held.holder}; lock file {held.path}); one writer per session (S33)"
                ) from None

    def _writable(self, handle: _Handle) -> int:
        """The handle's file descriptor, opening the file for append the first time (and
        taking the session's lock first if the load could not, S33)."""
        if handle.lock is None:
            handle.lock = self._lock(handle.path)
        if handle.fd is None:
            fd = os.open(handle.path, os.O_WRONLY | os.O_APPEND)
            handle.fd, handle.size = fd, os.fstat(fd).st_size
        return handle.fd

    @staticmethod
    def _lines(info: SessionInfo, events: Iterable[Event], more: Iterable[Event]
               ) -> Iterator[bytes]:
        yield encode_header(info)
        for event in events:
            yield encode_record(event, info.uid)
        for event in more:
            yield encode_record(event, info.uid)

    def _temporary(self, session_id: str) -> Path:
        return self.root / f".{session_id}{SUFFIX}.tmp-{os.getpid()}-{os.urandom(4).hex()}"

    @contextlib.contextmanager
    def _rewriting(self, session_id: str, what: str, after: str = "") -> Iterator[Path]:
        """A temporary file for writing a whole session (removed in any case); a failure of
        the file system meanwhile is a `StoreWriteError` saying *what* failed and why (S32)."""
        temporary = self._temporary(session_id)
        try:
            yield temporary
        except OSError as error:
            raise _write_failure(error, f"{what}: {_cause(error)}" + (f";{after}" if after else "")
                                  ) from error
        finally:
            with contextlib.suppress(OSError):
                temporary.unlink(missing_ok=True)

    def _write_file(self, path: Path, chunks: Iterable[bytes], *,
                    exclusive: bool = False) -> None:
        """Write *chunks* to a new file (streamed: a salvage or fork of a large session
        never holds the whole file) and sync it."""
        flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
        fd = os.open(path, flags, 0o644)
        try:
            pending: list[bytes] = []
            size = 0
            for chunk in chunks:
                pending.append(chunk)
                size += len(chunk)
                if size >= _BLOCK:
                    _write_all(fd, b"".join(pending))
                    pending, size = [], 0
            _write_all(fd, b"".join(pending))
            if self._fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    def _copy_file(self, source: Path, target: Path) -> None:
        """Copy *source* to a new file *target* (never an existing one), synced."""
        with source.open("rb") as reader, target.open("xb") as writer:
            shutil.copyfileobj(reader, writer, _BLOCK)
            writer.flush()
            if self._fsync:
                os.fsync(writer.fileno())

    def _sync_dir(self) -> None:
        if not self._fsync:
            return
        fd = os.open(self.root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


#: errno values that no other way of creating the file can avoid.
_NO_SPACE_OR_READ_ONLY: Final = frozenset({errno.EROFS, errno.ENOSPC, errno.EDQUOT})


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
