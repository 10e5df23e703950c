"""turnstile's reference runtime: an asyncio `Agent` over the sans-I/O core.

The runtime adds I/O and no semantics: it delivers the core's outputs to
listeners synchronously, runs hooks, the model and tools as asyncio tasks, and
feeds their results back (specs/runtime.md, rules RT1-RT14).

::

    from machine.runtime import Agent, ScriptedModel, text_reply

    async with Agent(ScriptedModel([text_reply("hello")])) as agent:
        agent.followup("hi")
        await agent.when_idle()
"""

from machine.runtime.agent import ALL_EVENTS, Agent, DurableEventType, LiveEventType, MessageLike
from machine.runtime.failures import ModelFailure, RaisedError, error_info
from machine.runtime.hooks import (
    RETRY,
    Hooks,
    JsonValue,
    Next,
    PromptSubmit,
    RequestContext,
    RequestErrorContext,
    RetryAction,
    Serial,
    StepContext,
    TurnStopping,
    Unsubscribe,
    Waterfall,
)
from machine.runtime.model import (
    Chunk,
    Hang,
    ModelAdapter,
    ModelCall,
    Reply,
    RequestDraft,
    RequestPreparer,
    ScriptedModel,
    calls_reply,
    default_header,
    text_reply,
)
from machine.runtime.signal import AbortError, Signal
from machine.runtime.store import InMemorySessionStore, PersistentSession, SessionStore
from machine.runtime.tools import Tool, ToolCall, ToolMode, ToolOutput, ToolRegistry, tool
from machine.vocabulary import (
    ALLOW,
    Allow,
    Block,
    CancelCause,
    ErrorInfo,
    LlmFailure,
    Message,
    PromptDecision,
    ToolResult,
    user_message,
)

__all__ = [
    "ALLOW",
    "ALL_EVENTS",
    "RETRY",
    "AbortError",
    "Agent",
    "Allow",
    "Block",
    "CancelCause",
    "Chunk",
    "DurableEventType",
    "ErrorInfo",
    "Hang",
    "Hooks",
    "InMemorySessionStore",
    "JsonValue",
    "LiveEventType",
    "LlmFailure",
    "Message",
    "MessageLike",
    "ModelAdapter",
    "ModelCall",
    "ModelFailure",
    "Next",
    "PersistentSession",
    "PromptDecision",
    "PromptSubmit",
    "RaisedError",
    "Reply",
    "RequestContext",
    "RequestDraft",
    "RequestErrorContext",
    "RequestPreparer",
    "RetryAction",
    "ScriptedModel",
    "Serial",
    "SessionStore",
    "Signal",
    "StepContext",
    "Tool",
    "ToolCall",
    "ToolMode",
    "ToolOutput",
    "ToolRegistry",
    "ToolResult",
    "TurnStopping",
    "Unsubscribe",
    "Waterfall",
    "calls_reply",
    "default_header",
    "error_info",
    "text_reply",
    "tool",
    "user_message",
]
