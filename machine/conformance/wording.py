"""Implementation-worded fields of outputs (specs/conformance/PROTOCOL.md §Comparison).

The spec fixes the names and codes of the errors the core builds itself
(R15.4: ``InvalidChunkError``/``INVALID_CHUNK``, ``InvalidToolResultError``/
``INVALID_TOOL_RESULT``, ``RequestConfigError``/``INVALID_REQUEST_CONFIG``,
``InvalidSystemPrompt``/``INVALID_SYSTEM_PROMPT``) and the prefix of the
invalid-decision warning (R0.8, R7.11), but not the human text that says
what is wrong. The same goes for the one uncoded error the core builds, a
request config without provider or model (R9.6, named ``Error`` as in the
original, whose text names the agent), and the text of the log's refusal of an
append (code ``INVARIANT``, P16 case 3): each implementation words its own
invariants. `loose_fields` finds those texts in an
output, so that a vector (or a trace check) compares them by prefix only.
Everything else an output carries is compared exactly.
"""

from __future__ import annotations

from typing import Any, Final

from machine.conformance.jsoncmp import Path
from machine.core.records import NO_ROUTE_MESSAGE

__all__ = ["INVALID_DECISION_PREFIX", "LOG_REFUSAL_CODES", "SYNTHESISED_CODES", "loose_fields"]

#: Codes of the errors the core builds, whose message the implementation words (R15.4).
SYNTHESISED_CODES: Final = frozenset({
    "INVALID_CHUNK", "INVALID_TOOL_RESULT", "INVALID_REQUEST_CONFIG", "INVALID_SYSTEM_PROMPT",
})
#: Codes of the log's refusals (L2; reported by P16 case 3), worded by the implementation.
LOG_REFUSAL_CODES: Final = frozenset({"INVARIANT"})
#: Messages of uncoded errors the core builds (R9.6), worded by the implementation.
WORDED_MESSAGES: Final = frozenset({NO_ROUTE_MESSAGE})
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
        message = value.get("message")
        if isinstance(message, str) and (code in SYNTHESISED_CODES or code in LOG_REFUSAL_CODES
                                         or message in WORDED_MESSAGES):
            loose[(*path, "message")] = ""
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                _walk(item, (*path, key), loose)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            if isinstance(item, (dict, list)):
                _walk(item, (*path, index), loose)
