"""turnstile's reference runtime: an asyncio `Agent` over the sans-I/O core.

The runtime adds I/O and no semantics: it delivers the core's outputs to
listeners synchronously, runs hooks, the model and tools as asyncio tasks, and
feeds their results back (specs/runtime.md, rules RT1-RT29). Provider adapters are in
`machine.runtime.adapters` (extras ``[openai]``, ``[anthropic]``); typed tools and
structured output need ``[typed]`` (pydantic).

::

    from machine.runtime import Agent, ScriptedModel, text_reply

    async with Agent(ScriptedModel([text_reply("hello")])) as agent:
        result = await agent.run("hi")          # RT21: the prompt's outcome as a value
        print(result.outcome, result.output)
"""

from __future__ import annotations

import warnings

from machine.runtime.agent import (
    ALL_EVENTS,
    Agent,
    DurableEventType,
    LiveEventType,
    MessageLike,
    OutputMode,
)
from machine.runtime.approvals import Approval, ApprovalError
from machine.runtime.control import LimitExceededError, Limits, OutputInvalidError
from machine.runtime.failures import AgentTimeoutError, ModelFailure, RaisedError, error_info
from machine.runtime.fates import FateKind, MessageFate, Rejection, Route
from machine.runtime.hooks import (
    Hooks,
    JsonValue,
    Next,
    PromptSubmit,
    RequestContext,
    RequestErrorContext,
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
    StructuredOutput,
    calls_reply,
    default_header,
    text_reply,
)
from machine.runtime.retry import (
    RETRY,
    RETRYABLE_CODES,
    RetryAction,
    RetryPolicy,
    retry_request,
    sleep_unless_aborted,
)
from machine.runtime.run import (
    NoOutputError,
    OutputValidationError,
    RunEvent,
    RunOutcome,
    RunResult,
    RunStream,
    Sent,
    Usage,
)
from machine.runtime.signal import AbortError, Signal
from machine.runtime.sink import InMemorySink, PersistentSession, SessionSink
from machine.runtime.tools import (
    ApprovalPolicy,
    Tool,
    ToolArgumentError,
    ToolCall,
    ToolMode,
    ToolOutput,
    ToolRegistry,
    tool,
)
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
    "RETRYABLE_CODES",
    "AbortError",
    "Agent",
    "AgentTimeoutError",
    "Allow",
    "Approval",
    "ApprovalError",
    "ApprovalPolicy",
    "Block",
    "CancelCause",
    "Chunk",
    "DurableEventType",
    "ErrorInfo",
    "FateKind",
    "Hang",
    "Hooks",
    "InMemorySink",
    "JsonValue",
    "LimitExceededError",
    "Limits",
    "LiveEventType",
    "LlmFailure",
    "Message",
    "MessageFate",
    "MessageLike",
    "ModelAdapter",
    "ModelCall",
    "ModelFailure",
    "Next",
    "NoOutputError",
    "OutputInvalidError",
    "OutputMode",
    "OutputValidationError",
    "PersistentSession",
    "PromptDecision",
    "PromptSubmit",
    "RaisedError",
    "Rejection",
    "Reply",
    "RequestContext",
    "RequestDraft",
    "RequestErrorContext",
    "RequestPreparer",
    "RetryAction",
    "RetryPolicy",
    "Route",
    "RunEvent",
    "RunOutcome",
    "RunResult",
    "RunStream",
    "ScriptedModel",
    "Sent",
    "Serial",
    "SessionSink",
    "Signal",
    "StepContext",
    "StructuredOutput",
    "Tool",
    "ToolArgumentError",
    "ToolCall",
    "ToolMode",
    "ToolOutput",
    "ToolRegistry",
    "ToolResult",
    "TurnStopping",
    "Unsubscribe",
    "Usage",
    "Waterfall",
    "calls_reply",
    "default_header",
    "error_info",
    "retry_request",
    "sleep_unless_aborted",
    "text_reply",
    "tool",
    "user_message",
]

#: Names kept for one release: the runtime's sink used to be called a store, which clashed
#: with `machine.store.SessionStore` (a store of many sessions).
_DEPRECATED = {"SessionStore": ("SessionSink", SessionSink),
               "InMemorySessionStore": ("InMemorySink", InMemorySink)}


def __getattr__(name: str) -> object:
    if name in _DEPRECATED:
        new, value = _DEPRECATED[name]
        warnings.warn(f"machine.runtime.{name} is deprecated: use machine.runtime.{new}",
                      DeprecationWarning, stacklevel=2)
        return value
    raise AttributeError(f"module 'machine.runtime' has no attribute {name!r}")
