"""``turnstile demo``: four scenes, each without and with turnstile, through the runtime; then
the session log's check and the corpus replayed through the runtime."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from machine.cli.main import main
from machine.runtime.demo import _Said, chat_refusal, run_demo

SCENES = ("1. The user types while a tool runs", "2. Messages that arrive as a turn ends",
          "3. A cancel in the middle of an answer", "4. A blocked prompt")


def test_the_demo_tells_each_scene_without_and_with_turnstile_in_plain_words(
        tmp_path: Path) -> None:
    out = io.StringIO()
    assert run_demo(out, colour=False, root=tmp_path) == 0
    text = out.getvalue()
    for title in SCENES:
        assert title in text
    assert "\033[" not in text
    assert text.count("Without turnstile:") == 4 and text.count("With turnstile:") == 4
    assert text.count("  ✓ ") == 4                        # every scene holds with turnstile
    # the story is told without rule numbers or the core's internal words
    assert re.search(r"\b(R\d+(\.\d+)?|D\d+|L\d+|P\d+|RT\d+)\b", text) is None, text
    for internal in ("wake tick", "signal id", "ctl ", "window", "outbox", "flush"):
        assert internal not in text, internal
    # 1: the naive order is refused as a provider refuses it; turnstile's is not
    assert ("refused by the provider (HTTP 400): An assistant message with 'tool_calls' must "
            "be followed by tool messages responding to each 'tool_call_id'. The following "
            "tool_call_ids did not have response messages: call-1") in text
    scene_1 = text[text.index(SCENES[0]):text.index(SCENES[1])]
    with_1 = scene_1[scene_1.index("With turnstile"):]
    assert with_1.index("result of call-1") < with_1.index("'use staging.toml instead'")
    # 2: the plugin's report and the late line are both in the log, after the turn's end
    assert "'tests passed (42 of 42)'  [plugin:ci]" in text and "'and deploy it'  [user]" in text
    # 3: the request after the cancel carries what the user saw
    scene_3 = text[text.index(SCENES[2]):text.index(SCENES[3])]
    assert "assistant  'Once upon a time, a fox found a key'" in scene_3
    # 4: the blocked command never reaches the log
    scene_4 = text[text.index(SCENES[3]):]
    assert "'cwd is /srv/app'  [plugin:shell]" in scene_4 and "user/message        'rm" not in text
    assert "every session rule holds" in text
    assert "no conformance vectors under" in text          # no corpus here: skipped, not failed


def test_the_demo_asks_the_providers_rules() -> None:
    """The demo's verdicts are machine.providers' rules over the messages it shows."""
    call = _Said("assistant", "reading", ("c1", "c2"))
    result_1, result_2 = _Said("tool", "r1", answers="c1"), _Said("tool", "r2", answers="c2")
    user = _Said("user", "hi")
    assert chat_refusal([user, call, result_2, result_1, user]) is None
    refused = chat_refusal([user, call, result_1, user, result_2])
    assert refused is not None and "did not have response messages: c2" in refused
    assert chat_refusal([user, _Said("assistant", "hello"), user]) is None


def test_turnstile_demo_replays_the_corpus_in_colour_on_request(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--color"]) == 0
    text = capsys.readouterr().out
    assert "\033[" in text
    assert "vectors give exactly the core's outputs" in text or "no conformance vectors" in text
