"""Where the provider boundary is checked (specs/providers.md W9; specs/core.md R20.5).

Every request body both adapters would send, over what the core and the store reach: the
explorer's states (through the invariant monitor, R20.5), every position of every
conformance vector, every log crash repair yields, a fork at every position, every
compaction, and the first request after a kill -9 in a tool batch or a stream, resumed
through the real adapters against the refusing fake servers (W8).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from machine.checking.search import CONFIGURATIONS
from machine.conformance.checker import run_all
from machine.conformance.subjects import LocalSubject
from machine.conformance.vectors import Vector, find_vectors, load_vector
from machine.events import Event
from machine.io import Durable, Effect, Output
from machine.jsonvalue import FrozenDict
from machine.log import SessionLog
from machine.payloads import TurnEndData
from machine.providers import plan
from machine.providers.check import ProviderRuleError, RequestCheck
from machine.runtime import Agent
from machine.runtime.adapters.anthropic import AnthropicMessages
from machine.runtime.adapters.fake_server import (
    FakeServer,
    Reply,
    anthropic_text,
    anthropic_tool_calls,
    openai_text,
    openai_tool_calls,
)
from machine.runtime.adapters.openai import OpenAIChat
from machine.runtime.model import ModelAdapter
from machine.store import JsonlStore
from machine.store.compaction import checkpoint_message, choose_compaction_range, compact
from machine.store.errors import OpenTurnError
from machine.store.repair import closers
from machine.store.testing import LogBuilder, sample_session, store_events

REPO = Path(__file__).resolve().parent.parent
VECTORS = REPO / "specs" / "conformance" / "vectors"


# --------------------------------------------------------------------------
# The explorer (through the monitor, R20.5)
# --------------------------------------------------------------------------


def test_W9_R20_5_the_explorer_checks_the_requests_of_every_state_it_reaches() -> None:
    """W9: each configuration, with the reference model, explored to depth 2: every model
    request and every continuation is checked (test_explore.py runs the CI depths with the
    same monitor)."""
    for name, configuration in CONFIGURATIONS.items():
        explorer = configuration.explorer()
        checks = explorer.root().monitor.requests
        assert isinstance(checks, RequestCheck)
        result = explorer.run(min(2, configuration.ci_depth))
        assert result.failure is None, (name, result.failure)


def test_W9_R20_5_a_planted_adapter_bug_is_found_by_the_explorer_naming_rule_and_place(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """W9: an adapter that forgets the missing results of W2.2 (the most reported failure of
    agent loops) is found at the first state with a call and no result yet, and the report
    names the rule, the provider's position and the path that gets there."""
    original = plan.Planner._close

    def forgetful(self: plan.Planner) -> None:
        group = self.group
        if group is not None:
            for slot in group.slots:
                slot[2] = True            # as if every call were answered
        original(self)

    monkeypatch.setattr(plan.Planner, "_close", forgetful)
    result = CONFIGURATIONS["turn"].explorer(with_model=False).run(2)
    failure = result.failure
    assert failure is not None
    message = str(failure)
    assert "[R20.5] the log after seq" in message and "(assistant/message)" in message
    assert "[W4.5] messages[1].role" in message and "did not have response messages" in message
    assert any(step.get("in") == "chunk" for step in failure.steps)


# --------------------------------------------------------------------------
# Conformance vectors: every position
# --------------------------------------------------------------------------


class _CheckingSubject(LocalSubject):
    """This implementation, with the requests of every output checked (W9)."""

    checks = RequestCheck()
    outputs = 0

    def pull(self, count: int) -> list[dict[str, Any] | None]:
        outputs: list[dict[str, Any] | None] = []
        for _ in range(count):
            output = self.core.next_output()
            if output is None:
                outputs.append(None)
                break
            self._check(output)
            outputs.append(output.to_json(with_time=False) if isinstance(output, Durable)
                           else output.to_json())
        return outputs

    def _check(self, output: Output) -> None:
        _CheckingSubject.outputs += 1
        if isinstance(output, Effect) and output.kind == "model":
            header = output.payload.get("header")
            assert isinstance(header, FrozenDict)
            self.checks.request(header, output.history or (), f"model request {output.id}")
        self.checks.log(self.core.log, f"after output {_CheckingSubject.outputs}")


def corpus() -> list[Vector]:
    return [load_vector(path) for path in find_vectors([VECTORS])]


def test_W9_every_position_of_every_conformance_vector_makes_accepted_requests() -> None:
    vectors = corpus()
    assert len(vectors) > 200
    outcomes = run_all(vectors, _CheckingSubject)
    assert [o.vector.id for o in outcomes if o.status != "passed"] == []
    assert _CheckingSubject.outputs > 5000 and _CheckingSubject.checks.checked > 500


# --------------------------------------------------------------------------
# The store: crash repair, fork, compaction
# --------------------------------------------------------------------------


def test_W9_every_log_crash_repair_yields_makes_accepted_requests() -> None:
    """W9, S12: a torn or cut session keeps a prefix of its records, whatever byte the damage
    is at; each prefix, with its closers, continues with an accepted request (the store
    crash tests check the same at every byte offset, through the store)."""
    events = sample_session()
    checks = RequestCheck()
    for kept in range(len(events) + 1):
        repaired = events[:kept] + list(closers(events[:kept]))
        checks.log(SessionLog(repaired), f"repaired after {kept} records")
    assert checks.checked >= len(events) // 2


def test_W9_a_fork_at_every_position_makes_accepted_requests(tmp_path: Path) -> None:
    """W9, S17, L15: a fork of the sample session at every boundary the store allows, and a
    fork of the log at every position."""
    events = sample_session(open_tail=False)
    checks = RequestCheck()
    with JsonlStore(tmp_path, fsync=False) as store:
        store_events(store, "source", events)
        forked = 0
        for boundary in range(len(events)):
            try:
                child = store.fork("source", boundary, f"child-{boundary}")
            except OpenTurnError:
                continue
            checks.log(SessionLog(store.load(child).events), f"fork at {boundary}")
            forked += 1
    assert forked >= 5              # S17 refuses a boundary inside a turn
    log = SessionLog(sample_session())
    for position in range(len(log) + 1):
        mark = SessionLog(list(log.events)[:position]).mark()
        checks.log(SessionLog(list(log.events)[:position]).fork(mark), f"log fork at {position}")


def _compactable_logs() -> Iterator[SessionLog]:
    """Logs with an open turn (compaction runs inside one, S20) at every position of a
    session of three turns with calls, results, steering and context."""
    b = LogBuilder()
    b.user("ctx", plugin="p")
    for turn in (1, 2, 3):
        b.turn(turn)
        b.user(f"question {turn}")
        b.step(turn, 1)
        b.header("initial" if turn == 1 else "resume")
        b.assistant(turn, 1, "looking", calls=[f"c{turn}a", f"c{turn}b"])
        first = b.call(turn, 1, f"c{turn}a")
        b.result(turn, 1, f"c{turn}a", first.seq)
        second = b.call(turn, 1, f"c{turn}b")
        b.result(turn, 1, f"c{turn}b", second.seq)
        b.user("context", plugin="p")
        b.step_end(turn, 1)
        b.step(turn, 2)
        b.steering(turn, "shorter")
        b.assistant(turn, 2, f"answer {turn}")
        b.step_end(turn, 2)
        b.end(turn)
    events = b.events
    for position in range(1, len(events) + 1):
        log = SessionLog(events[:position])
        if log.open_turn is not None:
            yield log


def test_W9_every_compaction_makes_accepted_requests() -> None:
    """W9, S19–S21: at every position inside a turn, each range the chooser picks for every
    tail kept, compacted, continues with an accepted request."""
    checks = RequestCheck()
    compactions = 0
    for log in _compactable_logs():
        for keep_tail in range(0, 6):
            chosen = choose_compaction_range(log, keep_tail)
            if chosen is None:
                continue
            copy = log.fork()
            compact(copy, *chosen, checkpoint_message(f"summary-{compactions}", "so far"))
            checks.log(copy, f"compacted {chosen} keeping {keep_tail}")
            compactions += 1
    assert compactions >= 30


# --------------------------------------------------------------------------
# Resume after kill -9, through the real adapters
# --------------------------------------------------------------------------

CHILD = """
import asyncio, sys
from machine.runtime import Agent, Tool
from machine.runtime.sink import PersistentSession
from machine.store import JsonlStore

dialect, base_url, root = sys.argv[1], sys.argv[2], sys.argv[3]
if dialect == "chat":
    from machine.runtime.adapters.openai import OpenAIChat
    model = OpenAIChat("m", base_url=base_url, api_key="k")
else:
    from machine.runtime.adapters.anthropic import AnthropicMessages
    model = AnthropicMessages("m", base_url=base_url, api_key="k")

async def fast(call):
    return "fast result"

async def slow(call):
    print("slow started", flush=True)
    await asyncio.sleep(3600)
    return "never"

async def main():
    store = JsonlStore(root)
    store.create("s")
    tools = [Tool("fast", fast, "exclusive", "Fast.", {"type": "object"}),
             Tool("slow", slow, "exclusive", "Slow.", {"type": "object"})]
    async with Agent(model, tools=tools, sink=PersistentSession(store, "s")) as agent:
        agent.followup("do the work")
        await agent.when_idle()

asyncio.run(main())
"""

#: case -> the calls of the first reply (id, tool), whether the second reply is held mid-stream
CASES: dict[str, tuple[tuple[tuple[str, str], ...], bool]] = {
    "no-result": ((("k1", "slow"), ("k2", "fast")), False),
    "some-results": ((("k1", "fast"), ("k2", "slow"), ("k3", "fast")), False),
    "all-results": ((("k1", "fast"), ("k2", "fast")), True),
    "mid-stream": ((("k1", "fast"),), True),
}


def _replies(dialect: str, calls: tuple[tuple[str, str], ...], held: bool) -> list[Reply]:
    if dialect == "chat":
        first = openai_tool_calls(*((i, name, "{}") for i, name in calls))
        second = openai_text("partial answer that is cut", pieces=4)
    else:
        first = anthropic_tool_calls(*((i, name, "{}") for i, name in calls))
        second = anthropic_text("partial answer that is cut", pieces=4)
    # all-results: held before its first event; mid-stream: after some text (the Messages
    # stream's text starts at its third event)
    mid = 2 if dialect == "chat" else 4
    return [first, second.but(hold_at=mid if calls == (("k1", "fast"),) else 0)] if held \
        else [first]


def _wait(predicate: Callable[[], bool], what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dialect", ["chat", "messages"])
def test_W9_S12_RT17_resume_after_kill_9_sends_an_accepted_request(
        tmp_path: Path, dialect: str, case: str) -> None:
    """W9: a process running an agent over the real SDK is killed (SIGKILL) inside a tool
    batch with no result, some or all results logged, or in the middle of the next stream;
    the session is resumed through the same adapter, and the first request after the
    resume is accepted by the refusing fake server (W8) and answered."""
    calls, held = CASES[case]
    with FakeServer.start_in_thread(_replies(dialect, calls, held)) as server:
        url = server.openai_base_url if dialect == "chat" else server.base_url
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        child = subprocess.Popen([sys.executable, "-c", CHILD, dialect, url, str(tmp_path)],
                                 env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
        try:
            assert child.stdout is not None
            if held:
                _wait(lambda: len(server.requests) >= 2, "the request after the batch")
                if case == "mid-stream":
                    _wait(lambda: _chunks_logged(tmp_path) >= 1, "streamed chunks")
            else:
                line = child.stdout.readline()
                assert line.strip() == "slow started", child.stderr.read() if child.stderr else ""
                if case == "some-results":
                    _wait(lambda: _results_logged(tmp_path) >= 1, "the first result")
        finally:
            child.kill()
            child.wait(timeout=60)
            server.release()
        assert server.refusals == []
        before = len(server.requests)
        server.add(openai_text("resumed fine") if dialect == "chat"
                   else anthropic_text("resumed fine"))
        events = asyncio.run(_resume(tmp_path, dialect, url))
        assert server.refusals == [], server.refusals
        assert len(server.requests) == before + 1
    reasons = [TurnEndData.from_data(e.data).reason.kind for e in events if e.type == "turn/end"]
    assert reasons[-2:] == ["interrupted", "completed"], reasons
    assert any(e.type == "assistant/message" and "resumed fine" in str(e.data)
               for e in events)
    results = [e for e in events if e.type == "tool/result"]
    assert len(results) >= len(calls)       # every call answered: logged or repaired


def _session_lines(root: Path) -> list[str]:
    path = root / "s.jsonl"
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _results_logged(root: Path) -> int:
    return sum('"tool/result"' in line for line in _session_lines(root))


def _chunks_logged(root: Path) -> int:
    return sum('"assistant/chunk"' in line and '"text"' in line and "partial" in line
               for line in _session_lines(root))


async def _resume(root: Path, dialect: str, url: str) -> list[Event]:
    model: ModelAdapter = (OpenAIChat("m", base_url=url, api_key="k") if dialect == "chat"
                           else AnthropicMessages("m", base_url=url, api_key="k"))
    store = JsonlStore(root)
    agent = Agent.resume(store, "s", model, mode="salvage")
    async with agent:
        checks = RequestCheck()
        checks.log(agent.session, "resumed")
        agent.followup("carry on")
        await agent.when_idle(timeout=60)
        return list(agent.session.events)


def test_W9_a_request_check_names_the_rule_and_the_position() -> None:
    """W9: what `RequestCheck` raises for a body an adapter would send (here a header whose
    tool schema no provider takes: a caller's configuration, W11)."""
    header = FrozenDict({"config": {"provider": "p", "model": "m"},
                         "tools": [{"name": "t", "parameters": {"type": "array"}}]})
    with pytest.raises(ProviderRuleError) as raised:
        RequestCheck().request(header, [], "a request")
    assert raised.value.code == "PROVIDER_REFUSAL"
    text = str(raised.value)
    assert "[R20.5] a request" in text and "[W4.6] tools[0].function.parameters" in text
    assert "[W5.8] tools.0.input_schema" in text
