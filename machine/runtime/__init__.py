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

from machine.runtime.agent import (
    Agent,
    DurableEventType,
    LiveEventType,
    MessageLike,
    OutputMode,
)
from machine.runtime.approvals import Approval, ApprovalError
from machine.runtime.control import LimitExceededError, Limits, OutputInvalidError
from machine.runtime.failures import AgentTimeoutError, ModelFailure, RaisedError
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
    Waterfall,
)
from machine.runtime.model import (
    Chunk,
    Hang,
    ModelAdapter,
    ModelCall,
    Reply,
    RequestDraft,
    ScriptedModel,
    StructuredOutput,
    calls_reply,
    text_reply,
)
from machine.runtime.retry import (
    RETRY,
    RetryAction,
    RetryPolicy,
    retry_request,
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
    ToolOutput,
    ToolRegistry,
    tool,
)
from machine.vocabulary import (
    Allow,
    Block,
    PromptDecision,
    ToolResult,
    user_message,
)

__all__ = [
    "RETRY",
    "AbortError",
    "Agent",
    "AgentTimeoutError",
    "Allow",
    "Approval",
    "ApprovalError",
    "ApprovalPolicy",
    "Block",
    "Chunk",
    "DurableEventType",
    "FateKind",
    "Hang",
    "Hooks",
    "InMemorySink",
    "JsonValue",
    "LimitExceededError",
    "Limits",
    "LiveEventType",
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
    "ToolOutput",
    "ToolRegistry",
    "ToolResult",
    "TurnStopping",
    "Usage",
    "Waterfall",
    "calls_reply",
    "retry_request",
    "text_reply",
    "tool",
    "user_message",
]
