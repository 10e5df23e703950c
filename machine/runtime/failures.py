"""How the runtime reports environment exceptions to the core (specs/runtime.md RT9).

Every exception raised by a hook, the model, a tool stage or the store
becomes the effect's raised error, described as data by `error_info`:

* `RaisedError` carries an exact `ErrorInfo`, reported as is;
* any other exception is described by `ErrorInfo.from_exception` (class name,
  message, ``code`` if it has one, the ``__cause__`` chain and, if it carries
  ``failure: LlmFailure``, the failure facts that make it a *model failure*).

`ModelFailure` is the ready-made model failure for adapters.

Exceptions that are not `Exception`s (specs/runtime.md RT18): the work's
``KeyboardInterrupt`` and ``SystemExit`` (`EXITS`) fail its effect and then
propagate; a cancellation of the work's task from outside fails the effect with
`CANCELLED` and propagates; every other ``BaseException`` is contained like an
``Exception``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from machine.errors import EXITS, TurnstileError
from machine.vocabulary import ErrorInfo, LlmFailure

__all__ = ["CANCELLED", "EXITS", "AgentTimeoutError", "ModelFailure", "RaisedError",
           "error_info"]

#: EXITS (machine.errors): the exceptions that leave the runtime after it has recorded them
#: (RT18).

#: The error of an effect whose task was cancelled from outside (RT18).
CANCELLED: Final = ErrorInfo("the work's task was cancelled", "CancelledError", "CANCELLED")


class AgentTimeoutError(TurnstileError, TimeoutError):
    """A bounded wait of the runtime (`Agent.when_idle`, `Agent.dispose`) ran out (RT19).

    ``pending`` describes the work still outstanding, e.g. ``"tool-execute 12 (read)"``."""

    code = "AGENT_TIMEOUT"

    def __init__(self, message: str, pending: Sequence[str]) -> None:
        self.pending = tuple(pending)
        detail = ", ".join(self.pending) if self.pending else "nothing outstanding"
        super().__init__(f"{message} (outstanding: {detail})")


class RaisedError(Exception):
    """An exception that reports exactly *info* to the core (its name, message, code and
    causes, rather than those `ErrorInfo.from_exception` derives)."""

    def __init__(self, info: ErrorInfo) -> None:
        super().__init__(info.rendered())
        self.info = info


class ModelFailure(Exception):
    """A failed model request: carries `LlmFailure` facts (rule V14), so the loop treats it as a
    request failure (request-error point, retry, ``turn/end {kind:'error', failure}``)."""

    def __init__(self, message: str, code: str, *, status: int | None = None,
                 retry_after_ms: int | float | None = None, request_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.failure = LlmFailure(message, code, status, retry_after_ms, request_id)


def error_info(exc: BaseException) -> ErrorInfo:
    """The data form of an environment exception (see the module docstring)."""
    if isinstance(exc, RaisedError):
        return exc.info
    return ErrorInfo.from_exception(exc)
