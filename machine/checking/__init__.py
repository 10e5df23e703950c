"""Checking: what tests the core rather than runs it (specs/ASSURANCE.md).

* `machine.checking.search`, `machine.checking.alphabet`, `machine.checking.key`: the bounded
  exhaustive explorer, its decision alphabet and its state key;
* `machine.checking.reach`: which rule families and R19 cells a run exercised;
* `machine.checking.invariants`: the runtime invariants of R20.1, checked at every output;
* `machine.checking.strategies`: Hypothesis strategies of the vocabulary and events;
* `machine.checking.scripted`: a scripted environment that answers the core's effects;
* `machine.checking.testing`: testing an agent built on the runtime (the ``testing`` extra).

Nothing of the library (`machine.core`, `machine.runtime`) depends on this package but the
scripted replies the runtime's example models use.
"""
