"""The advisory lock of a JSONL session (S33): one writer per session across processes.

A session ``s1.jsonl`` is locked through the file ``s1.jsonl.lock`` beside it. Why a file of
its own rather than the session's: creation and salvage move a new file into the session's
place, and a lock on the old file would not hold the new one. The lock is the operating
system's (``flock`` on POSIX, ``msvcrt.locking`` on Windows), so it goes with its holder: a
process that exits or is killed holds nothing. The lock file holds one JSON line naming the
holder (process id, host, program, since when) for the error another process gets, emptied
when the holder releases the lock (so a stale line never names the wrong holder); the file
is never deleted, since a process may hold it open between another's unlink and create.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Final

__all__ = ["HeldError", "SessionLock", "lock_path"]

LOCK_SUFFIX: Final = ".lock"
#: Where the Windows lock sits: one byte far past the holder's line, so that the line (which
#: a byte-range lock would make unreadable to others there) stays readable.
_WINDOWS_OFFSET: Final = 1 << 30
#: How often a waiting process tries the lock again (seconds).
_POLL: Final = 0.05
_PROGRAM_LENGTH: Final = 200

if sys.platform == "win32":                     # pragma: no cover - not run on Linux CI
    import msvcrt

    def _try_lock(fd: int) -> bool:
        os.lseek(fd, _WINDOWS_OFFSET, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
        except OSError as error:
            if error.errno in (errno.EACCES, errno.EDEADLK):
                return False
            raise
        return True
else:
    import fcntl

    def _try_lock(fd: int) -> bool:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


def lock_path(session_file: Path) -> Path:
    """The lock file of a session file (beside it)."""
    return session_file.with_name(session_file.name + LOCK_SUFFIX)


class HeldError(Exception):
    """The lock is held by another open file: by another process, or another store of this
    one. *holder* describes it as its lock file says (or says that it does not)."""

    def __init__(self, path: Path, holder: str) -> None:
        super().__init__(f"{path} is held by {holder}")
        self.path = path
        self.holder = holder


def holder_line() -> bytes:
    """This process as the lock file names it."""
    program = " ".join(sys.argv) or sys.executable
    if len(program) > _PROGRAM_LENGTH:
        program = program[:_PROGRAM_LENGTH - 1] + "…"
    since = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    return json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "program": program,
                       "since": since}, ensure_ascii=False).encode("utf-8") + b"\n"


def _holder_of(fd: int) -> str:
    """The holder named in an open lock file, in words."""
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        text = os.read(fd, 4096).decode("utf-8", "replace")
        fields = json.loads(text.splitlines()[0]) if text.strip() else None
    except (OSError, ValueError):
        fields = None
    if not isinstance(fields, dict) or not {"pid", "host", "program", "since"} <= fields.keys():
        return "a holder that has not named itself yet"
    return (f"pid {fields['pid']} on host {fields['host']!r}, program {fields['program']!r}, "
            f"since {fields['since']}")


class SessionLock:
    """A held lock of one session file (`acquire`); `release` gives it back."""

    def __init__(self, path: Path, fd: int, *, writable: bool) -> None:
        self.path = path
        self._fd: int | None = fd
        self._writable = writable

    @classmethod
    def acquire(cls, session_file: Path, *, wait: float = 0.0) -> SessionLock:
        """Take the lock of *session_file*, waiting up to *wait* seconds for its holder;
        `HeldError` naming the holder when it is held still. An `OSError` when the lock file
        cannot be opened or created (the caller decides what that means)."""
        path = lock_path(session_file)
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
            writable = True
        except OSError as error:
            if error.errno not in (errno.EROFS, errno.EACCES, errno.EPERM):
                raise
            # storage this process may not write: an existing lock file still locks
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise error from None      # why it could not be made, not that it is absent
            writable = False
        try:
            deadline = time.monotonic() + wait
            while not _try_lock(fd):
                if time.monotonic() >= deadline:
                    raise HeldError(path, _holder_of(fd))
                time.sleep(_POLL)
            if writable:
                line = holder_line()
                os.ftruncate(fd, 0)
                os.lseek(fd, 0, os.SEEK_SET)
                os.write(fd, line)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, writable=writable)

    @property
    def held(self) -> bool:
        return self._fd is not None

    def release(self) -> None:
        """Empty the holder's line and give the lock back (closing the file releases it).
        Idempotent."""
        fd, self._fd = self._fd, None
        if fd is not None:
            if self._writable:
                with contextlib.suppress(OSError):  # a stale line only names no one
                    os.ftruncate(fd, 0)
            os.close(fd)
