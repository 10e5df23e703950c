"""A local fake provider server: scripted or recorded SSE over HTTP on 127.0.0.1 (RT15).

`FakeServer` speaks just enough HTTP/1.1 for the official ``openai`` and
``anthropic`` SDKs: it answers each POST with the next scripted `Reply`
(server-sent events, an HTTP error, or a stream cut off mid-way) and records
every request, so adapters are tested through the real SDKs and never the
network. Like the providers, it first checks each request body against their rules
(specs/providers.md W3–W5, `machine.providers.rules`): a body the provider would refuse
gets the provider's HTTP 400 and error body instead of a scripted reply, and is listed in
`FakeServer.refusals`. It needs only the standard library::

    async with FakeServer() as server:
        server.add(openai_text("hello"))
        model = OpenAIChat(model="fake", base_url=server.openai_base_url, api_key="test")
        ...
        assert server.requests[0].json["messages"][-1]["content"] == "hi"

`FakeServer.start_in_thread()` runs it on a background thread instead (for a
client in another process, such as ``turnstile chat`` in a test). The builders
`openai_text`, `openai_tool_calls`, `anthropic_text`, `anthropic_tool_calls`
make replies in each provider's streaming format; `Reply.from_sse` serves a
recorded transcript (``.sse`` text) as it is.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final

from machine.providers.rules import (
    CHAT,
    MESSAGES,
    Dialect,
    Refusal,
    chat_refusals,
    error_body,
    messages_refusals,
)

__all__ = ["FakeServer", "RecordedRequest", "Reply", "anthropic_text", "anthropic_tool_calls",
           "openai_text", "openai_tool_calls", "sse_event"]

_REASONS: Final = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden",
                   404: "Not Found", 408: "Request Timeout", 413: "Payload Too Large",
                   422: "Unprocessable Entity", 429: "Too Many Requests",
                   500: "Internal Server Error", 502: "Bad Gateway", 503: "Service Unavailable",
                   529: "Overloaded"}
_MAX_BODY: Final = 64 * 1024 * 1024


def sse_event(data: object, event: str | None = None) -> str:
    """One server-sent event: ``event: NAME`` (if given) and ``data: JSON`` (or the text
    as it is), ended by a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    head = f"event: {event}\n" if event is not None else ""
    return head + "".join(f"data: {line}\n" for line in text.split("\n")) + "\n"


@dataclass(frozen=True)
class Reply:
    """One scripted response.

    * ``events``: the SSE events to stream (each a complete ``event:``/``data:`` block, sent
      in UTF-8; a lone surrogate U+DC80-U+DCFF is sent as the byte it escapes, as Python's
      ``surrogateescape`` does, so a test can send bytes that are not UTF-8); ignored when
      ``body`` is given;
    * ``status``, ``headers``: the status line and extra headers (``Retry-After``, ...);
    * ``body``: a JSON error (or any) body sent with ``Content-Length`` instead of a stream;
    * ``drop_after``: cut the connection (no terminating chunk) after this many events;
    * ``delay``: seconds to wait before each event after the first;
    * ``hold_at``: stop before this event index until `FakeServer.release` is called.
    """

    events: tuple[str, ...] = ()
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    body: object = None
    drop_after: int | None = None
    delay: float = 0.0
    hold_at: int | None = None

    @classmethod
    def error(cls, status: int, body: object, headers: Mapping[str, str] | None = None
              ) -> Reply:
        """An HTTP error with a JSON body."""
        return cls(status=status, body=body, headers=dict(headers or {}))

    @classmethod
    def from_sse(cls, text: str, *, drop_after: int | None = None, delay: float = 0.0,
                 hold_at: int | None = None) -> Reply:
        """Serve a recorded SSE transcript: events are separated by blank lines."""
        blocks = [block.strip("\n") for block in text.replace("\r\n", "\n").split("\n\n")]
        return cls(events=tuple(block + "\n\n" for block in blocks if block.strip()),
                   drop_after=drop_after, delay=delay, hold_at=hold_at)

    @classmethod
    def from_file(cls, path: str | Path, *, drop_after: int | None = None, delay: float = 0.0,
                  hold_at: int | None = None) -> Reply:
        """`from_sse` of a recorded ``.sse`` file."""
        return cls.from_sse(Path(path).read_text(encoding="utf-8"), drop_after=drop_after,
                            delay=delay, hold_at=hold_at)

    def but(self, *, drop_after: int | None = None, delay: float | None = None,
            hold_at: int | None = None) -> Reply:
        """This reply with its pacing changed: cut after *drop_after* events, *delay* seconds
        between events, or held at event *hold_at* until `FakeServer.release`."""
        return Reply(self.events, self.status, self.headers, self.body,
                     self.drop_after if drop_after is None else drop_after,
                     self.delay if delay is None else delay,
                     self.hold_at if hold_at is None else hold_at)


@dataclass(frozen=True)
class RecordedRequest:
    """A request the server received: method, path, headers (lower-case names), body."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


class FakeServer:
    """A scripted HTTP server on 127.0.0.1 (see the module docstring).

    Replies are served in the order added, whatever the path; when none is left the
    server answers 500 with an error body saying so. With *refuse* (the default), a request
    to ``…/chat/completions`` or ``…/messages`` whose body a provider refuses is answered
    with that provider's 400 (W3) without taking a reply, and recorded in `refusals`."""

    def __init__(self, replies: Iterable[Reply] = (), *, host: str = "127.0.0.1",
                 refuse: bool = True) -> None:
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError("the fake server listens on the loopback interface only")
        self.host = host
        self.port = 0
        self.refuse = refuse
        self.requests: list[RecordedRequest] = []
        #: (the request, the dialect, its refusals) of every request refused (W3)
        self.refusals: list[tuple[RecordedRequest, Dialect, list[Refusal]]] = []
        self._replies: deque[Reply] = deque(replies)
        self._server: asyncio.base_events.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._release: asyncio.Event | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    # -- scripting --------------------------------------------------------------

    def add(self, *replies: Reply) -> None:
        """Queue replies (thread-safe)."""
        with self._lock:
            self._replies.extend(replies)

    @property
    def pending(self) -> int:
        """Replies not served yet."""
        with self._lock:
            return len(self._replies)

    def release(self) -> None:
        """Let a reply held at ``hold_at`` go on (thread-safe)."""
        loop, event = self._loop, self._release
        if loop is not None and event is not None:
            loop.call_soon_threadsafe(event.set)

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_base_url(self) -> str:
        """The ``base_url`` for an OpenAI-compatible client (``/v1``)."""
        return f"{self.base_url}/v1"

    # -- lifecycle --------------------------------------------------------------

    async def start(self) -> FakeServer:
        self._loop = asyncio.get_running_loop()
        self._release = asyncio.Event()
        self._server = await asyncio.start_server(self._serve, self.host, 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):
                writer.transport.abort()
            await self._server.wait_closed()
            self._server = None

    async def __aenter__(self) -> FakeServer:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.stop()

    @classmethod
    @contextlib.contextmanager
    def start_in_thread(cls, replies: Iterable[Reply] = ()) -> Iterator[FakeServer]:
        """Run a server on a background thread's event loop for the ``with`` block."""
        server = cls(replies)
        started = threading.Event()
        stopping: list[asyncio.Future[None]] = []

        async def main() -> None:
            await server.start()
            done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            stopping.append(done)
            started.set()
            await done
            await server.stop()

        thread = threading.Thread(target=asyncio.run, args=(main(),), daemon=True,
                                  name="turnstile-fake-server")
        thread.start()
        if not started.wait(30):
            raise RuntimeError("the fake server did not start")
        try:
            yield server
        finally:
            loop = server._loop
            assert loop is not None
            def stop() -> None:
                if not stopping[0].done():
                    stopping[0].set_result(None)
            loop.call_soon_threadsafe(stop)
            thread.join(30)

    # -- HTTP -------------------------------------------------------------------

    def _next_reply(self) -> Reply:
        with self._lock:
            if self._replies:
                return self._replies.popleft()
        return Reply.error(500, {"error": {"message": "the fake server has no scripted reply",
                                           "type": "server_error"}})

    def _refused(self, request: RecordedRequest) -> Reply | None:
        """The provider's 400 for a request body it refuses (W3), or None."""
        path = request.path.split("?", 1)[0]
        dialect: Dialect | None = (CHAT if path.endswith("/chat/completions") else
                                   MESSAGES if path.endswith("/messages") else None)
        if dialect is None or request.method != "POST":
            return None
        try:
            body = json.loads(request.body)
        except ValueError:
            found = [Refusal("W3", (), "We could not parse the JSON body of your request.")]
        else:
            found = chat_refusals(body) if dialect == CHAT else messages_refusals(body)
        if not found:
            return None
        with self._lock:
            self.refusals.append((request, dialect, found))
        return Reply.error(400, error_body(dialect, found[0]))

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            while True:
                request = await self._read_request(reader)
                if request is None:
                    return
                self.requests.append(request)
                refused = self._refused(request) if self.refuse else None
                reply = refused if refused is not None else self._next_reply()
                if not await self._respond(writer, reply):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            return
        except asyncio.CancelledError:
            # Why not re-raised: asyncio's stream callback (3.11) reports a handler task that
            # ends cancelled as an error; the server is shutting down, nothing waits for it.
            return
        finally:
            self._connections.discard(writer)
            writer.close()

    @staticmethod
    async def _read_request(reader: asyncio.StreamReader) -> RecordedRequest | None:
        line = await reader.readline()
        if not line:
            return None
        method, _, rest = line.decode("latin-1").partition(" ")
        path = rest.rsplit(" ", 1)[0]
        headers: dict[str, str] = {}
        while True:
            header = await reader.readline()
            if header in (b"\r\n", b"\n", b""):
                break
            name, _, value = header.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        body = b""
        if headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await reader.readline()).split(b";")[0], 16)
                if size == 0:
                    await reader.readline()
                    break
                body += await reader.readexactly(size)
                await reader.readline()
        else:
            length = int(headers.get("content-length", "0") or 0)
            if length > _MAX_BODY:
                raise ConnectionError("request body too large")
            body = await reader.readexactly(length) if length else b""
        return RecordedRequest(method, path, headers, body)

    async def _respond(self, writer: asyncio.StreamWriter, reply: Reply) -> bool:
        """Write *reply*; False when the connection was cut (deliberately or by the client)."""
        reason = _REASONS.get(reply.status, "Status")
        head = [f"HTTP/1.1 {reply.status} {reason}"]
        extra = {name.lower(): value for name, value in reply.headers.items()}
        if reply.body is not None:
            body = reply.body if isinstance(reply.body, bytes) else json.dumps(reply.body).encode()
            head += ["content-type: application/json", f"content-length: {len(body)}"]
            head += [f"{name}: {value}" for name, value in extra.items()]
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + body)
            await writer.drain()
            return True
        head += ["content-type: text/event-stream", "cache-control: no-cache",
                 "transfer-encoding: chunked"]
        head += [f"{name}: {value}" for name, value in extra.items()]
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
        for index, event in enumerate(reply.events):
            if reply.drop_after is not None and index >= reply.drop_after:
                await writer.drain()
                writer.transport.abort()            # no terminating chunk: a torn stream
                return False
            if reply.hold_at == index and self._release is not None:
                await writer.drain()
                await self._release.wait()
                self._release.clear()
            elif index and reply.delay:
                await writer.drain()
                await asyncio.sleep(reply.delay)
            data = event.encode("utf-8", "surrogateescape")
            writer.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        if reply.drop_after is not None and reply.drop_after >= len(reply.events) > 0:
            await writer.drain()
            writer.transport.abort()
            return False
        writer.write(b"0\r\n\r\n")
        await writer.drain()
        return True


# --------------------------------------------------------------------------
# Reply builders in each provider's streaming format
# --------------------------------------------------------------------------


def _openai_chunk(delta: Mapping[str, Any] | None, finish: str | None = None,
                  usage: Mapping[str, Any] | None = None, model: str = "fake-model"
                  ) -> str:
    chunk: dict[str, Any] = {"id": "chatcmpl-fake", "object": "chat.completion.chunk",
                             "created": 1764489600, "model": model,
                             "choices": [] if delta is None else [
                                 {"index": 0, "delta": dict(delta), "logprobs": None,
                                  "finish_reason": finish}]}
    if usage is not None:
        chunk["usage"] = dict(usage)
    return sse_event(chunk)


def _openai_usage(prompt: int, completion: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion}


def openai_text(text: str, *, pieces: int = 1, reasoning: str | None = None,
                finish: str = "stop", usage: tuple[int, int] | None = (5, 2)) -> Reply:
    """A Chat Completions stream: optional ``reasoning_content`` deltas (as DeepSeek streams
    them), *text* in *pieces* deltas, the finish reason, a usage chunk, ``[DONE]``."""
    events = [_openai_chunk({"role": "assistant", "content": ""})]
    if reasoning:
        events += [_openai_chunk({"reasoning_content": part}) for part in _split(reasoning, 2)]
    events += [_openai_chunk({"content": part}) for part in _split(text, pieces)]
    events.append(_openai_chunk({}, finish))
    if usage is not None:
        events.append(_openai_chunk(None, usage=_openai_usage(*usage)))
    events.append(sse_event("[DONE]"))
    return Reply(tuple(events))


def openai_tool_calls(*calls: tuple[str, str, str], text: str = "",
                      usage: tuple[int, int] | None = (7, 3)) -> Reply:
    """A Chat Completions stream calling tools ``(id, name, arguments)``; each call's
    arguments arrive in two deltas after a first delta naming it, as providers stream them."""
    events = [_openai_chunk({"role": "assistant", "content": text or None})]
    for index, (call_id, name, arguments) in enumerate(calls):
        events.append(_openai_chunk({"tool_calls": [
            {"index": index, "id": call_id, "type": "function",
             "function": {"name": name, "arguments": ""}}]}))
        for part in _split(arguments, 2):
            events.append(_openai_chunk({"tool_calls": [
                {"index": index, "function": {"arguments": part}}]}))
    events.append(_openai_chunk({}, "tool_calls"))
    if usage is not None:
        events.append(_openai_chunk(None, usage=_openai_usage(*usage)))
    events.append(sse_event("[DONE]"))
    return Reply(tuple(events))


def _anthropic_start(input_tokens: int) -> list[str]:
    return [sse_event({"type": "message_start", "message": {
        "id": "msg_fake", "type": "message", "role": "assistant", "model": "fake-model",
        "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": input_tokens, "output_tokens": 1}}}, "message_start")]


def _anthropic_stop(reason: str, output_tokens: int) -> list[str]:
    return [sse_event({"type": "message_delta", "delta": {"stop_reason": reason,
                                                          "stop_sequence": None},
                       "usage": {"output_tokens": output_tokens}}, "message_delta"),
            sse_event({"type": "message_stop"}, "message_stop")]


def _anthropic_text_block(index: int, text: str, pieces: int) -> list[str]:
    events = [sse_event({"type": "content_block_start", "index": index,
                         "content_block": {"type": "text", "text": ""}}, "content_block_start")]
    events += [sse_event({"type": "content_block_delta", "index": index,
                          "delta": {"type": "text_delta", "text": part}}, "content_block_delta")
               for part in _split(text, pieces)]
    events.append(sse_event({"type": "content_block_stop", "index": index},
                            "content_block_stop"))
    return events


def anthropic_text(text: str, *, pieces: int = 1, thinking: str | None = None,
                   stop_reason: str = "end_turn", usage: tuple[int, int] = (5, 2)) -> Reply:
    """A Messages stream: an optional thinking block (with its signature), a text block in
    *pieces* deltas, the stop reason and usage."""
    events = _anthropic_start(usage[0])
    index = 0
    if thinking:
        events.append(sse_event({"type": "content_block_start", "index": 0, "content_block": {
            "type": "thinking", "thinking": "", "signature": ""}}, "content_block_start"))
        events += [sse_event({"type": "content_block_delta", "index": 0, "delta": {
            "type": "thinking_delta", "thinking": part}}, "content_block_delta")
            for part in _split(thinking, 2)]
        events.append(sse_event({"type": "content_block_delta", "index": 0, "delta": {
            "type": "signature_delta", "signature": "c2lnbmF0dXJl"}}, "content_block_delta"))
        events.append(sse_event({"type": "content_block_stop", "index": 0},
                                "content_block_stop"))
        index = 1
    events += _anthropic_text_block(index, text, pieces)
    events.append(sse_event({"type": "ping"}, "ping"))
    events += _anthropic_stop(stop_reason, usage[1])
    return Reply(tuple(events))


def anthropic_tool_calls(*calls: tuple[str, str, str], text: str = "",
                         usage: tuple[int, int] = (7, 3)) -> Reply:
    """A Messages stream calling tools ``(id, name, input JSON text)``, the input in two
    ``input_json_delta`` pieces, after an optional text block."""
    events = _anthropic_start(usage[0])
    index = 0
    if text:
        events += _anthropic_text_block(0, text, 1)
        index = 1
    for offset, (call_id, name, arguments) in enumerate(calls):
        at = index + offset
        events.append(sse_event({"type": "content_block_start", "index": at, "content_block": {
            "type": "tool_use", "id": call_id, "name": name, "input": {}}},
            "content_block_start"))
        events += [sse_event({"type": "content_block_delta", "index": at, "delta": {
            "type": "input_json_delta", "partial_json": part}}, "content_block_delta")
            for part in _split(arguments, 2)]
        events.append(sse_event({"type": "content_block_stop", "index": at},
                                "content_block_stop"))
    events += _anthropic_stop("tool_use", usage[1])
    return Reply(tuple(events))


def _split(text: str, pieces: int) -> Sequence[str]:
    if pieces <= 1 or len(text) < 2:
        return [text]
    size = max(1, -(-len(text) // pieces))
    return [text[i:i + size] for i in range(0, len(text), size)]
