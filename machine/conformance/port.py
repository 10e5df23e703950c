"""The client side of the adapter protocol: another implementation as a `Subject`.

`PortSubject` starts the port's adapter command, performs the handshake and
then translates ``start``/``feed``/``pull`` into requests, one JSON line
each, reading the replies with a timeout. Anything the port does outside
the protocol (a reply that is not JSON, a missing or mistyped field, an
unexpected ``op``, an ``error`` reply, no reply in time, exiting, a reply line
longer than `MAX_LINE_BYTES`) raises `PortFailure` with the reply's line number
in the port's output and the offending field.

The port runs in a session (and process group) of its own, and closing the subject
ends that whole group, so a wrapper that leaves a child holding the port's output
(``npm run``, ``sh -c 'helper & exec port'``) can neither keep the checker waiting
nor outlive it. On Linux it also ends what left the group (``setsid``): every process
that holds one of the port's pipes, and every descendant of the port or of those.
The port's output is read by a thread with bounded memory: at most `MAX_LINE_BYTES` a
line and `QUEUED_LINES` lines ahead of the checker; whatever goes wrong while reading
becomes a `PortFailure`, never a traceback.
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import queue
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Final

from machine.conformance import jsoncmp
from machine.conformance.checker import LateInputFailure, PortFailure
from machine.conformance.vectors import RAISE_KINDS, check_step

__all__ = ["PortInfo", "PortSubject"]

PROTOCOL_VERSION: Final = 1
STDERR_LINES: Final = 12
#: The longest reply line read from a port (a reply is one output: kilobytes, not megabytes).
MAX_LINE_BYTES: Final = 16 << 20
#: How many lines the reader may read ahead of the checker (so endless output is bounded).
#: PROTOCOL.md §3: the fields a hello reply must carry beside op and protocol, and what each is.
HELLO_FIELDS: Final = (
    ("implementation", "the port's name and version (a string)"),
    ("capabilities", "the optional features the port supports (an array, [] for none)"),
    ("deviations", "the vector tags the port deviates from on purpose (an array, [] for none)"),
)
QUEUED_LINES: Final = 256
#: How long a port may take to exit after ``bye`` before its process group is killed.
EXIT_GRACE: Final = 2.0
_STDERR_LINE_BYTES: Final = 4096
_EOF: Final = object()
_POLL: Final = 0.2          # how often a wait for a reply checks whether the port exited


class _Unreadable:
    """What the reader thread queues when the port's output cannot be read any further."""

    def __init__(self, problem: str) -> None:
        self.problem = problem


@dataclass(frozen=True, slots=True)
class PortInfo:
    """What the port said in its handshake."""

    implementation: str
    capabilities: frozenset[str]
    deviations: tuple[str, ...] = field(default=())


class PortSubject:
    """A port's adapter process, driven through the adapter protocol."""

    def __init__(self, command: str, *, timeout: float = 10.0,
                 start_timeout: float = 60.0,
                 max_line_bytes: int = MAX_LINE_BYTES) -> None:
        self.command = command
        self.timeout = timeout
        #: the handshake's budget: starting a process (and its imports) on a loaded machine
        #: can take much longer than answering a request, and is not a hang
        self.start_timeout = start_timeout
        self.max_line_bytes = max_line_bytes
        self.name = command
        self._lines: queue.Queue[object] = queue.Queue(maxsize=QUEUED_LINES)
        self._stderr: deque[str] = deque(maxlen=STDERR_LINES)
        self._reply_line = 0
        self._where = ""
        self._vector = ""
        self._broken = False       # after a protocol failure the process is killed, not asked
        try:
            argv = shlex.split(command)
        except ValueError as error:
            raise PortFailure(f"cannot parse the port command {command!r}: {error}") from None
        if not argv:
            raise PortFailure("the port command is empty")
        if shutil.which(argv[0]) is None:   # e.g. "turnstile" from a venv that is not activated
            beside = Path(sys.executable).parent / argv[0]
            if beside.is_file():
                argv[0] = str(beside)
        try:
            # Why a session of its own: the port's process group is ended as a whole (close).
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=hasattr(os, "killpg"))
        except OSError as error:
            raise PortFailure(f"cannot start the port {command!r}: {error.strerror or error}") from None
        assert self._process.stdout is not None and self._process.stderr is not None
        self._stdout = self._process.stdout
        self._stderr_stream = self._process.stderr
        #: the port's pipes (inode numbers): a process holding one is the port's (close)
        self._pipe_inodes = frozenset(
            os.fstat(stream.fileno()).st_ino
            for stream in (self._process.stdin, self._stdout, self._stderr_stream)
            if stream is not None)
        self._closed = False
        self._readers = [
            threading.Thread(target=self._read, args=(self._stdout,), daemon=True,
                             name="turnstile-port-stdout"),
            threading.Thread(target=self._read_stderr, args=(self._stderr_stream,),
                             daemon=True, name="turnstile-port-stderr")]
        for reader in self._readers:
            reader.start()
        try:
            self.info = self._handshake()
        except PortFailure:
            self.close()
            raise

    # -- plumbing -------------------------------------------------------------
    def _read(self, stream: IO[bytes]) -> None:
        """The reader thread: lines of at most `max_line_bytes`, decoded as UTF-8 (invalid
        bytes replaced), at most `QUEUED_LINES` ahead; ends with _EOF or an _Unreadable."""
        last: object = _EOF
        try:
            while not self._closed:
                line = stream.readline(self.max_line_bytes + 1)
                if not line:
                    break
                if len(line) > self.max_line_bytes and not line.endswith(b"\n"):
                    last = _Unreadable(f"a reply line longer than {self.max_line_bytes:,} bytes")
                    break
                self._put(line.decode("utf-8", "replace"))
        except Exception as error:   # a pipe closed under the thread, memory: no traceback
            last = _Unreadable(f"its output could not be read ({type(error).__name__}: "
                               f"{error})")
        self._put(last)

    def _put(self, item: object) -> None:
        """Queue *item*, waiting while the checker is behind, unless the subject closed."""
        while not self._closed:
            try:
                self._lines.put(item, timeout=_POLL)
                return
            except queue.Full:
                continue

    def _read_stderr(self, stream: IO[bytes]) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("replace")
        with contextlib.suppress(Exception):     # never a traceback from this thread
            while True:
                line = stream.readline(_STDERR_LINE_BYTES)
                if not line:
                    break
                self._stderr.append(decoder.decode(line).rstrip("\n"))

    def _leader_exit(self) -> int | None:
        """The port process's exit status if it has exited, without reaping it (so its pid,
        which names its process group, stays taken until the group is ended)."""
        if self._process.returncode is not None:
            return self._process.returncode
        waitid = getattr(os, "waitid", None)
        if waitid is None:  # pragma: no cover - not POSIX
            return self._process.poll()
        try:
            info = waitid(os.P_PID, self._process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self._process.poll()
        if info is None:
            return None
        status = int(info.si_status)
        return status if info.si_code == os.CLD_EXITED else -status

    def _exit_text(self) -> str:
        code: int | None = None
        deadline = time.monotonic() + 1.0
        while (code := self._leader_exit()) is None and time.monotonic() < deadline:
            time.sleep(0.02)
        text = "the port exited" + (f" with status {code}" if code is not None else "")
        if self._stderr:
            text += "; its last standard error lines:\n    " + "\n    ".join(self._stderr)
        return text

    def _send(self, request: dict[str, Any]) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        # Why backslashreplace: a lone surrogate (only ever inside a JSON string) is written
        # as its JSON escape, so the line stays valid UTF-8 and means the same.
        data = (json.dumps(request, ensure_ascii=False, separators=(",", ":")) + "\n"
                ).encode("utf-8", "backslashreplace")
        try:
            stdin.write(data)
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise PortFailure(f"{self._exit_text()} (while sending {jsoncmp.render(request, 120)})"
                              ) from None

    def _reply(self, request: dict[str, Any], expected: Sequence[str], *,
               timeout: float | None = None) -> dict[str, Any]:
        about = f"in reply to {jsoncmp.render(request, 120)}"
        line = self._next_line(about, self.timeout if timeout is None else timeout)
        if isinstance(line, _Unreadable):
            self._broken = True
            raise PortFailure(f"port reply line {self._reply_line + 1} ({about}): "
                              f"{line.problem}")
        assert isinstance(line, str)
        self._reply_line += 1
        where = f"port reply line {self._reply_line} ({about})"
        try:
            reply = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            raise PortFailure(f"{where}: not JSON ({error}): {line.rstrip()[:160]!r}") from None
        if not isinstance(reply, dict):
            raise PortFailure(f"{where}: a reply must be a JSON object, got "
                              f"{jsoncmp.render(reply, 80)}")
        op = reply.get("op")
        if op == "input-failed":      # §3: an input accepted at its first output failed later
            self._broken = True       # its reply to the request is still to come: restart
            kind, message = reply.get("kind"), reply.get("message", "")
            if not isinstance(kind, str):
                raise PortFailure(f"{where}: field /kind: must be a string")
            raise LateInputFailure(kind, message if isinstance(message, str)
                                   else jsoncmp.render(message, 200))
        if op == "error":
            raise PortFailure(f"{where}: the port reported an error: {reply.get('message')}")
        if op not in expected:
            raise PortFailure(f"{where}: field /op: expected {' or '.join(map(repr, expected))}, "
                              f"got {jsoncmp.render(op, 60)}")
        self._where = where
        return reply

    def _next_line(self, about: str, timeout: float) -> object:
        """The next line of the port's output within *timeout*; PortFailure when none
        comes, or when the port exited (even if a child of it still holds its output)."""
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            try:
                line = self._lines.get(timeout=max(0.0, min(remaining, _POLL)))
            except queue.Empty:
                if self._leader_exit() is not None:
                    try:      # what it wrote before exiting has been read by now, or never
                        line = self._lines.get(timeout=_POLL)
                    except queue.Empty:
                        raise PortFailure(f"{self._exit_text()} ({about})") from None
                elif remaining <= 0:
                    self._broken = True
                    raise PortFailure(f"no reply within {timeout:g}s {about}") from None
                else:
                    continue
            if line is _EOF:
                with contextlib.suppress(queue.Full):
                    self._lines.put_nowait(_EOF)
                raise PortFailure(f"{self._exit_text()} ({about})")
            return line

    def _field(self, reply: dict[str, Any], name: str, problem: str) -> PortFailure:
        return PortFailure(f"{self._where}: field /{name}: {problem}")

    # -- protocol -------------------------------------------------------------
    def _handshake(self) -> PortInfo:
        request = {"op": "hello", "protocol": PROTOCOL_VERSION}
        self._send(request)
        reply = self._reply(request, ("hello",), timeout=self.start_timeout)
        if reply.get("protocol") != PROTOCOL_VERSION:
            raise self._field(reply, "protocol", f"the port speaks protocol "
                              f"{jsoncmp.render(reply.get('protocol'), 40)}; this checker speaks "
                              f"{PROTOCOL_VERSION}")
        # PROTOCOL.md §3: the reply names the implementation and lists its capabilities and
        # deviations, empty arrays included; a port that leaves one out fails the handshake
        # rather than being run as if it had declared nothing.
        for name, what in HELLO_FIELDS:
            if name not in reply:
                raise self._field(reply, name, f"is missing: the hello reply must carry {what}")
        capabilities = reply["capabilities"]
        if not isinstance(capabilities, list) or not all(isinstance(c, str) for c in capabilities):
            raise self._field(reply, "capabilities", "must be an array of strings")
        deviations = reply["deviations"]
        if not isinstance(deviations, list) or not all(isinstance(d, str) for d in deviations):
            raise self._field(reply, "deviations", "must be an array of vector tags")
        implementation = reply["implementation"]
        if not isinstance(implementation, str) or not implementation:
            raise self._field(reply, "implementation", "must be a non-empty string")
        self.name = implementation
        return PortInfo(implementation, frozenset(capabilities), tuple(deviations))

    def start(self, vector_id: str, config: Mapping[str, Any],
              seed: Sequence[Mapping[str, Any]]) -> None:
        self._vector = vector_id
        request: dict[str, Any] = {"op": "start", "vector": vector_id, "config": dict(config)}
        if seed:
            request["seed"] = list(seed)
        self._send(request)
        self._reply(request, ("started",))

    def feed(self, value: dict[str, Any]) -> tuple[str, str] | None:
        request = {"op": "input", "input": value}
        self._send(request)
        reply = self._reply(request, ("accepted", "refused"))
        if reply["op"] == "accepted":
            return None
        kind = reply.get("kind")
        if kind not in RAISE_KINDS:
            raise self._field(reply, "kind", f"must be one of {', '.join(RAISE_KINDS)}, got "
                              f"{jsoncmp.render(kind, 40)}")
        message = reply.get("message", "")
        return str(kind), message if isinstance(message, str) else jsoncmp.render(message, 200)

    def pull(self, count: int) -> list[dict[str, Any] | None]:
        request = {"op": "pull", "max": count}
        self._send(request)
        outputs: list[dict[str, Any] | None] = []
        while len(outputs) < count:
            reply = self._reply(request, ("output", "waiting"))
            if reply["op"] == "waiting":
                outputs.append(None)
                break
            output = reply.get("output")
            if not isinstance(output, dict) or output.get("out") == "none":
                raise self._field(reply, "output", "must be an output object "
                                  '{"out": "event" | "live" | "effect" | "abort" | "release", ...}')
            shape = output
            if output.get("out") == "event" and "time" in output:
                shape = {k: v for k, v in output.items() if k != "time"}
            try:
                check_step(shape)
            except ValueError as problem:
                raise self._field(reply, "output" + str(problem).split(":", 1)[0],
                                  str(problem).split(": ", 1)[1]) from None
            outputs.append(shape)
        return outputs

    def close(self) -> None:
        """Say ``bye``, give the port `EXIT_GRACE` to exit, then end its whole process group
        (whatever it left behind), reap it and close the pipes. Never blocks for longer."""
        if self._closed:
            return
        process = self._process
        stdin = process.stdin
        if not self._broken and self._leader_exit() is None:
            with contextlib.suppress(OSError, ValueError):
                assert stdin is not None
                stdin.write(b'{"op":"bye"}\n')
                stdin.flush()
            deadline = time.monotonic() + EXIT_GRACE
            while self._leader_exit() is None and time.monotonic() < deadline:
                time.sleep(0.02)
        self._closed = True
        self._end_group()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=EXIT_GRACE)
        with contextlib.suppress(OSError, ValueError):
            if stdin is not None:
                stdin.close()
        for reader, stream in zip(self._readers, (self._stdout, self._stderr_stream),
                                  strict=True):
            # Why join first: closing a stream while its reader is inside readline blocks on
            # the stream's lock. With the group ended the reader sees the end of the pipe; a
            # process that escaped the group may still hold it, and then the stream is left.
            reader.join(timeout=EXIT_GRACE)
            if not reader.is_alive():
                with contextlib.suppress(OSError, ValueError):
                    stream.close()

    def _end_group(self) -> None:
        """SIGKILL the port's process group (its own session, see __init__), or the port;
        on Linux first every process that left the group but is still the port's (see
        `_escaped`), stopped before it is killed so that it cannot start another."""
        if not hasattr(os, "killpg"):  # pragma: no cover - not POSIX
            with contextlib.suppress(OSError):
                self._process.kill()
            return
        stopped: set[int] = set()
        for _ in range(_ESCAPE_ROUNDS):     # until a scan finds no process not stopped yet
            found = _escaped(self._process.pid, self._pipe_inodes) - stopped
            if not found:
                break
            for pid in found:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGSTOP)
            stopped |= found
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self._process.pid, signal.SIGKILL)
        for pid in stopped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


#: How many times `PortSubject._end_group` looks again for processes started meanwhile.
_ESCAPE_ROUNDS: Final = 20
_PROC: Final = Path("/proc")


def _escaped(leader: int, pipes: frozenset[int]) -> set[int]:
    """The processes that belong to the port whose process (and group, and session) is
    *leader* although they may have left its group: those in its session or group, those
    holding one of its *pipes* (inode numbers), and every descendant of those or of the
    leader; read from /proc (nothing where there is none). Never this process."""
    if not _PROC.is_dir():  # pragma: no cover - not Linux
        return set()
    own = os.getpid()
    parents: dict[int, int] = {}
    found: set[int] = set()
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) == own:
            continue
        pid = int(entry.name)
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue                        # gone meanwhile, or not readable
        parent, group, session = int(fields[1]), int(fields[2]), int(fields[3])
        parents[pid] = parent
        if leader in (group, session) or (pipes and _holds(entry, pipes)):
            found.add(pid)
    found.add(leader)
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    pending = list(found)
    while pending:
        for child in children.get(pending.pop(), ()):
            if child not in found and child != own:
                found.add(child)
                pending.append(child)
    return found


def _holds(process: Path, pipes: frozenset[int]) -> bool:
    """Whether the process of */proc/<pid>* has one of *pipes* open."""
    try:
        descriptors = list((process / "fd").iterdir())
    except OSError:
        return False
    for descriptor in descriptors:
        try:
            target = os.readlink(descriptor)
        except OSError:
            continue
        if target.startswith("pipe:[") and int(target[6:-1]) in pipes:
            return True
    return False
