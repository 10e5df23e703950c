"""The core's static configuration (rule P11)."""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

from machine.errors import (
    ValidationError,
)
from machine.jsonvalue import (
    FrozenDict,
    JsonLike,
    freeze,
)

ToolMode: TypeAlias = Literal["exclusive", "parallel"]


def _unset(value: object) -> bool:
    """R9.6: a provider or model the original counts as missing (absent, null, false, 0, '')."""
    return value is None or value is False or value == "" or (
        type(value) in (int, float) and value == 0)


@dataclass(frozen=True, slots=True)
class CoreConfig:
    """Static configuration of one core (rule P11).

    ``request_options`` seeds this instance's first request (R9.6).
    ``tool_modes`` classifies each tool by name (unknown names are exclusive).
    ``session_start`` is reported by ``agent/session-start`` at publication.
    """

    request_options: Mapping[str, JsonLike] = field(default_factory=dict)
    tool_modes: Mapping[str, ToolMode] = field(default_factory=dict)
    max_parallel_tool_calls: int = 10
    session_start: Literal["startup", "resume"] = "startup"
    publish: bool = True

    def __post_init__(self) -> None:
        options = freeze(self.request_options, "config.request_options")
        if not isinstance(options, FrozenDict):
            raise ValidationError("config.request_options", "must be a mapping")
        object.__setattr__(self, "request_options", options)
        if not isinstance(self.tool_modes, Mapping):
            raise ValidationError("config.tool_modes", "must be a mapping of tool name to mode")
        for name, mode in self.tool_modes.items():
            if not isinstance(name, str) or mode not in ("exclusive", "parallel"):
                raise ValidationError(f"config.tool_modes.{name}",
                                      "must map a tool name to 'exclusive' or 'parallel'")
        object.__setattr__(self, "tool_modes", dict(self.tool_modes))
        limit = self.max_parallel_tool_calls
        if type(limit) is not int or limit < 1:
            raise ValidationError("config.max_parallel_tool_calls", "must be an integer >= 1")
        if self.session_start not in ("startup", "resume"):
            raise ValidationError("config.session_start", "must be 'startup' or 'resume'")
        if not isinstance(self.publish, bool):
            raise ValidationError("config.publish", "must be a bool")
