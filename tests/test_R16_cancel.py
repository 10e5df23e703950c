"""R16, ``cancel(cause, {keepInbox})`` (specs/core.md §16).

The cancel scenarios (family E, tests/test_scenarios.py) run cancels at every moment of a
turn; these tests pin one rule each.
"""

from __future__ import annotations

from typing import Any

import pytest
from scenario_helpers import msg

from machine.core import AgentCore, CoreConfig
from machine.errors import ValidationError

# --------------------------------------------------------------------------
# R16.1 effective: the arguments are checked first (V8, V11)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("keep_inbox", ["yes", 1, None])
def test_R16_1_a_keepInbox_that_is_not_a_bool_raises_ValidationError_naming_it_and_does_nothing(
        keep_inbox: Any) -> None:
    core = AgentCore(CoreConfig(publish=False))
    core.send(msg("later"), {"target": "next-turn", "wakeup": False})   # a cancel would clear it
    core.drain_outputs()
    with pytest.raises(ValidationError) as raised:
        core.cancel({"kind": "user"}, keep_inbox)
    assert raised.value.path == "keepInbox"
    assert str(raised.value) == "keepInbox: must be a bool"
    assert core.pending_queued == 1                   # V11: nothing was done
    assert core.drain_outputs() == []
