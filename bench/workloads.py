"""The three core workloads of items 1, 2 and 7, and a lean synchronous driver.

`machine.checking.scripted.Driver` records every output and runs the R20.1 invariant
monitor at each one: right for tests, but for a throughput figure it would
measure the driver. `LeanDriver` keeps nothing but counters: it pulls outputs
until the core waits, answers the oldest outstanding effect synchronously, and
repeats until the core is quiescent again.

* **W1 plain turns**: a followup, answered by a 5-character text reply.
* **W2 tool turns**: a followup; step 1 calls a trivial tool ``echo`` whose
  result is ``ok``; step 2 replies with text.
* **W3 routing mix**: a followup; from the step hook of step 1, one inject
  and, on odd turns, one steer (both staged in the outbox and drained into
  the same step), then a text reply.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any, Final

from machine.core import AgentCore, CoreConfig
from machine.io import (
    FLUSH,
    MODEL,
    PROMPT_SUBMIT,
    REQUEST,
    STEP_HOOK,
    SYSTEM_PROMPT,
    TICK,
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    TURN_STOPPING,
    Durable,
    Effect,
)
from machine.log import SessionLog

WORKLOADS: Final = ("W1", "W2", "W3")
DESCRIPTIONS: Final = {
    "W1": "plain turns (followup, 5-character text reply)",
    "W2": "tool turns (tool call to a trivial tool returning 'ok', then a text reply)",
    "W3": "routing mix (inject each turn and steer on odd turns, from step 1's hook)",
}

CONFIG: Final = {"provider": "bench", "model": "bench-1"}
TEXT_REPLY: Final = ({"type": "text", "text": "hello"}, {"type": "finish", "kind": "stop"})
FINISH: Final = {"type": "finish", "kind": "stop"}
TOOL_OK: Final = {"content": [{"type": "text", "text": "ok"}]}
ALLOW: Final = {"kind": "allow"}
HEADER: Final = {"config": CONFIG}


def user(message_id: str, text: str = "hi", kind: str = "user") -> dict[str, Any]:
    source: dict[str, Any] = {"kind": "user"} if kind == "user" else {"kind": "plugin",
                                                                      "plugin": "bench"}
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": text}],
            "source": source}


def new_core(*, clock: Callable[[], float] | None = None) -> AgentCore:
    config = CoreConfig(request_options=CONFIG, tool_modes={"echo": "exclusive"})
    return AgentCore(config, log=SessionLog(clock=clock))


class LeanDriver:
    """Drives one core through a workload, keeping only counters."""

    def __init__(self, workload: str, core: AgentCore | None = None) -> None:
        if workload not in WORKLOADS:
            raise ValueError(f"unknown workload {workload!r}")
        self.workload = workload
        self.core = core if core is not None else new_core()
        self.durable = 0
        self.outputs = 0
        self.turns = 0
        self._pending: deque[Effect] = deque()

    def drain(self) -> None:
        """Pull and answer until the core waits with nothing outstanding to answer."""
        next_output = self.core.next_output
        pending = self._pending
        answer = self._answer
        durable = outputs = 0
        while True:
            output = next_output()
            if output is None:
                if not pending:
                    break
                answer(pending.popleft())
                continue
            outputs += 1
            kind = type(output)
            if kind is Durable:
                durable += 1
            elif kind is Effect:
                # mypy does not narrow `output` through the saved `type(output)`; the hot
                # loop compares the type once rather than calling isinstance per branch.
                pending.append(output)  # type: ignore[arg-type]
        self.durable += durable
        self.outputs += outputs

    def turn(self) -> None:
        """One turn of the workload, from the followup to quiescence."""
        self.turns += 1
        self.core.followup(user(f"u{self.turns}"))
        self.drain()

    def run(self, turns: int) -> None:
        turn = self.turn
        for _ in range(turns):
            turn()

    def _answer(self, effect: Effect) -> None:
        core = self.core
        kind = effect.kind
        if kind == MODEL:
            chunks: tuple[dict[str, Any], ...] = TEXT_REPLY
            if self.workload == "W2" and effect.payload["step"] == 1:
                chunks = ({"type": "tool-call", "id": f"call-{self.turns}", "name": "echo",
                           "arguments": "{}"}, FINISH)
            for chunk in chunks:
                core.chunk(effect.id, chunk)
            core.end(effect.id)
        elif kind == STEP_HOOK:
            if self.workload == "W3" and effect.payload["step"] == 1:
                core.inject(user(f"c{self.turns}", "context", kind="plugin"))
                if self.turns % 2:
                    core.steer(user(f"s{self.turns}", "steer"))
            core.resolve(effect.id, None)
        elif kind == PROMPT_SUBMIT:
            core.resolve(effect.id, ALLOW)
        elif kind == REQUEST:
            core.resolve(effect.id, HEADER)
        elif kind == TOOL_EXECUTE:
            core.resolve(effect.id, TOOL_OK)
        elif kind == TOOL_FINALIZE:
            core.resolve(effect.id, effect.payload["result"])
        elif kind in (TICK, SYSTEM_PROMPT, TURN_STOPPING, FLUSH, TOOL_PREPARE):
            core.resolve(effect.id, None)
        else:  # pragma: no cover - the workloads raise no other effect
            raise RuntimeError(f"unexpected effect {kind!r}")


def events_per_turn(workload: str) -> float:
    """Durable events of one steady-state turn (measured, not assumed)."""
    driver = LeanDriver(workload)
    driver.run(3)
    before = driver.durable
    driver.run(2)
    return (driver.durable - before) / 2
