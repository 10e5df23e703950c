"""The model adapter protocol and a scripted model (specs/runtime.md RT11, "Writing a model
adapter").

An adapter turns one request into a stream of chunks::

    class ModelAdapter(Protocol):
        def stream(self, call: ModelCall) -> AsyncIterator[Chunk]: ...

* ``call.header`` is the prepared request header ``{config, system?, tools?}``,
  ``call.messages`` the request's message history, ``call.signal`` the turn's
  abort signal.
* The stream yields chunks (rule V18): ``{type:'text', text}``,
  ``{type:'reasoning', text}``, ``{type:'tool-call', id, name, arguments}``,
  ``{type:'block', block}``, ``{type:'usage', usage}`` (token figures, before
  the finish; the last one is the message's usage), and ends with exactly one
  finish chunk ``{type:'finish', kind, failure?, replayState?}`` (kind
  ``stop``, ``max-tokens``, ``error`` or ``aborted``). Any other type is an
  invalid chunk.
* A failed request raises an exception carrying ``failure: LlmFailure``
  (`ModelFailure`): that is a *model failure* (request-error point, retry).
  Any other exception is a generic failure of the turn.
* When the core stops consuming the stream (``release``: the turn was
  aborted, or a chunk was invalid) the runtime cancels the pending read and
  closes the iterator (``aclose``), so an async generator's ``finally`` runs.

An adapter may also implement ``prepare(draft) -> header`` (`RequestPreparer`)
to build the header from the final config; the default header is
``{config, system?, tools?}`` with the system prompt if it is not ``None`` and
the tool specs if there are tools. An adapter may have a ``default_config``
mapping (with ``provider`` and ``model``), merged under the agent's
``request_options`` to seed the first request.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeAlias, runtime_checkable

from machine.checking.scripted import calls_reply, text_reply
from machine.jsonvalue import Frozen, FrozenDict, FrozenList
from machine.payloads import header_config, header_tools
from machine.runtime.failures import RaisedError
from machine.runtime.hooks import JsonValue
from machine.runtime.signal import AbortError, Signal
from machine.vocabulary import ErrorInfo, Message

__all__ = ["Chunk", "Hang", "ModelAdapter", "ModelCall", "Reply", "RequestDraft",
           "RequestPreparer", "ScriptedModel", "StructuredOutput", "calls_reply",
           "default_header", "text_reply"]

#: One model chunk as JSON (rule V18).
Chunk: TypeAlias = Mapping[str, JsonValue]


@dataclass(frozen=True, slots=True)
class ModelCall:
    """One model request."""

    turn: int
    step: int
    signal: Signal
    header: FrozenDict
    messages: Sequence[Message]

    @property
    def config(self) -> FrozenDict:
        """The header's config: ``provider``, ``model`` and the request options."""
        return header_config(self.header)

    @property
    def system(self) -> Frozen:
        return self.header.get("system")

    @property
    def tools(self) -> FrozenList:
        """The header's tool specs (empty when there are none)."""
        return header_tools(self.header)


class ModelAdapter(Protocol):
    """Streams the chunks of one request (see the module docstring)."""

    def stream(self, call: ModelCall) -> AsyncIterator[Chunk]: ...


@dataclass(frozen=True, slots=True)
class RequestDraft:
    """Input of request preparation: the final config (after the request waterfall)."""

    turn: int
    step: int
    signal: Signal
    config: Mapping[str, JsonValue]
    system: Frozen
    tools: tuple[JsonValue, ...]


@runtime_checkable
class StructuredOutput(Protocol):
    """Optional adapter part (RT23): a run's structured output as request options the
    provider takes natively, or None (the run then uses a final-answer tool)."""

    def output_options(self, schema: Mapping[str, JsonValue], name: str,
                       description: str | None) -> Mapping[str, JsonValue] | None: ...


@runtime_checkable
class RequestPreparer(Protocol):
    """Optional adapter part: build the request header ``{config, system?, tools?}``."""

    def prepare(self, draft: RequestDraft) -> Awaitable[Mapping[str, JsonValue]]: ...


def default_header(draft: RequestDraft) -> dict[str, JsonValue]:
    header: dict[str, JsonValue] = {"config": draft.config}
    if draft.system is not None:
        header["system"] = draft.system
    if draft.tools:
        header["tools"] = list(draft.tools)
    return header


# --------------------------------------------------------------------------
# ScriptedModel
# --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hang:
    """A scripted reply that yields *chunks*, then waits until the signal is aborted and
    raises `AbortError` (a model that stops only when cancelled)."""

    chunks: tuple[Chunk, ...] = ()


#: A scripted reply: the chunks to yield (finish included), an error to raise (an `ErrorInfo`
#: is raised exactly, as `RaisedError`), a `Hang`, or a function producing the stream.
Reply: TypeAlias = ("Sequence[Chunk] | ErrorInfo | BaseException | Hang"
                    " | Callable[[ModelCall], AsyncIterator[Chunk]]")


class ScriptedModel:
    """A model adapter that plays *replies* in order (then ``text_reply('ok')``).

    ``calls`` records every request. With *chunk_delay* (seconds) each chunk
    after the first is preceded by a sleep, so observers see a live stream. With
    *native_output* it takes a run's structured output natively (RT23): the request config
    gets ``{"output_schema": schema}``, and the replies play the JSON answer."""

    def __init__(self, replies: Iterable[Reply] = (), *, provider: str = "scripted",
                 model: str = "scripted-1", chunk_delay: float | None = None,
                 native_output: bool = False) -> None:
        self.replies: list[Reply] = list(replies)
        self.provider = provider
        self.model = model
        self.chunk_delay = chunk_delay
        self.native_output = native_output
        self.calls: list[ModelCall] = []

    def output_options(self, schema: Mapping[str, JsonValue], name: str,
                       description: str | None) -> dict[str, JsonValue] | None:
        """Native structured output (RT23) when made with *native_output*."""
        return {"output_schema": dict(schema)} if self.native_output else None

    @property
    def default_config(self) -> dict[str, JsonValue]:
        return {"provider": self.provider, "model": self.model}

    def stream(self, call: ModelCall) -> AsyncIterator[Chunk]:
        self.calls.append(call)
        reply: Reply = self.replies.pop(0) if self.replies else text_reply("ok")
        if callable(reply):
            return reply(call)
        return self._play(reply, call.signal)

    async def _play(self, reply: Reply, signal: Signal) -> AsyncIterator[Chunk]:
        if isinstance(reply, ErrorInfo):
            raise RaisedError(reply)
        if isinstance(reply, BaseException):
            raise reply
        chunks = reply.chunks if isinstance(reply, Hang) else reply
        assert not callable(chunks)
        for index, chunk in enumerate(chunks):
            if index and self.chunk_delay is not None:
                await asyncio.sleep(self.chunk_delay)
            yield chunk
        if isinstance(reply, Hang):
            cause = await signal.wait()
            raise AbortError(cause, "model request aborted")
