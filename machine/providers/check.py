"""The provider boundary, checked (specs/providers.md W9, specs/core.md R20.5).

`request_refusals` builds, for a request header and a history, the body each adapter sends
(`chat_request`, `messages_request`) and runs the providers' rules over it (`rules`).
`RequestCheck` applies that to a running core: every model request the core asks for, and
the *continuation* of every log it reaches — its derived history followed by a new user
message, which is what a fork or a resume of the log at that point sends first — with the
log's latest header, with tools declared (so that calls are sent as tool calls) and
without. `InvariantMonitor` runs it at every output (R20.5); the explorer, the differential
and hostile-input tests, the conformance vectors and the store's crash, fork and compaction
tests reach it through the monitor or call it directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from machine.errors import TurnstileError
from machine.jsonvalue import FrozenDict, FrozenList, thaw
from machine.log import SessionLog
from machine.providers.chat import chat_request
from machine.providers.messages import messages_request
from machine.providers.rules import CHAT, MESSAGES, Refusal, chat_refusals, messages_refusals
from machine.vocabulary import Message, user_message

__all__ = ["ProviderRuleError", "RequestCheck", "continuation", "request_refusals",
           "with_tools"]

#: The config keys a header's config holds besides the request options.
_NAMES: Final = ("provider", "model")
#: The adapters' own body fields: a config option of these names is refused by them
#: (RT15), so the check leaves it out rather than build a body no adapter sends.
_RESERVED: Final = frozenset({"messages", "stream", "stream_options", "tools", "system"})
_DEFAULT_HEADER: Final = FrozenDict({"config": {"provider": "p", "model": "m"}})
#: The message a continuation ends with.
NEXT_PROMPT: Final = user_message("turnstile-next-prompt", "(next prompt)")


class ProviderRuleError(TurnstileError):
    """A request an adapter would send breaks a provider's rule (R20.5, W9)."""

    code = "PROVIDER_REFUSAL"

    def __init__(self, where: str, refusals: Sequence[tuple[str, Refusal]]) -> None:
        self.where = where
        self.refusals = list(refusals)
        lines = "; ".join(f"{dialect}: [{r.rule}] {r.where(dialect)}: {r.message}"  # type: ignore[arg-type]
                          for dialect, r in self.refusals)
        super().__init__(f"[R20.5] {where}: {lines}")


def _options(header: FrozenDict) -> dict[str, Any]:
    config = header.get("config")
    if not isinstance(config, FrozenDict):
        return {}
    return {key: thaw(value) for key, value in config.items()
            if key not in _NAMES and key not in _RESERVED}


def request_refusals(header: FrozenDict, history: Sequence[Message]
                     ) -> list[tuple[str, Refusal]]:
    """The refusals of the bodies both adapters build for *header* and *history*
    (``("chat", refusal)`` or ``("messages", refusal)``); empty when both are accepted."""
    options = _options(header)
    # an adapter always has a model of its own, for a header whose config names none
    chat = chat_request(header, history, model="model", options=options, stream=True)
    found: list[tuple[str, Refusal]] = [(CHAT, r) for r in chat_refusals(chat)]
    messages = messages_request(header, history, model="model", options=options, stream=True)
    found += [(MESSAGES, r) for r in messages_refusals(messages)]
    return found


def with_tools(header: FrozenDict, history: Sequence[Message]) -> FrozenDict:
    """*header* declaring a tool for every name the history calls (so that an adapter sends
    the calls as tool calls, W5.6), the header's own tools first."""
    tools = header.get("tools")
    declared = [spec for spec in tools] if isinstance(tools, FrozenList) else []
    names = {spec.get("name") for spec in declared if isinstance(spec, FrozenDict)}
    for message in history:
        for call in message.tool_calls:
            name = str(call.get("name"))
            if name not in names:
                names.add(name)
                declared.append(FrozenDict({"name": name,
                                            "parameters": {"type": "object", "properties": {}}}))
    return FrozenDict({**header, "tools": declared}) if declared else header


def continuation(log: SessionLog) -> tuple[FrozenDict, list[Message]]:
    """The log's latest header (a default one before any) and its derived history followed by
    a new user message: the first request of a fork or a resume at this point."""
    header = log.last_header if log.has_header else None
    return (header if isinstance(header, FrozenDict) else _DEFAULT_HEADER,
            [*log.history(len(log)), NEXT_PROMPT])


class RequestCheck:
    """Checks requests against the providers' rules, remembering the histories it has found
    valid (a history is remembered by the identity of its messages, which the entry holds,
    so a key is never reused by other messages)."""

    def __init__(self, *, limit: int = 50_000) -> None:
        self._limit = limit
        self._valid: dict[tuple[int, ...], tuple[object, ...]] = {}
        self.checked = 0

    def request(self, header: FrozenDict, history: Sequence[Message], where: str) -> None:
        """Raise `ProviderRuleError` if a body an adapter builds for *header* and *history*
        is refused; with tools declared too (W9)."""
        key = (id(header), *map(id, history))
        held = self._valid.get(key)
        if held is not None and held[0] is header and all(
                a is b for a, b in zip(held[1:], history, strict=True)):
            return
        self.checked += 1
        for variant in dict.fromkeys((header, with_tools(header, history))):
            found = request_refusals(variant, history)
            if found:
                raise ProviderRuleError(where, found)
        if len(self._valid) >= self._limit:
            self._valid.clear()
        self._valid[key] = (header, *history)

    def log(self, log: SessionLog, where: str) -> None:
        """Check the continuation of *log* (`continuation`)."""
        header, history = continuation(log)
        self.request(header, history, where)
