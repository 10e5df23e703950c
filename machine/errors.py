"""The project's exception hierarchy (spec rule V9).

Every error the library raises derives from `TurnstileError`, carries a
string `code`, and names what is wrong in its message. Validation errors are
also `ValueError`s, as the reference semantics require (§5.1 there).
"""

from __future__ import annotations

import pickle
from typing import Final


class TurnstileError(Exception):
    """Base class: a coded error (rule V9)."""

    code: str = "TURNSTILE_ERROR"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code


class ValidationError(TurnstileError, ValueError):
    """A malformed value: names the offending field path and the problem (rule V8)."""

    code = "INVALID_VALUE"

    def __init__(self, path: str, problem: str, *, code: str | None = None) -> None:
        self.path = path
        self.problem = problem
        super().__init__(f"{path}: {problem}" if path else problem, code=code)


class NotJsonCompatibleError(ValidationError):
    """A value does not survive a JSON round trip (rule V1)."""

    code = "NOT_JSON_COMPATIBLE"


class InvariantError(TurnstileError):
    """An append would break a session invariant; nothing was appended (rule L2)."""

    code = "INVARIANT"

    def __init__(self, rule: str, message: str) -> None:
        self.rule = rule
        super().__init__(f"[{rule}] {message}")


class ProtocolError(TurnstileError):
    """An input the core cannot accept in its current state (rule C10).

    Raised for a completion of an effect that was never requested, was
    already completed, or is of the wrong shape; the core state is unchanged.
    """

    code = "PROTOCOL_ERROR"


class DisposedError(TurnstileError):
    """A command issued after teardown completed (rule R17.3)."""

    code = "AGENT_DISPOSED"


class NotPicklableError(TurnstileError, pickle.PicklingError):
    """A value pickled with a part that cannot be (rule R4.12: a snapshot whose clock, id
    minting or log rule is a lambda or a local function); the message names the part and
    what to use instead."""

    code = "NOT_PICKLABLE"


class CodecError(ValidationError):
    """A JSON document that does not decode to the expected value."""

    code = "CODEC_ERROR"


#: P16, RT18: the exceptions that ask the process to stop. Raised by embedder code the core
#: calls, they stop the core cleanly first and then go on to the caller.
EXITS: Final = (KeyboardInterrupt, SystemExit)


class CoreFailedError(ProtocolError):
    """The core stopped after an internal failure it could not contain (rule P16): only
    `dispose()` and the read-only state are available."""

    code = "CORE_FAILED"
