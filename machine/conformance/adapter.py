"""This implementation behind the adapter protocol (specs/conformance/PROTOCOL.md): ``turnstile adapter``.

The adapter reads one JSON request per line on standard input and answers on
standard output, one JSON reply per line, flushing after each request. It is
the reference a port's own adapter is checked against:
``turnstile check --port "turnstile adapter"`` passes.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any, Final, TextIO

from machine.conformance.subjects import LocalSubject
from machine.conformance.vectors import INPUT_FIELDS, MalformedError, config_from_json, seed_events
from machine.errors import TurnstileError

__all__ = ["CAPABILITIES", "PROTOCOL_VERSION", "Adapter", "serve"]

PROTOCOL_VERSION: Final = 1
#: PROTOCOL.md §Skipping: seeded logs, direct appends, observer inputs, and the two seams
#: this implementation has and the original lacks.
CAPABILITIES: Final = ("seed", "append", "observer", "prepare-result", "request-header")


def _dumps(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


class Adapter:
    """Answers adapter requests with a `LocalSubject`; one instance per connection."""

    def __init__(self, deviations: Sequence[str] = (), name: str = "turnstile") -> None:
        self.subject = LocalSubject()
        self.deviations = list(deviations)
        self.name = name
        self.started = False

    def handle(self, request: Any) -> list[dict[str, Any]]:
        """The replies to one decoded request."""
        if not isinstance(request, dict) or not isinstance(request.get("op"), str):
            return [{"op": "error", "message": "a request is an object with a string 'op'"}]
        op = request["op"]
        if op == "hello":
            return [{"op": "hello", "protocol": PROTOCOL_VERSION, "implementation": self.name,
                     "capabilities": list(CAPABILITIES), "deviations": self.deviations}]
        if op == "start":
            return [self._start(request)]
        if op == "input":
            return [self._input(request)]
        if op == "pull":
            return self._pull(request)
        if op == "bye":
            return [{"op": "bye"}]
        return [{"op": "error", "message": f"unknown op {op!r}"}]

    def _start(self, request: dict[str, Any]) -> dict[str, Any]:
        config = request.get("config", {})
        seed = request.get("seed", [])
        if not isinstance(config, dict) or not isinstance(seed, list):
            return {"op": "error", "message": "start needs an object 'config' and an array 'seed'"}
        try:
            config_from_json(config)
            seed_events(seed)
            self.subject.start(str(request.get("vector", "")), config, seed)
        except (TurnstileError, MalformedError) as error:
            return {"op": "error", "message": f"cannot start: {error}"}
        self.started = True
        return {"op": "started"}

    def _input(self, request: dict[str, Any]) -> dict[str, Any]:
        value = request.get("input")
        if not self.started:
            return {"op": "error", "message": "input before start"}
        if not isinstance(value, dict) or value.get("in") not in INPUT_FIELDS:
            return {"op": "error", "message": "input needs an 'input' object with a known 'in'"}
        refused = self.subject.feed(value)
        if refused is None:
            return {"op": "accepted"}
        return {"op": "refused", "kind": refused[0], "message": refused[1]}

    def _pull(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        count = request.get("max", 1)
        if not self.started:
            return [{"op": "error", "message": "pull before start"}]
        if type(count) is not int or count < 1:
            return [{"op": "error", "message": "pull needs a positive integer 'max'"}]
        replies: list[dict[str, Any]] = []
        for output in self.subject.pull(count):
            replies.append({"op": "waiting"} if output is None else {"op": "output", "output": output})
        return replies


def serve(lines: Iterable[str], out: TextIO, deviations: Sequence[str] = ()) -> int:
    """Serve requests from *lines* until ``bye`` or end of input; returns the exit status."""
    adapter = Adapter(deviations)
    for line in lines:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as error:
            replies: list[dict[str, Any]] = [{"op": "error", "message": f"not JSON: {error}"}]
        else:
            replies = adapter.handle(request)
        out.write("".join(_dumps(reply) + "\n" for reply in replies))
        out.flush()
        if replies and replies[-1].get("op") == "bye":
            break
    return 0


def main(deviations: Sequence[str] = ()) -> int:
    return serve(sys.stdin, sys.stdout, deviations)
