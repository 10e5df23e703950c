"""The retry policy handed to request-error handlers (specs/runtime.md RT16)."""

from __future__ import annotations

import asyncio

import pytest
from scenario_helpers import at

from machine.checking.scripted import Driver, model_failure
from machine.checking.testing import environment
from machine.core import AgentCore, CoreConfig
from machine.errors import ValidationError
from machine.events import Event
from machine.io import Effect, Output
from machine.jsonvalue import thaw
from machine.payloads import TurnEndData
from machine.runtime import (
    RETRY,
    Agent,
    ModelFailure,
    Next,
    RequestErrorContext,
    RetryAction,
    RetryPolicy,
    ScriptedModel,
    retry_request,
    text_reply,
)
from machine.vocabulary import LlmFailure, user_message

RATE = LlmFailure("slow down", "RATE_LIMITED", 429)
AUTH = LlmFailure("bad key", "AUTHENTICATION_FAILED", 401)


def test_RT16_delay_backs_off_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(max_attempts=10, base_delay=0.5, multiplier=2, max_delay=3, jitter=0)
    assert [policy.delay(RATE, n) for n in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert policy.backoff(1000) == 3                     # no overflow


def test_RT16_jitter_takes_a_random_fraction_off() -> None:
    draws = iter([0.0, 0.5, 0.999])
    policy = RetryPolicy(max_attempts=5, base_delay=1, jitter=0.5, random=lambda: next(draws))
    assert [policy.delay(RATE, 1) for _ in range(3)] == [1.0, 0.75, pytest.approx(0.5005)]
    full = RetryPolicy(base_delay=2, jitter=1, random=lambda: 0.25)
    assert full.delay(RATE, 1) == 1.5


def test_RT16_retry_after_is_a_minimum_and_too_long_a_wait_gives_up() -> None:
    policy = RetryPolicy(base_delay=0.1, jitter=0, max_retry_after=10)
    asks = LlmFailure("wait", "RATE_LIMITED", 429, provider_retry_after_ms=2500)
    assert policy.delay(asks, 1) == 2.5
    shorter = LlmFailure("wait", "RATE_LIMITED", 429, provider_retry_after_ms=10)
    assert policy.delay(shorter, 1) == 0.1                # the backoff is longer
    too_long = LlmFailure("wait", "RATE_LIMITED", 429, provider_retry_after_ms=60_000)
    assert policy.delay(too_long, 1) is None
    ignoring = RetryPolicy(base_delay=0.1, jitter=0, honour_retry_after=False)
    assert ignoring.delay(too_long, 1) == 0.1


def test_RT16_only_transient_failures_are_retried_within_the_attempts() -> None:
    policy = RetryPolicy(max_attempts=3, jitter=0)
    assert policy.delay(RATE, 1) is not None and policy.delay(RATE, 2) is not None
    assert policy.delay(RATE, 3) is None                  # the third request was the last
    assert policy.delay(AUTH, 1) is None
    assert policy.retryable(LlmFailure("x", "ANY", 503))
    assert policy.retryable(LlmFailure("x", "ANY", 408))
    assert not policy.retryable(LlmFailure("x", "ANY", 400))
    assert not policy.retryable(LlmFailure("x", "CONTEXT_LENGTH_EXCEEDED", None))
    custom = RetryPolicy(retry_codes=frozenset({"FLAKY"}), retry_statuses=frozenset())
    assert custom.retryable(LlmFailure("x", "FLAKY")) and not custom.retryable(RATE)


@pytest.mark.parametrize("options", [
    {"max_attempts": 0}, {"max_attempts": 1.5}, {"base_delay": -1}, {"multiplier": 0},
    {"max_delay": float("nan")}, {"jitter": 2}, {"jitter": -0.1}, {"max_retry_after": True},
    {"honour_retry_after": "yes"}, {"random": 3},
])
def test_RT16_a_malformed_policy_is_refused(options: dict[str, object]) -> None:
    with pytest.raises(ValidationError, match="retry_policy"):
        RetryPolicy(**options)  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="attempt"):
        RetryPolicy().delay(RATE, 0)


def _failing_then(n: int) -> ScriptedModel:
    return ScriptedModel([ModelFailure("slow down", "RATE_LIMITED", status=429)] * n
                         + [text_reply("done")])


def _run(agent: Agent, prompt: str = "hi") -> list[Event]:
    async def main() -> list[Event]:
        async with agent:
            agent.followup(prompt)
            await agent.when_idle(timeout=60)
            return list(agent.session.events)
    return asyncio.run(main())


def _summary(events: list[Event]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for event in events:
        if event.type == "turn/start":
            out.append(("start", str(at(event.data, "trigger", "kind"))))
        elif event.type == "turn/end":
            out.append(("end", event.data_as(TurnEndData).reason.kind))
    return out


def test_RT16_retry_request_retries_each_failure_as_a_new_turn_until_the_attempts_end() -> None:
    agent = Agent(_failing_then(5), retry_policy=RetryPolicy(max_attempts=3, base_delay=0.001,
                                                             jitter=0))
    agent.hooks.request_error.use(retry_request)
    assert _summary(_run(agent)) == [("start", "message"), ("end", "error"),
                                     ("start", "retry"), ("end", "error"),
                                     ("start", "retry"), ("end", "error")]

    agent = Agent(_failing_then(1), retry_policy=RetryPolicy(base_delay=0.001))
    agent.hooks.request_error.use(retry_request)
    assert _summary(_run(agent)) == [("start", "message"), ("end", "error"),
                                     ("start", "retry"), ("end", "completed")]


@pytest.mark.parametrize("max_attempts", [1, 2, 4])
def test_RT16_a_chain_makes_exactly_max_attempts_requests_asking_the_policy_each_time(
        max_attempts: int) -> None:
    """R13.4: `retry_request` asks the policy about the attempt that just failed (1 for the
    first request of the chain, its prior failures plus one), and a chain of failures makes
    exactly *max_attempts* requests, one turn each, the last ending the chain."""
    asked: list[int] = []

    class Counting(RetryPolicy):
        def delay(self, failure: LlmFailure, attempt: int) -> float | None:
            asked.append(attempt)
            return super().delay(failure, attempt)

    model = _failing_then(max_attempts + 2)
    agent = Agent(model, retry_policy=Counting(max_attempts=max_attempts, base_delay=0.001))
    agent.hooks.request_error.use(retry_request)
    turns = _summary(_run(agent))
    assert asked == list(range(1, max_attempts + 1))
    assert turns == [("start", "message"), ("end", "error")] + [
        ("start", "retry"), ("end", "error")] * (max_attempts - 1)


def test_RT16_handlers_get_the_agents_or_the_adapters_policy() -> None:
    seen: list[RetryPolicy] = []

    async def spy(context: RequestErrorContext, next_: Next[RetryAction | None]
                  ) -> RetryAction | None:
        seen.append(context.retry_policy)
        return await next_()

    mine = RetryPolicy(max_attempts=7)
    agent = Agent(_failing_then(1), retry_policy=mine)
    agent.hooks.request_error.use(spy)
    _run(agent)
    model = _failing_then(1)
    adapters = RetryPolicy(max_attempts=4)
    model.retry_policy = adapters  # type: ignore[attr-defined]
    other = Agent(model)
    other.hooks.request_error.use(spy)
    _run(other)
    plain = Agent(_failing_then(1))
    plain.hooks.request_error.use(spy)
    _run(plain)
    assert seen == [mine, adapters, RetryPolicy()]
    assert other.retry_policy is adapters
    with pytest.raises(TypeError, match="RetryPolicy"):
        Agent(_failing_then(0), retry_policy={"max_attempts": 2})  # type: ignore[arg-type]


def test_RT16_an_inner_decision_wins_and_a_cancel_during_the_wait_gives_no_retry() -> None:
    async def never(context: RequestErrorContext, next_: Next[RetryAction | None]
                    ) -> RetryAction | None:
        return RETRY if context.turn == 1 else None

    agent = Agent(_failing_then(1), retry_policy=RetryPolicy(max_attempts=1))
    agent.hooks.request_error.use(retry_request)
    agent.hooks.request_error.use(never)           # inner: asks for the retry itself
    assert _summary(_run(agent))[-1] == ("end", "completed")

    async def main() -> list[Event]:
        slow = Agent(_failing_then(1), retry_policy=RetryPolicy(base_delay=3600, jitter=0))
        slow.hooks.request_error.use(retry_request)
        waiting = asyncio.Event()

        async def mark(context: RequestErrorContext, next_: Next[RetryAction | None]
                       ) -> RetryAction | None:
            waiting.set()
            return await next_()
        slow.hooks.request_error.use(mark, prepend=True)
        async with slow:
            slow.followup("hi")
            await asyncio.wait_for(waiting.wait(), 30)
            slow.cancel()                           # the hour-long wait ends now
            await slow.when_idle(timeout=30)
            return list(slow.session.events)
    assert _summary(asyncio.run(main())) == [("start", "message"), ("end", "aborted")]


def test_RT16_the_scripted_environment_hands_its_policy_too() -> None:
    seen: list[tuple[int, RetryPolicy]] = []

    async def spy(context: RequestErrorContext, next_: Next[RetryAction | None]
                  ) -> RetryAction | None:
        seen.append((len(context.prior_failures), context.retry_policy))
        return await next_()

    policy = RetryPolicy(max_attempts=2, base_delay=0)
    env = environment(retry_policy=policy, replies=[
        model_failure("slow down", "RATE_LIMITED", status=429),
        model_failure("slow down", "RATE_LIMITED", status=429), text_reply("never")])
    env.hooks.request_error.use(retry_request)
    env.hooks.request_error.use(spy)
    core = AgentCore(CoreConfig(request_options={"provider": "p", "model": "m"}))
    driver = Driver(core, env)
    env.attach(driver)
    core.followup(user_message("u1", "hi"))
    driver.run()
    assert seen == [(0, policy), (1, policy)]       # a retry, then the attempts are used up
    assert [at(e.data, "trigger", "kind") for e in core.log.events if e.type == "turn/start"] == [
        "message", "retry"]


def test_RT16_a_policy_is_json_both_ways_and_a_bad_one_is_named() -> None:
    policy = RetryPolicy(max_attempts=5, base_delay=0.25, jitter=0, retry_codes=frozenset({"A"}),
                         retry_statuses=frozenset({429, 503}))
    data = policy.to_json()
    assert data["retryCodes"] == ["A"] and data["retryStatuses"] == [429, 503]
    assert RetryPolicy.from_json(data) == policy
    assert RetryPolicy.from_json({}) == RetryPolicy()
    draws = iter([0.5])
    jittered = RetryPolicy.from_json({"jitter": 1, "baseDelay": 2}, random=lambda: next(draws))
    assert jittered.delay(RATE, 1) == 1.0
    for bad, where in [([], "must be a mapping"), ({"mode": "normal"}, "unexpected field"),
                       ({"maxAttempts": 0}, "max_attempts"), ({"retryCodes": "A"}, "retryCodes"),
                       ({"retryStatuses": [429.0]}, "retryStatuses")]:
        with pytest.raises(ValidationError, match=where):
            RetryPolicy.from_json(bad)


class _PreparingModel(ScriptedModel):
    """A model adapter whose preparation names a retry policy of its own for one route."""

    async def prepare(self, draft: object) -> dict[str, object]:
        return {"config": {"provider": "p", "model": "m"},
                "retryPolicy": RetryPolicy(max_attempts=9).to_json()}


def test_RT16_the_failed_request_s_policy_passes_through_the_core_to_the_handlers() -> None:
    # R9.6, R13.2: the runtime names its agent's policy beside each header; the core hands
    # the failed request's policy to recovery; a preparer's own policy wins over the agent's.
    seen: list[RetryPolicy] = []
    payloads: list[object] = []

    async def spy(context: RequestErrorContext, next_: Next[RetryAction | None]
                  ) -> RetryAction | None:
        seen.append(context.retry_policy)
        return await next_()

    mine = RetryPolicy(max_attempts=7, jitter=0)
    agent = Agent(_failing_then(1), retry_policy=mine)
    agent.hooks.request_error.use(spy)
    agent.on("*", lambda e: None)

    def spying(output: Output) -> None:       # every output, as the agent delivers it
        if isinstance(output, Effect) and output.kind == "request-error":
            payloads.append(thaw(output.payload).get("retryPolicy"))
    agent.observe(spying)
    _run(agent)
    assert payloads == [mine.to_json()] and seen == [mine] and seen[0] is mine
    assert all("retryPolicy" not in thaw(e.data["header"])
               for e in agent.session.events if e.type == "request/header")

    own = Agent(_PreparingModel([ModelFailure("slow down", "RATE_LIMITED", status=429),
                                 text_reply("done")]), retry_policy=mine)
    own.hooks.request_error.use(spy)
    _run(own)
    assert seen[1] == RetryPolicy(max_attempts=9) and seen[1].random is mine.random
