"""What the ``turnstile`` commands share about their streams (specs/runtime.md RT27).

* **Standard input as a file**: `STDIN` (``-``) names standard input wherever a command
  takes files; `read_bytes` and `read_text` read either, `shown` is the name a message
  uses (``<stdin>``), and `check_stdin_once` refuses ``-`` given twice (the second read
  would find nothing).
* **Closed pipes**: `quiet_broken_pipe` is how a command whose reader went away ends:
  nothing more is written (standard output is pointed at ``os.devnull`` so the
  interpreter's final flush cannot complain) and the exit status is `EXIT_SIGPIPE` (141,
  what a shell reports for a program ended by SIGPIPE, as ``yes | head`` does).
* **Progress**: `progress_bar` shows a bar on standard error when it is a terminal (with
  ``rich`` when it is installed, extra ``[cli]``; a one-line display otherwise) and
  nothing at all when it is not: no carriage-return lines in a log or a pipe.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Final, Protocol, TextIO

__all__ = ["EXIT_SIGPIPE", "STDIN", "ProgressBar", "check_stdin_once", "is_terminal",
           "progress_bar", "quiet_broken_pipe", "read_bytes", "read_text", "shown"]

#: The name of standard input where a command takes a file.
STDIN: Final = "-"
#: 128 + SIGPIPE: the status a shell reports for a program a closed pipe ended.
EXIT_SIGPIPE: Final = 141
#: A progress display is redrawn at most this often (seconds).
REFRESH: Final = 0.25
#: The width of the plain one-line display (it fits an 80-column terminal).
WIDTH: Final = 78


def shown(path: str | os.PathLike[str]) -> str:
    """How a message names *path*: ``<stdin>`` for `STDIN`, else the path as given."""
    return "<stdin>" if str(path) == STDIN else str(path)


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The bytes of *path*, or of standard input for ``-`` (read to its end)."""
    if str(path) == STDIN:
        return sys.stdin.buffer.read()
    return Path(path).read_bytes()


def read_text(path: str | os.PathLike[str]) -> str:
    """The UTF-8 text of *path* or of standard input (``UnicodeDecodeError`` if it is not)."""
    return read_bytes(path).decode("utf-8")


def check_stdin_once(paths: list[str] | tuple[str, ...]) -> str | None:
    """A usage problem when ``-`` is given more than once (standard input is read once)."""
    if sum(1 for path in paths if path == STDIN) > 1:
        return "'-' (standard input) can be given only once"
    return None


def quiet_broken_pipe() -> int:
    """After a `BrokenPipeError`: write nothing more and return `EXIT_SIGPIPE`.

    Why the dup: the interpreter flushes standard output at exit, and a flush into the
    closed pipe would print "Exception ignored ... BrokenPipeError" after all."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # no real file behind sys.stdout
        pass
    return EXIT_SIGPIPE


def is_terminal(stream: TextIO | None) -> bool:
    """Whether *stream* is an interactive terminal (a closed or odd stream is not)."""
    if stream is None:
        return False
    try:
        return stream.isatty()
    except (ValueError, OSError, AttributeError):
        return False


class ProgressBar(Protocol):
    """A progress display: `advance` or `update` it, `close` it (or use ``with``)."""

    def update(self, completed: float, *, total: float | None = None,
               text: str | None = None) -> None: ...

    def advance(self, amount: float = 1, *, text: str | None = None) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> ProgressBar: ...

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None: ...


class _Base:
    completed: float = 0.0

    def advance(self, amount: float = 1, *, text: str | None = None) -> None:
        self.update(self.completed + amount, text=text)

    def update(self, completed: float, *, total: float | None = None,
               text: str | None = None) -> None:
        self.completed = completed

    def close(self) -> None:
        return None

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.close()


class _Silent(_Base):
    """Not a terminal: nothing is written."""


class _Line(_Base):
    """A terminal without ``rich``: one line redrawn in place, erased at the end."""

    def __init__(self, stream: TextIO, description: str, total: float | None) -> None:
        self.stream, self.description, self.total = stream, description, total
        self.text = ""
        self.last = 0.0
        self.drawn = False

    def update(self, completed: float, *, total: float | None = None,
               text: str | None = None) -> None:
        self.completed = completed
        if total is not None:
            self.total = total
        if text is not None:
            self.text = text
        now = time.monotonic()
        if now - self.last < REFRESH:
            return
        self.last = now
        share = f" {100 * completed / self.total:3.0f}%" if self.total else ""
        rest = f"{share} {self.text}".rstrip()[:WIDTH - 10]
        room = WIDTH - len(rest)        # a long description (a path) keeps its end
        description = self.description if len(self.description) <= room \
            else "…" + self.description[len(self.description) - room + 1:]
        self.stream.write("\r" + (description + rest).ljust(WIDTH))
        self.stream.flush()
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self.stream.write("\r" + " " * WIDTH + "\r")
            self.stream.flush()
            self.drawn = False


class _Rich(_Base):
    """A terminal with ``rich``: a transient bar (it disappears when closed)."""

    def __init__(self, stream: TextIO, description: str, total: float | None) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        self.progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                 TaskProgressColumn(), TextColumn("{task.fields[text]}"),
                                 TimeElapsedColumn(), console=Console(file=stream),
                                 transient=True, refresh_per_second=1 / REFRESH)
        self.text = ""
        self.task = self.progress.add_task(description, total=total, text="")
        self.progress.start()

    def update(self, completed: float, *, total: float | None = None,
               text: str | None = None) -> None:
        self.completed = completed
        if text is not None:
            self.text = text
        if total is not None:
            self.progress.update(self.task, completed=completed, total=total, text=self.text)
        else:
            self.progress.update(self.task, completed=completed, text=self.text)

    def close(self) -> None:
        self.progress.stop()


def progress_bar(description: str, total: float | None = None, *,
                 stream: TextIO | None = None, enabled: bool | None = None) -> ProgressBar:
    """A progress display on *stream* (default: standard error) for work of *total* units
    (``None``: unknown). Shown only when *enabled* (default: when *stream* is a terminal);
    otherwise it writes nothing. On a terminal it is a ``rich`` bar when ``rich`` is
    installed; forced onto a stream that is not a terminal it is the plain line."""
    target = sys.stderr if stream is None else stream
    terminal = is_terminal(target)
    if not (terminal if enabled is None else enabled):
        return _Silent()
    if terminal:
        try:
            return _Rich(target, description, total)
        except ImportError:
            pass
    return _Line(target, description, total)
