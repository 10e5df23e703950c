"""How the runtime reports environment exceptions to the core (specs/runtime.md RT9).

Every exception raised by a hook, the model, a tool stage or the store
becomes the effect's raised error, described as data by `error_info`:

* `RaisedError` carries an exact `ErrorInfo`, reported as is;
* any other exception is described by `ErrorInfo.from_exception` (class name,
  message, ``code`` if it has one, the ``__cause__`` chain and, if it carries
  ``failure: LlmFailure``, the failure facts that make it a *model failure*).

`ModelFailure` is the ready-made model failure for adapters.
"""

from __future__ import annotations

from machine.vocabulary import ErrorInfo, LlmFailure

__all__ = ["ModelFailure", "RaisedError", "error_info"]


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
