"""Regenerate the example session logs of ``specs/examples`` (specs/log.md).

    python -m machine.conformance.corpus.examples            # (re)write them
    python -m machine.conformance.corpus.examples --check    # exit 1 if any is stale

The valid log is built through `SessionLog` itself, so it passes the checks by
construction; the broken ones are a valid prefix plus the damage written by
hand below. Times are fixed (1764489600000 + seq) so the files are stable.
The other files of ``specs/examples`` (the ``.json`` example scripts) are written by hand.
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

from machine.log import SessionLog
from machine.specfiles import spec_root
from machine.vocabulary import Message, tool_result_block, user_message

__all__ = ["examples", "examples_folder", "main"]

EPOCH_MS = 1764489600000
MODEL_SOURCE = {"kind": "model", "provider": "demo", "model": "demo-1"}
HEADER: dict[str, Any] = {"config": {"provider": "demo", "model": "demo-1", "maxTokens": 1024},
          "system": "You are a careful assistant.",
          "tools": [{"name": "ls"}, {"name": "read"}]}


def new_log() -> SessionLog:
    return SessionLog(clock=(EPOCH_MS + n for n in itertools.count()).__next__)


def model_reply(log: SessionLog, turn: int, step: int, chunks: list[dict[str, Any]],
                content: list[dict[str, Any]], reply_id: str) -> None:
    """The chunks of one model call, then its assistant/message citing them."""
    seqs = [log.append("assistant/chunk", {"turn": turn, "step": step, "chunk": chunk}).seq
            for chunk in chunks]
    usage = log.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {
        "type": "usage", "usage": {"inputTokens": 40, "outputTokens": 9}}})
    finish = log.append("assistant/chunk", {"turn": turn, "step": step, "chunk": {
        "type": "finish", "kind": "stop"}})
    message = Message.from_json({"id": reply_id, "role": "assistant", "content": content,
                                 "source": MODEL_SOURCE})
    log.append("assistant/message", {"turn": turn, "step": step, "message": message,
                                     "usage": {"inputTokens": 40, "outputTokens": 9}},
               surface_op="append", source_event_seqs=[*seqs, usage.seq, finish.seq])


def tool_round(log: SessionLog, turn: int, step: int, call_id: str, name: str,
               output: str) -> None:
    """A tool/call and its tool/result, the result citing the call."""
    call = log.append("tool/call", {"turn": turn, "step": step, "callId": call_id,
                                    "name": name, "arguments": "{}"})
    block = tool_result_block(call_id, [{"type": "text", "text": output}])
    result = Message.from_json({"id": f"result-{call_id}", "role": "user", "content": [block],
                                "source": {"kind": "tool", "callId": call_id}})
    log.append("tool/result", {"turn": turn, "step": step, "message": result},
               surface_op="append", source_event_seqs=[call.seq])


def tool_turn(log: SessionLog, turn: int, prompt: str, call_id: str, tool: str, output: str,
              answer: str, *, reason: str) -> None:
    """One prompt turn: a step that calls a tool, then a step that answers.

    *reason* is the request/header reason; 'change' logs a header with a
    larger maxTokens, as a request extension might produce.
    """
    log.append("turn/start", {"turn": turn, "trigger": {"kind": "message",
                                                        "source": {"kind": "user"}}})
    log.append("user/message", user_message(f"prompt-{turn}", prompt), surface_op="append")
    log.append("step/start", {"turn": turn, "step": 1})
    header = HEADER if reason == "initial" else {**HEADER, "config": {**HEADER["config"],
                                                                      "maxTokens": 2048}}
    log.append("request/header", {"header": header, "reason": reason})
    call = {"type": "tool-call", "id": call_id, "name": tool, "arguments": "{}"}
    model_reply(log, turn, 1, [call], [call], f"reply-{turn}-1")
    tool_round(log, turn, 1, call_id, tool, output)
    log.append("step/end", {"turn": turn, "step": 1})
    log.append("step/start", {"turn": turn, "step": 2})
    model_reply(log, turn, 2, [{"type": "text", "text": answer}],
                [{"type": "text", "text": answer}], f"reply-{turn}-2")
    log.append("step/end", {"turn": turn, "step": 2})
    log.append("turn/end", {"turn": turn, "reason": {"kind": "completed"}})


def multi_turn_with_injection() -> SessionLog:
    log = new_log()
    tool_turn(log, 1, "What is in this folder?", "call-1", "ls", "notes.txt todo.txt",
              "Two files: notes.txt and todo.txt.", reason="initial")
    # An idle inject from a plugin: ordinary history between the turns (§21.3).
    log.append("user/message", user_message(
        "watch-1", "notes.txt changed on disk", {"kind": "plugin", "plugin": "file-watcher"}),
        surface_op="append")
    # The request extension raised maxTokens, so turn 2 logs a changed header.
    tool_turn(log, 2, "Summarise notes.txt", "call-2", "read", "buy milk; call Ada",
              "The notes say: buy milk and call Ada.", reason="change")
    return log


def lines_of(log: SessionLog) -> list[str]:
    return [json.dumps(event.to_json(), separators=(",", ":")) for event in log.events]


def examples() -> dict[str, str]:
    """The generated example logs: file name -> text."""
    valid = lines_of(multi_turn_with_injection())

    # A chunk that arrives after turn 1 ended: execution between turns (L6).
    first_turn = new_log()
    tool_turn(first_turn, 1, "What is in this folder?", "call-1", "ls", "notes.txt",
              "One file: notes.txt.", reason="initial")
    late_chunk = {"type": "assistant/chunk", "seq": len(first_turn),
                  "time": EPOCH_MS + len(first_turn),
                  "data": {"turn": 1, "step": 2, "chunk": {"type": "text", "text": "!"}}}
    bad = [*lines_of(first_turn), json.dumps(late_chunk, separators=(",", ":"))]

    # A write interrupted mid-record: the final line is cut short, no newline.
    torn = valid[:5]
    torn.append(valid[5][: len(valid[5]) // 2])
    return {"multi-turn-with-injection.jsonl": "\n".join(valid) + "\n",
            "enclosure-violation.jsonl": "\n".join(bad) + "\n",
            "torn-line.jsonl": "\n".join(torn)}


def examples_folder() -> Path:
    """``examples`` of the spec folder (``specs/examples`` of a checkout)."""
    root = spec_root()
    if root is None:
        raise SystemExit("no spec folder found (specs/ of a checkout, or machine/_specs)")
    return root / "examples"


def main(argv: list[str]) -> int:
    check = "--check" in argv
    folder = examples_folder()
    stale: list[str] = []
    texts = examples()
    for name, text in texts.items():
        path = folder / name
        if not path.exists() or path.read_bytes() != text.encode("utf-8"):
            stale.append(name)
            if not check:
                path.write_bytes(text.encode("utf-8"))
    verb = "stale" if check else "written"
    print(f"{len(texts)} example logs, {len(stale)} {verb}{': ' + ', '.join(stale) if stale else ''}")
    return 1 if check and stale else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
