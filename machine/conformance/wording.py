"""Implementation-worded fields of outputs (specs/conformance/PROTOCOL.md §Comparison).

The spec fixes the *codes* of the failures the core synthesises itself
(``INVALID_CHUNK``, ``INVALID_TOOL_RESULT``, ``INVALID_REQUEST_CONFIG``,
``INVALID_SYSTEM_PROMPT``) and the prefix of the invalid-decision warning,
but not the human text that explains them, nor the class name the core gives
the error. `loose_fields` finds those fields in an output, so that a vector
(or a trace check) compares them by prefix only. Everything else an output
carries is compared exactly.
"""

from __future__ import annotations

from typing import Any, Final

from machine.conformance.jsoncmp import Path

__all__ = ["INVALID_DECISION_PREFIX", "SYNTHESISED_CODES", "loose_fields"]

#: Codes of failures whose message (and error name) the implementation words.
SYNTHESISED_CODES: Final = frozenset({
    "INVALID_CHUNK", "INVALID_TOOL_RESULT", "INVALID_REQUEST_CONFIG", "INVALID_SYSTEM_PROMPT",
})
#: The error name the core gives a failure it builds from an ``error``/``aborted`` finish chunk.
SYNTHESISED_NAMES: Final = frozenset({"ModelRequestError"})
#: R7.11: the warning text is this prefix followed by an implementation-worded problem.
INVALID_DECISION_PREFIX: Final = "prompt admission returned an invalid decision: "


def loose_fields(output: dict[str, Any]) -> dict[Path, str]:
    """The implementation-worded fields of one output JSON, with their required prefixes."""
    loose: dict[Path, str] = {}
    if output.get("out") == "live" and output.get("type") == "agent/warning":
        text = output.get("text")
        if isinstance(text, str) and text.startswith(INVALID_DECISION_PREFIX):
            loose[("text",)] = INVALID_DECISION_PREFIX
        return loose
    _walk(output, (), loose)
    return loose


def _walk(value: Any, path: Path, loose: dict[Path, str]) -> None:
    if isinstance(value, dict):
        code = value.get("code")
        if code in SYNTHESISED_CODES:
            if isinstance(value.get("message"), str):
                loose[(*path, "message")] = ""
            if isinstance(value.get("name"), str):
                loose[(*path, "name")] = ""
        elif value.get("name") in SYNTHESISED_NAMES and isinstance(value.get("message"), str):
            loose[(*path, "name")] = ""
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                _walk(item, (*path, key), loose)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, (dict, list)):
                _walk(item, (*path, index), loose)
