"""R17, ``dispose()`` (specs/core.md §17): no new work while disposing, and the teardown that
reports what is still queued or staged.
"""

from __future__ import annotations

from typing import Any

from scenario_helpers import Scenario, msg

from machine.core import AgentCore, CoreConfig
from machine.io import Live
from machine.jsonvalue import thaw


def _types(outputs: list[Any]) -> list[str]:
    return [o.event.type for o in outputs if isinstance(o, Live)]


# --------------------------------------------------------------------------
# R17.4 teardown reports what is still queued or staged
# --------------------------------------------------------------------------


def test_R17_4_teardown_reports_a_quiet_queued_item_before_the_disposed_notices() -> None:
    core = AgentCore(CoreConfig(publish=False))
    core.dispose()                                   # idle, nothing pending: no discards yet
    quiet = msg("later", id="q1")
    core.send(quiet, {"target": "next-turn", "wakeup": False})   # R17.3: accepted until teardown
    outputs = core.drain_outputs()
    assert _types(outputs) == ["agent/inbox/enqueue", "agent/inbox/discard",
                               "agent/disposed", "session/disposed"]
    assert all(isinstance(o, Live) for o in outputs)
    assert thaw(outputs[1].event.payload) == {"messages": [quiet]}  # type: ignore[union-attr]
    assert core.disposed and core.pending_queued == 0
    assert core.drain_outputs() == []


def test_R17_4_teardown_reports_context_staged_while_disposing_after_the_turn_ends() -> None:
    s = Scenario()
    s.hold("model")
    s.followup("go")
    s.run()
    model = s.take("model")
    s.dispose()                                      # abort(disposed); the turn is still running
    late = msg("late context", "plugin:p", id="ctx1")
    s.inject(late)                                   # window open: staged as context (R5.2)
    assert s.core.pending_context == 1
    s.model_honours_abort(model)
    assert s.reasons() == ["disposed"]
    assert s.core.disposed and s.core.pending_context == 0
    tail = [o for o in s.outputs if isinstance(o, Live)][-3:]
    assert _types(tail) == ["agent/context/discard", "agent/disposed", "session/disposed"]
    assert thaw(tail[0].event.payload) == {"messages": [late]}
    assert s.live("agent/inbox/discard") == []       # only non-empty reports
    assert "late context" not in s.user_texts()
