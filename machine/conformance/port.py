"""The client side of the adapter protocol: another implementation as a `Subject`.

`PortSubject` starts the port's adapter command, performs the handshake and
then translates ``start``/``feed``/``pull`` into requests, one JSON line
each, reading the replies with a timeout. Anything the port does outside
the protocol (a reply that is not JSON, a missing or mistyped field, an
unexpected ``op``, an ``error`` reply, no reply in time, exiting) raises
`PortFailure` with the reply's line number in the port's output and the
offending field.
"""

from __future__ import annotations

import contextlib
import json
import queue
import shlex
import shutil
import subprocess
import sys
import threading
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
_EOF: Final = object()


@dataclass(frozen=True, slots=True)
class PortInfo:
    """What the port said in its handshake."""

    implementation: str
    capabilities: frozenset[str]
    deviations: tuple[str, ...] = field(default=())


class PortSubject:
    """A port's adapter process, driven through the adapter protocol."""

    def __init__(self, command: str, *, timeout: float = 10.0,
                 start_timeout: float = 60.0) -> None:
        self.command = command
        self.timeout = timeout
        #: the handshake's budget: starting a process (and its imports) on a loaded machine
        #: can take much longer than answering a request, and is not a hang
        self.start_timeout = start_timeout
        self.name = command
        self._lines: queue.Queue[object] = queue.Queue()
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
            self._process = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, encoding="utf-8", errors="replace", bufsize=1)
        except OSError as error:
            raise PortFailure(f"cannot start the port {command!r}: {error.strerror or error}") from None
        assert self._process.stdout is not None and self._process.stderr is not None
        threading.Thread(target=self._read, args=(self._process.stdout,), daemon=True).start()
        threading.Thread(target=self._read_stderr, args=(self._process.stderr,), daemon=True).start()
        try:
            self.info = self._handshake()
        except PortFailure:
            self.close()
            raise

    # -- plumbing -------------------------------------------------------------
    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put(_EOF)

    def _read_stderr(self, stream: IO[str]) -> None:
        for line in stream:
            self._stderr.append(line.rstrip("\n"))

    def _exit_text(self) -> str:
        code = None
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = self._process.wait(timeout=1.0)
        text = "the port exited" + (f" with status {code}" if code is not None else "")
        if self._stderr:
            text += "; its last standard error lines:\n    " + "\n    ".join(self._stderr)
        return text

    def _send(self, request: dict[str, Any]) -> None:
        stdin = self._process.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps(request, ensure_ascii=False, separators=(",", ":")) + "\n")
            stdin.flush()
        except (BrokenPipeError, OSError, ValueError):
            raise PortFailure(f"{self._exit_text()} (while sending {jsoncmp.render(request, 120)})"
                              ) from None

    def _reply(self, request: dict[str, Any], expected: Sequence[str], *,
               timeout: float | None = None) -> dict[str, Any]:
        about = f"in reply to {jsoncmp.render(request, 120)}"
        budget = self.timeout if timeout is None else timeout
        try:
            line = self._lines.get(timeout=budget)
        except queue.Empty:
            self._broken = True
            raise PortFailure(f"no reply within {budget:g}s {about}") from None
        if line is _EOF:
            self._lines.put(_EOF)
            raise PortFailure(f"{self._exit_text()} ({about})")
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
        capabilities = reply.get("capabilities", [])
        if not isinstance(capabilities, list) or not all(isinstance(c, str) for c in capabilities):
            raise self._field(reply, "capabilities", "must be an array of strings")
        deviations = reply.get("deviations", [])
        if not isinstance(deviations, list) or not all(isinstance(d, str) for d in deviations):
            raise self._field(reply, "deviations", "must be an array of vector tags")
        implementation = reply.get("implementation", self.command)
        if not isinstance(implementation, str):
            raise self._field(reply, "implementation", "must be a string")
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
        process = self._process
        if self._broken and process.poll() is None:
            process.kill()
        if process.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert process.stdin is not None
                process.stdin.write('{"op":"bye"}\n')
                process.stdin.flush()
            with contextlib.suppress(OSError, ValueError):
                assert process.stdin is not None
                process.stdin.close()
            try:
                process.wait(timeout=2.0)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
