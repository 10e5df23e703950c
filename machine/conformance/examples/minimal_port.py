"""A minimal port adapter: the adapter protocol (specs/conformance/PROTOCOL.md) around a core.

Run it with ``turnstile check --port "python -m machine.conformance.examples.minimal_port"``.
A port in another language has the same loop: read a request line, act on
its core, write the reply lines, flush. Here the core is this project's
`AgentCore`; `Port` is written so that `wrong_port` can bend it.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from machine.core import AgentCore, CoreConfig
from machine.errors import DisposedError, InvariantError, ProtocolError, ValidationError
from machine.events import Event
from machine.io import Durable, input_from_json
from machine.log import SessionLog

COMPLETIONS = {"resolve", "raise", "chunk", "end"}
CONFIG = {"requestOptions": "request_options", "toolModes": "tool_modes",
          "maxParallelToolCalls": "max_parallel_tool_calls", "sessionStart": "session_start",
          "publish": "publish"}


class Port:
    name = "minimal-port"

    def __init__(self) -> None:
        self.core = AgentCore()
        self.deviations: list[str] = []     # tags of vectors this port deviates from on purpose

    # One method per request op; each returns the reply objects.
    def hello(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        return [{"op": "hello", "protocol": 1, "implementation": self.name,
                 "capabilities": ["seed", "append", "observer", "prepare-result",
                                  "request-header"], "deviations": self.deviations}]

    def start(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        config = CoreConfig(**{CONFIG[k]: v for k, v in request.get("config", {}).items()})
        seed = [Event.from_json({"time": 0, **e}) for e in request.get("seed", [])]
        self.core = AgentCore(config, log=SessionLog(seed, clock=lambda: 0))
        return [{"op": "started"}]

    def input(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        value = request["input"]
        try:
            self.core.feed(input_from_json(value))
        except ValidationError as error:
            kind = "protocol" if value.get("in") in COMPLETIONS else "validation"
            return [{"op": "refused", "kind": kind, "message": str(error)}]
        except ProtocolError as error:
            return [{"op": "refused", "kind": "protocol", "message": str(error)}]
        except DisposedError as error:
            return [{"op": "refused", "kind": "disposed", "message": str(error)}]
        except InvariantError as error:
            return [{"op": "refused", "kind": "invariant", "message": str(error)}]
        return [{"op": "accepted"}]

    def pull(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        replies: list[dict[str, Any]] = []
        for _ in range(request.get("max", 1)):
            output = self.core.next_output()
            if output is None:
                replies.append({"op": "waiting"})     # "no more outputs now"
                break
            value = output.to_json(with_time=False) if isinstance(output, Durable) \
                else output.to_json()
            replies.append({"op": "output", "output": value})
        return replies

    def serve(self) -> None:
        for line in sys.stdin:
            request = json.loads(line)
            op = request.get("op")
            if op == "bye":
                break
            handler = getattr(self, op, None) if op in {"hello", "start", "input", "pull"} else None
            replies = handler(request) if handler else [{"op": "error", "message": f"bad op {op!r}"}]
            sys.stdout.write("".join(self.encode(r) + "\n" for r in replies))
            sys.stdout.flush()

    def encode(self, reply: dict[str, Any]) -> str:
        return json.dumps(reply)


if __name__ == "__main__":
    Port().serve()
