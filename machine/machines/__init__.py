"""The four explicit state machines of the agent core.

Each module owns one machine: its transition table at the top, declared with
the ``transitions`` library (the single source of truth for which transitions
exist and for the diagrams), and a table compiled once from that declaration
for dispatch on the hot path (a dict lookup instead of a ``transitions``
trigger). ``tests/test_machines.py`` proves the two agree.
"""

from machine.machines.inbox import Inbox
from machine.machines.lifecycle import Lifecycle
from machine.machines.outbox import Outbox
from machine.machines.window import Window

__all__ = ["Inbox", "Lifecycle", "Outbox", "Window"]
