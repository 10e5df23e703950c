"""The README's examples that need a model server run against the fake server (specs/runtime.md
RT15, RT21-RT24): every ```python block after a ``<!-- readme: not run (needs an
OpenAI-compatible server...`` marker (the README runner skips those blocks; these tests run
them): the opening agent (a typed tool, a structured result) and the resumed streaming agent."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from machine.runtime.adapters.fake_server import FakeServer, openai_text, openai_tool_calls

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- readme: not run (needs an OpenAI-compatible server"


def server_blocks() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    return re.findall(re.escape(MARKER) + r"[^\n]*-->\n```python\n(.*?)```", text, re.S)


def server_block(containing: str) -> str:
    (block,) = [block for block in server_blocks() if containing in block]
    return block


def test_RT21_RT22_RT23_the_readme_opening_agent_calls_its_typed_tool_and_returns_a_forecast(
        tmp_path: Path) -> None:
    block = server_block("output_type=Forecast")
    assert len([line for line in block.splitlines() if line.strip()]) <= 17
    with FakeServer.start_in_thread([
            openai_tool_calls(("call_1", "weather", '{"city": "Lyon"}')),
            openai_text('{"city": "Lyon", "high_c": 21.5, "summary": "Clear and mild"}',
                        pieces=3)]) as server:
        env = {**os.environ, "OPENAI_BASE_URL": server.openai_base_url,
               "OPENAI_API_KEY": "test", "PYTHONPATH": str(ROOT)}
        run = subprocess.run([sys.executable, "-c", block], cwd=tmp_path, env=env,
                             capture_output=True, text=True, timeout=120, check=False)
        assert run.returncode == 0, run.stderr
        assert run.stdout == ("city='Lyon' high_c=21.5 summary='Clear and mild' "
                              "(17 tokens, turn 1)\n")
        first, second = (request.json for request in server.requests)
        assert first["tools"][0]["function"]["parameters"] == {
            "additionalProperties": False, "type": "object", "required": ["city"],
            "properties": {"city": {"type": "string"}}}
        assert first["response_format"]["json_schema"]["strict"] is True
        assert second["messages"][-1] == {
            "role": "tool", "tool_call_id": "call_1",
            "content": '{"city":"Lyon","high_c":21.5,"sky":"clear"}'}


def test_RT15_the_readme_agent_runs_against_the_fake_server_and_resumes(tmp_path: Path) -> None:
    blocks = [server_block("read_file")]
    (tmp_path / "README.md").write_text("turnstile routes messages.\n", encoding="utf-8")
    with FakeServer.start_in_thread([
            openai_tool_calls(("c1", "read_file", '{"path": "README.md"}')),
            openai_text("It routes messages.", pieces=2), openai_text("Still the same.")]
            ) as server:
        env = {**os.environ, "BASE_URL": server.openai_base_url, "MODEL": "fake-model",
               "OPENAI_API_KEY": "test", "PYTHONPATH": str(ROOT)}
        runs = [subprocess.run([sys.executable, "-c", blocks[0]], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120, check=False)
                for _ in range(2)]
        for run in runs:
            assert run.returncode == 0, run.stderr
        assert "It routes messages." in runs[0].stdout
        assert "(the session is at turn 1)" in runs[0].stdout
        assert "Still the same." in runs[1].stdout
        assert "(the session is at turn 2)" in runs[1].stdout
        tool_result = server.requests[1].json["messages"][-1]
        assert tool_result == {"role": "tool", "tool_call_id": "c1",
                               "content": "turnstile routes messages.\n"}
        resumed = server.requests[2].json["messages"]
        assert resumed[0]["content"] == "What does README.md say? One sentence."
        assert resumed[-1] == resumed[0] and len(resumed) == 5   # after turn 1's history
    assert (tmp_path / "sessions" / "demo.jsonl").exists()
