"""turnstile: the formally checked state-machine core of an agent loop.

``machine`` is the library: a deterministic sans-I/O `AgentCore` over four
explicit state machines (inbox, acceptance window, turn lifecycle, outbox),
the message vocabulary, and the session log. The rules are in the spec
(``specs/`` in the repository; shipped in the package, see `machine.specfiles`).
Installed from the distribution ``turnstile-agent``.
"""

#: The version of the distribution ``turnstile-agent`` (pyproject.toml reads it from here).
__version__ = "0.1.0"

from machine.core import AgentCore, CoreConfig
from machine.errors import (
    CoreFailedError,
    DisposedError,
    InvariantError,
    NotJsonCompatibleError,
    NotPicklableError,
    ProtocolError,
    TurnstileError,
    ValidationError,
)
from machine.events import Event, LiveEvent
from machine.io import Control, Durable, Effect, Live, Output
from machine.jsonvalue import FrozenDict, FrozenList, freeze, json_default, thaw
from machine.log import SessionLog
from machine.vocabulary import (
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
    "AgentCore", "CancelCause", "Control",
    "CoreConfig", "CoreFailedError", "DisposedError", "Durable", "Effect", "ErrorInfo", "Event", "FrozenDict",
    "FrozenList", "InvariantError", "Live", "LiveEvent", "LlmFailure", "Message",
    "NotJsonCompatibleError", "NotPicklableError", "Output", "ProtocolError", "SendOptions", "SessionLog",
    "ToolResult", "TurnstileError", "ValidationError", "__version__", "freeze", "json_default",
    "plugin_source", "thaw", "user_message",
]
