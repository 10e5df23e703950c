"""R20, invariants (specs/core.md §20): R20.3 request reconstruction, the messages of each model
request being the derived history of the log before its step's step/start and its header the
log's most recent request/header.

The agent invariants are checked by tests/test_invariants.py and the explorer
(tests/test_explore.py). Each test here drives the machine (`AgentCore`) and the reference model
(`ModelAgent`) with the same inputs through the scripted driver, and requires the behaviour of
the rule of both.
"""

from __future__ import annotations

from scenario_helpers import Scenario, both, msg, result_with_contexts, scenario

from machine.checking.scripted import calls_reply, ok_result
from machine.io import Durable, Effect
from machine.jsonvalue import thaw
from machine.log import derive_history


def log_length_at(s: Scenario, effect: Effect) -> int:
    """The log's length when *effect* was requested: the durable outputs pulled before it."""
    count = 0
    for output in s.outputs:
        if output == effect:
            return count
        if isinstance(output, Durable):
            count += 1
    raise LookupError(effect)


# --------------------------------------------------------------------------
# R20.3 request reconstruction
# --------------------------------------------------------------------------


@both
def test_R20_3_each_model_request_is_the_history_before_its_step_start_and_the_latest_header(
        impl: str) -> None:
    headers = iter([{"provider": "p", "model": "m1"}, {"provider": "p", "model": "m1"},
                    {"provider": "p", "model": "m2"}, {"provider": "p", "model": "m2"}])
    s = scenario(impl, calls_reply(("c1", "t")), calls_reply(("c2", "t")), "done", "second")
    s.handle("request", lambda _e: ("resolve", {"config": next(headers)}))
    s.env.tool_results["c1"] = result_with_contexts("one", msg("tool context", "plugin:t"))
    s.env.tool_results["c2"] = ok_result("two")
    s.inject("between turns")
    s.followup("go")
    s.observe("step/start", lambda _d: s.inject("staged at a step start"), once=True)
    s.run()
    s.followup("again")
    s.run()
    starts = [e.seq for e in s.of("step/start")]
    assert len(s.requests) == len(starts) == 4
    for request, start in zip(s.requests, starts, strict=True):
        history = request.history
        assert history is not None and request.payload["historyEnd"] == start
        assert [m.to_json() for m in history] == [m.to_json() for m in derive_history(s.events[:start])]
        logged = [thaw(e.data["header"]) for e in s.of("request/header")
                  if e.seq < log_length_at(s, request)]
        assert thaw(request.payload["header"]) == logged[-1]
    assert [thaw(e.data["header"])["config"]["model"] for e in s.of("request/header")] == ["m1", "m2"]
    assert "'staged at a step start';plugin:test" not in s.request(1)
    assert "'staged at a step start';plugin:test" in s.request(2)
