"""``turnstile demo``: the narrated session through the runtime, then the corpus check."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from machine.cli import main
from machine.runtime.demo import run_demo

SECTIONS = ("1. Idle injection", "2. A blocked admission with retained steering",
            "3. Late steering from a turn/end observer", "4. A tool batch with contexts",
            "5. A cancel with keep_inbox")


def test_the_demo_narrates_every_moment_and_checks_the_log_plainly_when_piped(
        tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(out, colour=False, root=tmp_path) == 0
    text = out.getvalue()
    for title in SECTIONS:
        assert title in text
    assert "\033[" not in text
    assert "valid (rules L1-L14)" in text
    assert "no conformance vectors under" in text          # no corpus here: skipped, not failed
    assert "steering/message" in text and "reason aborted" in text
    assert "'then say goodbye'" in text


def test_turnstile_demo_replays_the_corpus_in_colour_on_request(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--color"]) == 0
    text = capsys.readouterr().out
    assert "\033[" in text
    assert "vectors give exactly the core's outputs" in text or "no conformance vectors" in text
