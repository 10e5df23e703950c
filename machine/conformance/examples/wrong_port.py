"""A deliberately wrong port, to see what `turnstile check --port` reports.

    python -m machine.conformance.examples.wrong_port --bug BUG [--deviate TAG]...

Bugs:

* ``idle-steer`` — routes a steer sent while the window is closed as steering: its
  ``agent/inbox/enqueue`` says ``placement: steering`` instead of ``queued`` (R5.3);
* ``no-context-discard`` — never reports dropped context (no ``agent/context/discard``):
  the original implementation's behaviour that D6 changed; declare ``--deviate D6``
  to have the vectors tagged D6 skipped;
* ``garbage`` — answers the first pull with a line that is not JSON;
* ``hang`` — answers the handshake, then never answers again (its ``start``
  reply never comes);
* ``late-failure`` — accepts the first ``followup`` at once and reports it as failed
  afterwards (``input-failed`` before its next reply, PROTOCOL.md §3), as a port whose
  command fails after its first output would.
* ``exit`` — exits at the first pull without answering;
* ``huge-line`` — answers the first pull with one line of 300 MB;
* ``endless`` — answers the first pull with lines that never end.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Any

from machine.conformance.examples.minimal_port import Port

BUGS = ("idle-steer", "no-context-discard", "garbage", "hang", "late-failure", "exit",
        "huge-line", "endless")


class WrongPort(Port):
    name = "wrong-port"

    def __init__(self, bug: str, deviations: list[str]) -> None:
        super().__init__()
        self.bug = bug
        self.deviations = deviations
        self.misrouted: set[str] = set()
        self.late: dict[str, Any] | None = None
        self.failed_once = False
        self.pulls = 0

    def start(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        if self.bug == "hang":
            time.sleep(3600)
        self.misrouted.clear()   # message ids are per vector: a refused steer must not leak
        return super().start(request)

    def input(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        value = request["input"]
        if (self.bug == "idle-steer" and value.get("in") == "steer"
                and not self.core.accepts_next_step and isinstance(value.get("message"), dict)):
            self.misrouted.add(str(value["message"].get("id")))
        if self.bug == "late-failure" and value.get("in") == "followup" and not self.failed_once:
            self.failed_once = True
            self.late = {"op": "input-failed", "kind": "validation",
                         "message": "the followup failed after its first output"}
            return [{"op": "accepted"}]
        return super().input(request)

    def pull(self, request: dict[str, Any]) -> list[dict[str, Any]]:
        if self.late is not None:
            late, self.late = self.late, None
            return [late]
        self.pulls += 1
        if self.pulls == 1 and self.bug in ("exit", "huge-line", "endless"):
            out = sys.stdout.buffer
            if self.bug == "huge-line":
                piece = b"x" * (1 << 20)
                for _ in range(300):           # 300 MB, written while the checker reads
                    out.write(piece)
                out.write(b"\n")
            while self.bug == "endless":
                out.write(b"more output nobody asked for\n" * 1000)
            out.flush()
            raise SystemExit(3)
        kept: list[dict[str, Any]] = []
        for reply in super().pull(request):
            output = reply.get("output", {})
            if (self.bug == "idle-steer" and output.get("type") == "agent/inbox/enqueue"
                    and str(output["message"].get("id")) in self.misrouted):
                self.misrouted.discard(str(output["message"].get("id")))
                output["placement"] = "steering"
            if self.bug == "no-context-discard" and output.get("type") == "agent/context/discard":
                continue
            kept.append(reply)
        return kept

    def encode(self, reply: dict[str, Any]) -> str:
        if self.bug == "garbage" and reply.get("op") in ("output", "waiting"):
            return "this is not JSON"
        return super().encode(reply)


def main() -> None:
    parser = argparse.ArgumentParser(description="A deliberately wrong conformance port.")
    parser.add_argument("--bug", required=True, choices=BUGS)
    parser.add_argument("--deviate", action="append", default=[], metavar="TAG")
    args = parser.parse_args()
    WrongPort(args.bug, args.deviate).serve()


if __name__ == "__main__":
    main()
