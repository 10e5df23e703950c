"""turnstile: the formally checked state-machine core of an agent loop.

``machine`` is the library: a deterministic sans-I/O `AgentCore` over four
explicit state machines (inbox, acceptance window, turn lifecycle, outbox),
the message vocabulary, and the session log. See ``specs/`` for the rules.
"""

from machine.core import AgentCore, CoreConfig
from machine.errors import (
    CodecError,
    CoreFailedError,
    DisposedError,
    InvariantError,
    NotJsonCompatibleError,
    ProtocolError,
    TurnstileError,
    ValidationError,
)
from machine.events import Event, LiveEvent
from machine.io import Control, Durable, Effect, Live, Output
from machine.log import SessionLog
from machine.vocabulary import (
    FOLLOWUP,
    INJECT,
    STEER,
    CancelCause,
    ErrorInfo,
    LlmFailure,
    Message,
    SendOptions,
    ToolResult,
    plugin_source,
    user_message,
)

__all__ = [
    "FOLLOWUP", "INJECT", "STEER", "AgentCore", "CancelCause", "CodecError", "Control",
    "CoreConfig", "CoreFailedError", "DisposedError", "Durable", "Effect", "ErrorInfo", "Event",
    "InvariantError", "Live", "LiveEvent", "LlmFailure", "Message", "NotJsonCompatibleError",
    "Output", "ProtocolError", "SendOptions", "SessionLog", "ToolResult", "TurnstileError",
    "ValidationError", "plugin_source", "user_message",
]
