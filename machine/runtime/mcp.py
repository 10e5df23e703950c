"""Tools from MCP servers, through the official ``mcp`` SDK (extra ``[mcp]``; specs/runtime.md
RT28).

::

    from machine.runtime import Agent
    from machine.runtime.mcp import McpServer

    async with McpServer.stdio("python", ["weather_server.py"]) as weather, \\
            Agent(model, tools=weather.tools) as agent:
        agent.followup("Will it rain in Lyon tomorrow?")
        await agent.when_idle()

An `McpServer` is one connection — a subprocess spoken to over stdio, or a streamable HTTP
endpoint. `start` connects, initializes the session and lists the server's tools; each
becomes an ordinary `Tool` (its input schema passed through as given) whose body is a
``tools/call``. A call's outcome is always something the model can read:

* the server's result — text blocks, its structured content (as JSON text when it sent no
  text), other content named in a text block — is the tool result; an error result
  (``isError``) stays an error result;
* a failure of the server itself raises `McpToolError` from the body, which the core turns
  into the error result ``Error: <message>`` with the error's code (R10.12): the server
  exited or closed the connection (``MCP_SERVER_GONE``), did not answer within
  *call_timeout* (``MCP_TIMEOUT``), answered with something that is not MCP
  (``MCP_GARBAGE``: an undecodable message fails every call in flight at once, a result of
  the wrong shape fails its call), or answered with a JSON-RPC error (``MCP_ERROR``).

The turn goes on, and nothing the agent accepted is lost. Cancelling the turn aborts the
call's signal: the request in flight is abandoned and the server is sent
``notifications/cancelled``, which cancels the tool's handler there.

The connection lives in a task of its own, so it may be closed from any task (the SDK's
cancel scopes must be left by the task that entered them); `close` ends the session and
stops the server (stdin closed, then terminated). ``async with`` starts and closes it;
`Agent.close_on_dispose` ties the close to an agent's disposal instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Final, Literal, TypeAlias

from machine.errors import TurnstileError, ValidationError
from machine.runtime.hooks import JsonValue
from machine.runtime.signal import Signal
from machine.runtime.tools import Tool, ToolArgumentError, ToolCall, ToolMode
from machine.vocabulary import ToolResult

try:
    import mcp_types
    import pydantic
    from mcp import ClientSession, MCPError, StdioServerParameters, stdio_client
    from mcp.client.streamable_http import streamable_http_client
except ImportError as _missing:  # pragma: no cover - exercised without the extra
    raise ImportError("machine.runtime.mcp needs the mcp SDK: pip install "
                      "'turnstile-agent[mcp]'") from _missing

__all__ = ["McpConnectError", "McpServer", "McpToolError"]

LOGGER: Final = logging.getLogger("turnstile")

#: How long `start` waits for the server to start and answer the handshake, by default.
DEFAULT_CONNECT_TIMEOUT: Final = 30.0
#: How many pages of ``tools/list`` are read at most (a paginator that never ends).
MAX_PAGES: Final = 100

#: What the model's error result says went wrong (``error.code``).
McpFailure: TypeAlias = Literal["MCP_SERVER_GONE", "MCP_TIMEOUT", "MCP_GARBAGE", "MCP_ERROR",
                                "MCP_NOT_CONNECTED"]

#: JSON-RPC's codes for a message that is not JSON-RPC (parse error, invalid request).
_GARBAGE_CODES: Final = frozenset({-32700, -32600})


class McpToolError(TurnstileError):
    """A tool call that the MCP server could not answer (see the module docstring): raised
    by the tool's body, it becomes the call's error result ``Error: <message>`` with
    ``error {name: 'McpToolError', code}``, and the turn goes on."""

    code = "MCP_ERROR"

    def __init__(self, message: str, code: McpFailure) -> None:
        super().__init__(message, code=code)


class McpConnectError(TurnstileError):
    """`McpServer.start` failed: the server could not be started, did not complete the
    handshake in time, or its tool list is unusable. The message names the server."""

    code = "MCP_CONNECT_FAILED"


@dataclass(frozen=True, slots=True)
class _Stdio:
    command: str
    args: tuple[str, ...]
    env: Mapping[str, str] | None
    cwd: str | None

    def describe(self) -> str:
        return " ".join([self.command, *self.args])

    def transport(self) -> AbstractAsyncContextManager[Any]:
        parameters = StdioServerParameters(command=self.command, args=list(self.args),
                                           env=dict(self.env) if self.env is not None else None,
                                           cwd=self.cwd)
        return stdio_client(parameters, errlog=_server_errors())


@dataclass(frozen=True, slots=True)
class _Http:
    url: str
    headers: Mapping[str, str] | None

    def describe(self) -> str:
        return self.url

    def transport(self) -> AbstractAsyncContextManager[Any]:
        if not self.headers:
            return streamable_http_client(self.url)
        return _http_with_headers(self.url, dict(self.headers))


@contextlib.asynccontextmanager
async def _http_with_headers(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    from mcp.shared._httpx_utils import create_mcp_http_client
    async with create_mcp_http_client(headers=headers) as client, \
            streamable_http_client(url, http_client=client) as streams:
        yield streams


def _server_errors() -> Any:
    """Where a stdio server's standard error goes: this process's, unless it has none
    (the SDK needs a real file)."""
    import sys
    try:
        sys.stderr.fileno()
    except (AttributeError, OSError, ValueError):
        return open(os.devnull, "w")
    return sys.stderr


class McpServer:
    """One MCP server whose tools an agent uses (see the module docstring).

    Make one with `stdio` or `http`, then ``await server.start()`` (or ``async with``):
    `tools` are its tools as `Tool` objects. *call_timeout* bounds each call (seconds;
    ``None``: no bound), *modes* chooses a tool's mode by name (default: ``parallel`` for
    a tool the server marks read-only, else ``exclusive``), *prefix* is put before every
    tool name (to keep two servers' names apart)."""

    def __init__(self, target: _Stdio | _Http, *, name: str | None = None,
                 call_timeout: float | None = None,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
                 modes: Mapping[str, ToolMode] | None = None, prefix: str = "") -> None:
        for label, value in (("call_timeout", call_timeout), ("connect_timeout", connect_timeout)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)
                                      or not math.isfinite(value) or value <= 0):
                raise ValidationError(label, f"must be a positive number of seconds, not {value!r}")
        if not isinstance(prefix, str):
            raise ValidationError("prefix", f"must be a string, not {type(prefix).__name__}")
        for tool_name, mode in (modes or {}).items():
            if mode not in ("exclusive", "parallel"):
                raise ValidationError(f"modes.{tool_name}", "must be 'exclusive' or 'parallel'")
        self._target = target
        self.name = name or target.describe()
        self.call_timeout = call_timeout
        self.connect_timeout = connect_timeout
        self._modes = dict(modes or {})
        self._prefix = prefix
        self._tools: tuple[Tool, ...] = ()
        self._listed: tuple[mcp_types.Tool, ...] = ()
        self._session: ClientSession | None = None
        self._owner: asyncio.Task[None] | None = None
        self._closing: asyncio.Event | None = None
        #: Set (with the reason) when the connection can no longer answer: every call in
        #: flight, and every later one, fails with it.
        self._broken: asyncio.Future[McpToolError] | None = None
        #: Set when the server sent a message that cannot be decoded: the calls in flight
        #: fail with it (their answers may have been that message); then it is renewed.
        self._garbage: asyncio.Future[McpToolError] | None = None
        self._closed = False
        self._ready: asyncio.Future[None] | None = None

    @classmethod
    def stdio(cls, command: str, args: Sequence[str] = (), *,
              env: Mapping[str, str] | None = None, cwd: str | os.PathLike[str] | None = None,
              name: str | None = None, call_timeout: float | None = None,
              connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
              modes: Mapping[str, ToolMode] | None = None, prefix: str = "") -> McpServer:
        """A server run as a subprocess (*command* *args*), spoken to over its standard input
        and output. *env* is added to the SDK's safe default environment."""
        if not isinstance(command, str) or not command:
            raise ValidationError("command", "must be a non-empty string")
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            raise ValidationError("args", "must be a sequence of strings")
        return cls(_Stdio(command, tuple(args), env, None if cwd is None else str(Path(cwd))),
                   name=name, call_timeout=call_timeout, connect_timeout=connect_timeout,
                   modes=modes, prefix=prefix)

    @classmethod
    def http(cls, url: str, *, headers: Mapping[str, str] | None = None,
             name: str | None = None, call_timeout: float | None = None,
             connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
             modes: Mapping[str, ToolMode] | None = None, prefix: str = "") -> McpServer:
        """A server at a streamable HTTP endpoint (e.g. ``http://127.0.0.1:8000/mcp``);
        *headers* are sent with every request (authorization)."""
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValidationError("url", f"must be an http:// or https:// URL, not {url!r}")
        return cls(_Http(url, headers), name=name, call_timeout=call_timeout,
                   connect_timeout=connect_timeout, modes=modes, prefix=prefix)

    # ------------------------------------------------------------------
    # Lifecycle
    # ------------------------------------------------------------------

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The server's tools as agent tools (after `start`)."""
        if self._owner is None:
            raise RuntimeError(f"MCP server {self.name}: start() it before asking for its tools")
        return self._tools

    @property
    def listed(self) -> tuple[mcp_types.Tool, ...]:
        """The tools as the server listed them (the SDK's objects)."""
        return self._listed

    @property
    def connected(self) -> bool:
        """Whether calls can be made: started, not closed, the connection not lost."""
        return (self._session is not None and not self._closed
                and self._broken is not None and not self._broken.done())

    async def start(self) -> McpServer:
        """Start the server, complete the handshake and list its tools (once; later calls
        return at once). Raises `McpConnectError` naming what failed."""
        if self._closed:
            raise McpConnectError(f"MCP server {self.name}: closed; make a new McpServer")
        if self._owner is not None:
            return self
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        self._closing = asyncio.Event()
        self._broken = loop.create_future()
        self._garbage = loop.create_future()
        self._ready = ready
        self._owner = loop.create_task(self._connection(ready), name=f"mcp {self.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), self.connect_timeout)
        except TimeoutError:
            await self.close()
            if ready.done() and not ready.cancelled():
                ready.exception()       # retrieved: the timeout is what start() reports
            raise McpConnectError(f"MCP server {self.name}: no handshake after "
                                  f"{self.connect_timeout:g} s") from None
        except McpConnectError:
            await self.close()
            raise
        except BaseException:
            await self.close()
            raise
        return self

    async def close(self) -> None:
        """End the session and stop the server (idempotent; waits until it is done)."""
        self._closed = True
        owner = self._owner
        if owner is None:
            return
        if self._closing is not None:
            self._closing.set()
        if self._ready is not None and not self._ready.done():
            owner.cancel()              # still connecting: nothing waits for the close signal
        self._fail_calls(McpToolError(f"MCP server {self.name}: closed", "MCP_SERVER_GONE"))
        if owner is not asyncio.current_task():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(owner)

    async def __aenter__(self) -> McpServer:
        return await self.start()

    async def __aexit__(self, kind: type[BaseException] | None, error: BaseException | None,
                        trace: TracebackType | None) -> None:
        await self.close()

    async def _connection(self, ready: asyncio.Future[None]) -> None:
        """The task that owns the connection: enters the transport and the session, lists
        the tools, then holds them open until `close` (and leaves them, as the SDK needs,
        in this same task)."""
        assert self._closing is not None
        try:
            async with AsyncExitStack() as stack:
                read, write = (await stack.enter_async_context(self._target.transport()))[:2]
                session = await stack.enter_async_context(
                    ClientSession(read, write, message_handler=self._message))
                await session.initialize()
                self._listed = await self._list(session)
                self._tools = tuple(self._tool(listed) for listed in self._listed)
                self._session = session
                ready.set_result(None)
                await self._closing.wait()
                self._session = None
        except BaseException as error:
            self._session = None
            gone = McpToolError(f"MCP server {self.name}: the connection ended "
                                f"({_describe(error)})", "MCP_SERVER_GONE")
            self._fail_calls(gone)
            if not ready.done():
                ready.set_exception(error if isinstance(error, McpConnectError) else
                                    McpConnectError(f"MCP server {self.name}: cannot connect: "
                                                    f"{_describe(error)}"))
            elif not self._closed and not isinstance(error, asyncio.CancelledError):
                LOGGER.warning("MCP server %s: the connection ended: %s", self.name,
                               _describe(error))
            if isinstance(error, asyncio.CancelledError | KeyboardInterrupt | SystemExit):
                raise
        finally:
            self._fail_calls(McpToolError(f"MCP server {self.name}: the connection ended",
                                          "MCP_SERVER_GONE"))

    async def _list(self, session: ClientSession) -> tuple[mcp_types.Tool, ...]:
        tools: list[mcp_types.Tool] = []
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await session.list_tools(
                params=None if cursor is None else mcp_types.PaginatedRequestParams(cursor=cursor))
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        else:
            raise McpConnectError(f"MCP server {self.name}: tools/list gave more than "
                                  f"{MAX_PAGES} pages")
        names = [self._prefix + tool.name for tool in tools]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate is not None:
            raise McpConnectError(f"MCP server {self.name}: two tools are named {duplicate!r}")
        return tuple(tools)

    async def _message(self, message: Any) -> None:
        """The session's incoming messages: an exception is a message the transport could
        not decode (garbage), after which no answer can be trusted to arrive."""
        garbage = self._garbage
        if isinstance(message, Exception) and garbage is not None:
            self._garbage = asyncio.get_running_loop().create_future()
            garbage.set_result(McpToolError(f"MCP server {self.name} sent something that is "
                                            f"not an MCP message: {_describe(message)}",
                                            "MCP_GARBAGE"))

    def _fail_calls(self, error: McpToolError) -> None:
        broken = self._broken
        if broken is not None and not broken.done():
            broken.set_result(error)

    # ------------------------------------------------------------------
    # Tools
    # ------------------------------------------------------------------

    def _tool(self, listed: mcp_types.Tool) -> Tool:
        name = listed.name
        mode = self._modes.get(name)
        if mode is None:
            hints = listed.annotations
            mode = "parallel" if hints is not None and hints.read_only_hint else "exclusive"

        async def run(call: ToolCall) -> ToolResult:
            return await self.call(name, call.params, call.signal)

        schema: dict[str, JsonValue] = dict(listed.input_schema)
        return Tool(self._prefix + name, run, mode, listed.description, schema)

    async def call(self, name: str, arguments: Mapping[str, JsonValue],
                   signal: Signal | None = None) -> ToolResult:
        """Call the server's tool *name* (its own name, without the prefix); what the model
        sees (see the module docstring). Raises `McpToolError` when the server cannot
        answer, or `AbortError` when *signal* is aborted first (the server is told)."""
        session, broken, garbage = self._session, self._broken, self._garbage
        if session is None or broken is None or garbage is None or self._closed:
            raise McpToolError(f"MCP server {self.name}: not connected", "MCP_NOT_CONNECTED")
        if broken.done():
            raise broken.result()
        if not isinstance(arguments, Mapping):
            raise ToolArgumentError("arguments", "must be a JSON object")
        request = asyncio.ensure_future(session.call_tool(
            name, dict(arguments), read_timeout_seconds=self.call_timeout))
        waits: set[asyncio.Future[Any]] = {request, broken, garbage}
        aborted: asyncio.Future[Any] | None = None
        if signal is not None:
            aborted = asyncio.ensure_future(signal.wait())
            waits.add(aborted)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            if aborted is not None and not aborted.done():
                aborted.cancel()
            if not request.done():
                request.cancel()           # the SDK tells the server: notifications/cancelled
                await asyncio.wait({request})
        if request.cancelled():
            if signal is not None and signal.aborted:
                signal.raise_if_aborted()
            if broken.done():
                raise broken.result()
            if garbage.done():
                raise garbage.result()
            raise asyncio.CancelledError()
        error = request.exception()
        if error is not None:
            raise self._failure(name, error) from error
        return _result(request.result())

    def _failure(self, name: str, error: BaseException) -> McpToolError:
        where = f"MCP server {self.name}, tool {name!r}"
        if isinstance(error, MCPError):
            code = error.error.code
            if code == mcp_types.CONNECTION_CLOSED:      # exited, or hung up: no more calls
                gone = McpToolError(f"{where}: the server closed the connection",
                                    "MCP_SERVER_GONE")
                self._fail_calls(gone)
                return gone
            if code == mcp_types.REQUEST_TIMEOUT:
                return McpToolError(f"{where}: no answer after {self.call_timeout:g} s",
                                    "MCP_TIMEOUT")
            if code in _GARBAGE_CODES:
                return McpToolError(f"{where}: {error.error.message}", "MCP_GARBAGE")
            return McpToolError(f"{where}: {error.error.message} (JSON-RPC error {code})",
                                "MCP_ERROR")
        if isinstance(error, pydantic.ValidationError):
            return McpToolError(f"{where}: the answer is not an MCP tool result: "
                                f"{_first_problem(error)}", "MCP_GARBAGE")
        return McpToolError(f"{where}: {_describe(error)}", "MCP_ERROR")


def _result(result: mcp_types.CallToolResult) -> ToolResult:
    """What the model sees of a ``tools/call`` result (see the module docstring)."""
    blocks: list[JsonValue] = []
    other: list[JsonValue] = []
    for item in result.content:
        if isinstance(item, mcp_types.TextContent):
            blocks.append({"type": "text", "text": item.text})
            continue
        raw = item.model_dump(mode="json", by_alias=True, exclude_none=True)
        other.append(raw)
        resource = getattr(item, "resource", None)
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            blocks.append({"type": "text", "text": text})
        else:
            mime = raw.get("mimeType") or (raw.get("resource") or {}).get("mimeType") or "?"
            blocks.append({"type": "text", "text": f"[{item.type} content ({mime}) not shown]"})
    structured = result.structured_content
    if structured is not None and not blocks:
        blocks.append({"type": "text", "text": json.dumps(structured, ensure_ascii=False)})
    meta: dict[str, JsonValue] = {}
    if structured is not None:
        meta["structuredContent"] = structured
    if other:
        meta["content"] = other
    value: dict[str, JsonValue] = {"content": blocks}
    if result.is_error:
        value["isError"] = True
        value["error"] = {"name": "McpToolError", "code": "MCP_TOOL_ERROR"}
    if meta:
        value["meta"] = {"mcp": meta}
    return ToolResult.from_json(value)


def _describe(error: BaseException) -> str:
    if isinstance(error, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in error.exceptions)
    if isinstance(error, pydantic.ValidationError):
        return _first_problem(error)
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _first_problem(error: pydantic.ValidationError) -> str:
    problems = error.errors()
    if not problems:
        return str(error)
    first = problems[0]
    where = ".".join(str(part) for part in first.get("loc", ()))
    return f"{where}: {first.get('msg', '')}" if where else str(first.get("msg", ""))

