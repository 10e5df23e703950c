"""The provider boundary (specs/providers.md): the request bodies the adapters send, built
from a history without any provider SDK, and the providers' rules over them.

* `machine.providers.chat` — a Chat Completions request (`chat_request`, `ChatBodies`);
* `machine.providers.messages` — a Messages API request (`messages_request`,
  `MessagesBodies`);
* `machine.providers.plan` — the conversation both send for any history (W2) and its
  incremental encoding (W10);
* `machine.providers.rules` — what the providers refuse (`chat_refusals`,
  `messages_refusals`, W3–W7);
* `machine.providers.check` — those rules over a core's requests (`RequestCheck`, W9,
  R20.5).
"""

from machine.providers.check import ProviderRuleError, RequestCheck, request_refusals
from machine.providers.rules import Refusal, chat_refusals, messages_refusals

__all__ = ["ProviderRuleError", "Refusal", "RequestCheck", "chat_refusals", "messages_refusals",
           "request_refusals"]
