"""Declaring a machine with ``transitions`` and compiling its dispatch table.

A declaration is a list of `Row`s. `declared_machine` builds the
``transitions.Machine`` from it; `compile_table` reads that Machine back
(its events, sources, destinations and conditions) into a dict keyed by
``(state, trigger)``. Compiling from the built Machine, not from the rows,
keeps the library declaration the single source of truth.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from transitions import Machine

from machine.errors import TurnstileError


@dataclass(frozen=True, slots=True)
class Row:
    """One declared transition: on *trigger* in *source*, go to *dest* if every guard holds."""

    trigger: str
    source: str
    dest: str
    guards: tuple[str, ...] = ()
    unless: tuple[str, ...] = ()


#: (state, trigger) -> ordered alternatives (guards that must hold, guards that must not, dest)
Table = dict[tuple[str, str], tuple[tuple[tuple[str, ...], tuple[str, ...], str], ...]]


class TransitionError(TurnstileError):
    """A trigger that the machine's table does not allow in its current state (an internal bug)."""

    code = "ILLEGAL_TRANSITION"


def declared_machine(name: str, states: Sequence[str], rows: Sequence[Row], initial: str,
                     model: Any = None) -> Any:
    """The ``transitions.Machine`` for a declaration (used for diagrams and the agreement test)."""
    return Machine(
        model=model if model is not None else Machine.self_literal,
        states=list(states), initial=initial, name=name, auto_transitions=False,
        ignore_invalid_triggers=False,
        transitions=[{"trigger": r.trigger, "source": r.source, "dest": r.dest,
                      "conditions": list(r.guards), "unless": list(r.unless)} for r in rows],
    )


def compile_table(machine: Any) -> Table:
    """Read a built ``transitions.Machine`` back into a plain dispatch dict."""
    table: dict[tuple[str, str], list[tuple[tuple[str, ...], tuple[str, ...], str]]] = {}
    for trigger, event in machine.events.items():
        for source, alternatives in event.transitions.items():
            for transition in alternatives:
                guards = tuple(c.func for c in transition.conditions if c.target)
                unless = tuple(c.func for c in transition.conditions if not c.target)
                table.setdefault((source, trigger), []).append((guards, unless, transition.dest))
    return {key: tuple(value) for key, value in table.items()}


def step(table: Table, machine_name: str, state: str, trigger: str,
         guards: Mapping[str, bool] | None = None) -> str:
    """The destination of *trigger* in *state* (hot path: one dict lookup, guards evaluated in order)."""
    try:
        alternatives = table[(state, trigger)]
    except KeyError:
        raise TransitionError(
            f"{machine_name}: trigger {trigger!r} is not allowed in state {state!r}") from None
    for need, unless, dest in alternatives:
        if guards is None:
            if need or unless:
                raise TransitionError(f"{machine_name}: {trigger!r} in {state!r} is guarded; "
                                      "the guard values are required")
            return dest
        if all(guards[g] for g in need) and not any(guards[g] for g in unless):
            return dest
    raise TransitionError(f"{machine_name}: no guard of {trigger!r} holds in state {state!r}")


def to_dot(name: str, states: Sequence[str], initial: str, table: Table) -> str:
    """Graphviz DOT source for a compiled table (deterministic, for the checked-in diagrams)."""
    lines = [f'digraph "{name}" {{', "  rankdir=LR;",
             '  node [shape=box, style=rounded, fontname="Helvetica"];',
             '  edge [fontname="Helvetica", fontsize=10];', '  __start [shape=point];',
             f'  __start -> "{initial}";']
    for state in states:
        lines.append(f'  "{state}";')
    for (source, trigger), alternatives in sorted(table.items()):
        for need, unless, dest in alternatives:
            label = trigger
            conds = [*need, *(f"!{u}" for u in unless)]
            if conds:
                label += " [" + " & ".join(conds) + "]"
            lines.append(f'  "{source}" -> "{dest}" [label="{label}"];')
    lines.append("}")
    return "\n".join(lines) + "\n"
