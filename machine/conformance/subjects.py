"""Implementations under test: this one in process (`LocalSubject`), or a port (`machine.conformance.port`).

A *subject* starts a fresh core for a vector (its configuration and seeded
log), applies inputs (reporting how an input was refused, if it was) and
returns outputs one pull at a time, ``None`` meaning "no output now".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from machine.conformance.vectors import COMPLETIONS, config_from_json, seed_events
from machine.core import AgentCore
from machine.errors import (
    CodecError,
    DisposedError,
    InvariantError,
    ProtocolError,
    ValidationError,
)
from machine.io import Durable, input_from_json
from machine.log import SessionLog

__all__ = ["LocalSubject", "Subject", "fake_clock", "raise_kind"]


class Subject(Protocol):
    """An implementation driven through the conformance steps."""

    name: str

    def start(self, vector_id: str, config: Mapping[str, Any],
              seed: Sequence[Mapping[str, Any]]) -> None:
        """Discard any previous core and start a fresh one."""

    def feed(self, value: dict[str, Any]) -> tuple[str, str] | None:
        """Apply one input (P9 JSON); None if accepted, else (raise kind, message)."""

    def pull(self, count: int) -> list[dict[str, Any] | None]:
        """Pull up to *count* outputs; the list ends early with None when there are no more."""

    def close(self) -> None:
        """Release the subject's resources."""


def fake_clock() -> float:
    """The clock of conformance runs: time is not compared, so it is always 0."""
    return 0


def raise_kind(error: Exception, *, completion: bool) -> str | None:
    """How the core refused an input, as a vector names it (None: not a refusal)."""
    if isinstance(error, CodecError):
        # A completion that does not decode is a protocol error (P10); a command whose
        # arguments do not decode is a validation error (P3).
        return "protocol" if completion else "validation"
    if isinstance(error, ValidationError):
        return "validation"
    if isinstance(error, ProtocolError):
        return "protocol"
    if isinstance(error, DisposedError):
        return "disposed"
    if isinstance(error, InvariantError):
        return "invariant"
    return None


class LocalSubject:
    """This implementation (`machine.core.AgentCore`), in process."""

    name = "turnstile"

    def __init__(self) -> None:
        self.core = AgentCore()

    def start(self, vector_id: str, config: Mapping[str, Any],
              seed: Sequence[Mapping[str, Any]]) -> None:
        log = SessionLog(seed_events(seed), clock=fake_clock)
        self.core = AgentCore(config_from_json(config), log=log)

    def feed(self, value: dict[str, Any]) -> tuple[str, str] | None:
        completion = value.get("in") in COMPLETIONS
        try:
            self.core.feed(input_from_json(value))
        except (ValidationError, ProtocolError, DisposedError, InvariantError) as error:
            kind = raise_kind(error, completion=completion)
            assert kind is not None
            return kind, str(error)
        return None

    def pull(self, count: int) -> list[dict[str, Any] | None]:
        outputs: list[dict[str, Any] | None] = []
        next_output = self.core.next_output
        for _ in range(count):
            output = next_output()
            if output is None:
                outputs.append(None)
                break
            outputs.append(output.to_json() if not isinstance(output, Durable)
                           else output.to_json(with_time=False))
        return outputs

    def close(self) -> None:
        pass
