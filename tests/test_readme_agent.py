"""The README's examples that need a model server run against the fake server (specs/runtime.md
RT15): every ```python block after a ``<!-- readme: not run (needs an OpenAI-compatible server...``
marker (the README runner skips those blocks; this test runs them)."""

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


def test_RT15_the_readme_agent_runs_against_the_fake_server_and_resumes(tmp_path: Path) -> None:
    blocks = server_blocks()
    assert len(blocks) == 1
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
