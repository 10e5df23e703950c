"""Provider adapters for the asyncio runtime (specs/runtime.md RT15).

Each adapter is a module that needs its provider's official SDK, installed as an extra:

* `machine.runtime.adapters.openai` — `OpenAIChat`, the Chat Completions streaming API
  (OpenAI, DeepSeek, vLLM, Ollama and compatible servers): ``pip install 'turnstile-agent[openai]'``;
* `machine.runtime.adapters.anthropic` — `AnthropicMessages`, the Messages streaming API:
  ``pip install 'turnstile-agent[anthropic]'``.

`machine.runtime.adapters.common` holds what they share (failure classification, usage,
history helpers, prompt abort) and `machine.runtime.adapters.fake_server` a local server
that streams scripted or recorded SSE, for tests. None of these is imported here, so
importing this package needs no SDK.
"""
