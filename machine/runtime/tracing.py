"""OpenTelemetry traces of an agent, through ``opentelemetry-api`` (extra ``[tracing]``;
specs/runtime.md RT29).

::

    from machine.runtime.tracing import trace_agent

    stop = trace_agent(agent)          # spans to the global tracer provider

The tracer is an observer of the agent's outputs (`Agent.observe`): it adds no hook, no task
and no await, so the agent runs exactly as it would untraced, and an agent that is not
traced pays nothing (no observer is registered). From the outputs it makes, after the GenAI
semantic conventions:

* a span per **turn**, ``invoke_agent {agent name}`` (``gen_ai.operation.name``
  ``invoke_agent``), from ``turn/start`` to ``turn/end``; a turn that ends in error has
  status ERROR and ``error.type`` (the failure's code); a retry turn is *linked* to the turn
  whose failure it retries;
* a span per **step**, ``turnstile.step``, inside its turn;
* a span per **model request**, ``chat {model}`` (kind CLIENT; ``gen_ai.provider.name``,
  ``gen_ai.request.model`` and the request options, ``gen_ai.response.finish_reasons``,
  ``gen_ai.usage.input_tokens`` / ``output_tokens``; a failed request: ERROR and
  ``error.type``), inside its step;
* a span per **tool call**, ``execute_tool {tool name}`` (``gen_ai.tool.name``,
  ``gen_ai.tool.call.id``, ``gen_ai.tool.type``; an error result: ERROR and ``error.type``),
  inside its step;
* span events: ``turnstile.steering`` and ``turnstile.context`` (steering and injected
  context reaching the model), ``turnstile.admission`` (each prompt's verdict: ``allow`` on
  the turn it starts, ``block`` on the next turn span or, when no turn follows, on a span
  ``turnstile.admission`` of its own), ``turnstile.cancel`` (a cancel request).

Message text is recorded only with ``capture_content=True`` (it may be sensitive). A turn
whose span does not record (no SDK configured, or sampled out) gets no other span or event.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from machine import __version__
from machine.events import Event, LiveEvent
from machine.io import MODEL, Control, Durable, Effect, Live, Output
from machine.jsonvalue import FrozenDict, FrozenList, compact_json
from machine.runtime.agent import Agent

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
    from opentelemetry.trace import Link, Span, SpanKind, Status, StatusCode, TracerProvider
except ImportError as _missing:  # pragma: no cover - exercised without the extra
    raise ImportError("machine.runtime.tracing needs OpenTelemetry: pip install "
                      "'turnstile-agent[tracing]'") from _missing

__all__ = ["AgentTracer", "trace_agent"]

#: The instrumentation scope of every span.
SCOPE: Final = "turnstile"
#: Request options copied onto a model span: config key -> attribute.
REQUEST_OPTIONS: Final = {"maxTokens": "gen_ai.request.max_tokens",
                          "temperature": "gen_ai.request.temperature",
                          "topP": "gen_ai.request.top_p", "topK": "gen_ai.request.top_k",
                          "seed": "gen_ai.request.seed"}
#: The core's finish kinds as GenAI finish reasons.
FINISH_REASONS: Final = {"stop": "stop", "max-tokens": "length", "error": "error",
                         "aborted": "aborted"}


def _get(data: object, *keys: str) -> Any:
    value: Any = data
    for key in keys:
        if not isinstance(value, Mapping):
            return None
        value = value.get(key)
    return value


def _error_type(info: Any) -> str:
    """A failure's or error's low-cardinality identifier: its code, else its name."""
    if isinstance(info, Mapping):
        for key in ("code", "name"):
            value = info.get(key)
            if isinstance(value, str) and value:
                return value
    return "_OTHER"


def _text(message: Any) -> str:
    content = _get(message, "content")
    if not isinstance(content, FrozenList):
        return ""
    return "".join(str(block.get("text", "")) for block in content
                   if isinstance(block, FrozenDict) and block.get("type") == "text")


class AgentTracer:
    """Makes spans from one agent's outputs (see the module docstring). Use `trace_agent`."""

    def __init__(self, agent: Agent, *, tracer_provider: TracerProvider | None = None,
                 agent_name: str = "turnstile", conversation_id: str | None = None,
                 capture_content: bool = False) -> None:
        self.agent = agent
        self.agent_name = agent_name
        self.conversation_id = conversation_id
        self.capture_content = capture_content
        self.tracer = trace.get_tracer(SCOPE, __version__, tracer_provider=tracer_provider)
        self.turn: Span | None = None
        #: Whether the running turn's span records (no SDK, or sampled out: the turn's other
        #: spans and events are not made at all, so such a turn costs one no-op span).
        self.recording = False
        self.turn_number = 0
        self.step: Span | None = None
        self.step_over = False                    # the step ended before its model span
        self.model: Span | None = None
        self.usage: dict[str, int] = {}
        self.tools: dict[str, Span] = {}
        self.failed: Span | None = None           # the last turn that ended in error
        self.admitting: list[str] = []            # prompts whose verdict is not known yet
        self.blocked: list[tuple[str, int]] = []  # (message id, time in ns) not yet recorded
        self._durable: dict[str, Callable[[Event], None]] = {
            "turn/start": self._turn_start, "turn/end": self._turn_end,
            "step/start": self._step_start, "step/end": self._step_end,
            "assistant/chunk": self._chunk, "tool/call": self._tool_call,
            "tool/result": self._tool_result, "steering/message": self._steering,
            "user/message": self._user_message}

    def __call__(self, output: Output) -> None:
        kind = type(output)
        if kind is Durable:
            assert isinstance(output, Durable)
            handler = self._durable.get(output.event.type)
            if handler is not None:
                handler(output.event)
        elif kind is Effect:
            assert isinstance(output, Effect)
            if output.kind == MODEL:
                self._model_start(output.payload)
            elif output.kind == "prompt-submit":
                self._admitting(output.payload)
            elif output.kind == "request-error":
                self._model_end(error=output.payload.get("failure") or output.payload.get("error"))
        elif kind is Live:
            assert isinstance(output, Live)
            self._live(output.event)
        else:
            assert isinstance(output, Control)

    # ------------------------------------------------------------------
    # Turns and admissions
    # ------------------------------------------------------------------

    def _admitting(self, payload: FrozenDict) -> None:
        if self.admitting:          # the previous prompt started no turn: it was blocked
            self._blocked_now()
        message_id = _get(payload, "message", "id")
        self.admitting.append(message_id if isinstance(message_id, str) else "?")

    def _blocked_now(self) -> None:
        now = _now()
        self.blocked.extend((message_id, now) for message_id in self.admitting)
        self.admitting.clear()

    def _turn_start(self, event: Event) -> None:
        data = event.data
        turn = data.get("turn")
        trigger = _get(data, "trigger", "kind")
        links = []
        if trigger == "retry" and self.failed is not None:
            links.append(Link(self.failed.get_span_context(),
                              {"turnstile.link": "retry of a failed turn"}))
        attributes: dict[str, Any] = {"gen_ai.operation.name": "invoke_agent",
                                      "gen_ai.agent.name": self.agent_name,
                                      "turnstile.turn": turn if isinstance(turn, int) else 0,
                                      "turnstile.trigger": str(trigger)}
        if self.conversation_id is not None:
            attributes["gen_ai.conversation.id"] = self.conversation_id
        self.turn = span = self.tracer.start_span(
            f"invoke_agent {self.agent_name}", kind=SpanKind.INTERNAL, attributes=attributes,
            links=links, context=otel_context.Context())
        self.turn_number = turn if isinstance(turn, int) else 0
        self.recording = span.is_recording()
        for message_id, when in self.blocked:
            span.add_event("turnstile.admission", {"turnstile.verdict": "block",
                                                   "turnstile.message.id": message_id}, when)
        self.blocked.clear()
        for message_id in self.admitting:
            span.add_event("turnstile.admission", {"turnstile.verdict": "allow",
                                                   "turnstile.message.id": message_id})
        self.admitting.clear()

    def _turn_end(self, event: Event) -> None:
        reason = event.data.get("reason")
        kind = _get(reason, "kind")
        failure = _get(reason, "failure")
        self._model_end(error=failure if kind == "error" else None)
        for tool_span in self.tools.values():
            tool_span.end()
        self.tools.clear()
        self._end_step()
        span, self.turn = self.turn, None
        if span is None:
            return
        span.set_attribute("turnstile.turn.end", str(kind))
        if kind == "error":
            span.set_attribute("error.type", _error_type(failure))
            span.set_status(Status(StatusCode.ERROR, str(_get(failure, "message") or kind)))
            self.failed = span
        span.end()

    # ------------------------------------------------------------------
    # Steps, model requests, tools
    # ------------------------------------------------------------------

    def _parent(self) -> otel_context.Context:
        span = self.step or self.turn
        return trace.set_span_in_context(span) if span is not None else otel_context.Context()

    def _step_start(self, event: Event) -> None:
        self._model_end()
        self._end_step()
        if not self.recording:
            return
        turn, step = event.data.get("turn"), event.data.get("step")
        self.step = self.tracer.start_span(
            "turnstile.step", context=self._parent() if self.turn is not None else None,
            attributes={"turnstile.turn": turn if isinstance(turn, int) else 0,
                        "turnstile.step": step if isinstance(step, int) else 0})

    def _step_end(self, event: Event) -> None:
        if self.model is None:
            self._end_step()
        else:       # a failed request is reported after its step's end: both end then
            self.step_over = True

    def _end_step(self) -> None:
        self.step_over = False
        if self.step is not None:
            self.step.end()
            self.step = None

    def _model_start(self, payload: FrozenDict) -> None:
        self._model_end()
        if not self.recording:
            return
        config = _get(payload, "header", "config")
        config = config if isinstance(config, Mapping) else {}
        model = str(config.get("model", ""))
        attributes: dict[str, Any] = {"gen_ai.operation.name": "chat",
                                      "gen_ai.provider.name": str(config.get("provider", "")),
                                      "gen_ai.request.model": model}
        for key, attribute in REQUEST_OPTIONS.items():
            value = config.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                attributes[attribute] = value
        self.usage = {}
        self.model = self.tracer.start_span(f"chat {model}".rstrip(), kind=SpanKind.CLIENT,
                                            context=self._parent(), attributes=attributes)

    def _chunk(self, event: Event) -> None:
        chunk = event.data.get("chunk")
        kind = _get(chunk, "type")
        if kind == "usage":
            self._usage(_get(chunk, "usage"))
        elif kind == "finish" and self.model is not None:
            self._usage(_get(chunk, "usage"))
            finish = str(_get(chunk, "kind"))
            self.model.set_attribute("gen_ai.response.finish_reasons",
                                     [FINISH_REASONS.get(finish, finish)])
            self._model_end(error=_get(chunk, "failure") if finish == "error" else None)

    def _usage(self, usage: Any) -> None:
        if not isinstance(usage, Mapping):
            return
        for key, attribute in (("inputTokens", "gen_ai.usage.input_tokens"),
                               ("outputTokens", "gen_ai.usage.output_tokens")):
            value = usage.get(key)
            if isinstance(value, int) and not isinstance(value, bool):
                self.usage[attribute] = value

    def _model_end(self, *, error: Any = None) -> None:
        span, self.model = self.model, None
        if span is None:
            return
        for attribute, value in self.usage.items():
            span.set_attribute(attribute, value)
        if error is not None:
            span.set_attribute("error.type", _error_type(error))
            span.set_status(Status(StatusCode.ERROR, str(_get(error, "message") or "")))
        span.end()
        if self.step_over:              # the step's end came first: its request failed
            self._end_step()

    def _tool_call(self, event: Event) -> None:
        if not self.recording:
            return
        data = event.data
        name, call_id = str(data.get("name", "")), str(data.get("callId", ""))
        found = self.agent.tools.get(name)
        attributes: dict[str, Any] = {"gen_ai.operation.name": "execute_tool",
                                      "gen_ai.tool.name": name, "gen_ai.tool.call.id": call_id,
                                      "gen_ai.tool.type": "function"}
        if found is not None and found.description:
            attributes["gen_ai.tool.description"] = found.description
        if self.capture_content:
            attributes["gen_ai.tool.call.arguments"] = str(data.get("arguments", ""))
        self.tools[call_id] = self.tracer.start_span(f"execute_tool {name}",
                                                     context=self._parent(),
                                                     attributes=attributes)

    def _tool_result(self, event: Event) -> None:
        call_id = _get(event.data, "message", "source", "callId")
        span = self.tools.pop(str(call_id), None)
        if span is None:
            return
        error = event.data.get("error")
        block = _get(event.data, "message", "content")
        failed = error is not None or (isinstance(block, FrozenList) and bool(block) and
                                       _get(block[0], "isError") is True)
        if failed:
            span.set_attribute("error.type", _error_type(error))
            span.set_status(Status(StatusCode.ERROR, str(_get(error, "message") or "")))
        if self.capture_content:
            span.set_attribute("gen_ai.tool.call.result",
                               compact_json(_get(event.data, "message", "content")))
        span.end()

    # ------------------------------------------------------------------
    # Span events
    # ------------------------------------------------------------------

    def _message_event(self, name: str, message: Any) -> None:
        span = self.step or self.turn
        if span is None or not self.recording:
            return
        attributes: dict[str, Any] = {"turnstile.message.id": str(_get(message, "id")),
                                      "turnstile.source.kind": str(_get(message, "source",
                                                                        "kind"))}
        plugin = _get(message, "source", "plugin")
        if isinstance(plugin, str):
            attributes["turnstile.source.plugin"] = plugin
        if self.capture_content:
            attributes["turnstile.message.text"] = _text(message)
        span.add_event(name, attributes)

    def _steering(self, event: Event) -> None:
        self._message_event("turnstile.steering", event.data.get("message"))

    def _user_message(self, event: Event) -> None:
        if _get(event.data, "source", "kind") not in ("user", "tool"):
            self._message_event("turnstile.context", event.data)

    def _live(self, notice: LiveEvent) -> None:
        kind = notice.type
        if kind == "agent/error":
            self._model_end(error=_get(notice.payload, "error"))
        elif kind == "agent/cancel-requested" and self.turn is not None:
            self.turn.add_event("turnstile.cancel", {
                "turnstile.cause": str(_get(notice.payload, "cause", "kind"))})
        elif kind == "agent/status" and notice.payload.get("status") == "idle":
            if self.admitting:
                self._blocked_now()
            if self.blocked:
                self._admission_span()

    def _admission_span(self) -> None:
        """Blocked prompts that no turn followed: a span of their own carries the events."""
        first = self.blocked[0][1]
        span = self.tracer.start_span("turnstile.admission", start_time=first,
                                      context=otel_context.Context(),
                                      attributes={"gen_ai.agent.name": self.agent_name})
        for message_id, when in self.blocked:
            span.add_event("turnstile.admission", {"turnstile.verdict": "block",
                                                   "turnstile.message.id": message_id}, when)
        self.blocked.clear()
        span.end()


def _now() -> int:
    return time.time_ns()


def trace_agent(agent: Agent, *, tracer_provider: TracerProvider | None = None,
                agent_name: str = "turnstile", conversation_id: str | None = None,
                capture_content: bool = False) -> Callable[[], None]:
    """Trace *agent* (see the module docstring) to *tracer_provider* (default: the global
    one); returns a function that stops tracing. *agent_name* names the turn spans,
    *conversation_id* is recorded as ``gen_ai.conversation.id``; message text and tool
    arguments and results are recorded only with *capture_content*."""
    return agent.observe(AgentTracer(agent, tracer_provider=tracer_provider,
                                     agent_name=agent_name, conversation_id=conversation_id,
                                     capture_content=capture_content))
