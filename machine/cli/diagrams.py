"""Diagrams and tables of the four machines and of the loop, generated from their declarations.

`dot_sources` renders each machine's Graphviz DOT with `machine.machines.table.to_dot`
from the table compiled out of the module's ``transitions`` declaration, and the loop's
graph (its activities and their phases, R4.13) with `machine.core.loop.to_dot` from its
declaration, so the diagrams cannot drift from the code without `check` noticing.
`markdown_table` renders the same tables for the pages in ``specs/machines/``; those
pages keep their hand-written prose and carry the table between two marker
comments, which `write` refreshes and `check` compares.

``turnstile diagrams --write specs/machines`` regenerates the files;
``--check specs/machines`` exits 1 naming every stale one; ``make diagrams``
also renders the SVGs with Graphviz ``dot`` (the SVGs are not checked).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Final

from machine.core import loop
from machine.machines import inbox, lifecycle, outbox, window
from machine.machines.table import Table, compile_table, to_dot

__all__ = ["DIAGRAMS", "LOOP", "MACHINES", "check", "dot_sources", "markdown_table", "tables",
           "write"]

#: machine name -> the module that declares it (NAME, STATES, INITIAL, ROWS, declared())
MACHINES: Final[Mapping[str, ModuleType]] = {m.NAME: m for m in (inbox, outbox, window, lifecycle)}
#: The name of the loop's graph among the diagrams (`machine.core.loop`).
LOOP: Final = "loop"
#: Every diagram: the four machines, then the loop.
DIAGRAMS: Final = (*MACHINES, LOOP)
#: Where each diagram is declared (for the problems `check` names).
_SOURCE: Final = {**{name: f"machine/machines/{name}.py" for name in MACHINES},
                  LOOP: "machine/core/loop.py"}

BEGIN_TABLE: Final = "<!-- BEGIN GENERATED TABLE: turnstile diagrams --write; do not edit by hand -->"
END_TABLE: Final = "<!-- END GENERATED TABLE -->"


def tables() -> dict[str, Table]:
    """Machine name -> the table compiled from its ``transitions`` declaration."""
    return {name: compile_table(module.declared()) for name, module in MACHINES.items()}


def dot_sources() -> dict[str, str]:
    """Diagram name -> Graphviz DOT source (deterministic): each machine, then the loop."""
    sources = {name: to_dot(MACHINES[name].NAME, MACHINES[name].STATES, MACHINES[name].INITIAL,
                            compiled) for name, compiled in tables().items()}
    sources[LOOP] = loop.to_dot()
    return sources


def markdown_table(name: str) -> str:
    """The transition table of machine *name* as Markdown, rows grouped by source state.

    Alternatives of one (state, trigger) are listed in dispatch order: the first
    whose guards hold wins, and a guard-free alternative after guarded ones is
    the fallback ("otherwise"). For the loop: one table per activity (`machine.core.loop`).
    """
    if name == LOOP:
        return loop.table_markdown()
    module = MACHINES[name]
    compiled = compile_table(module.declared())
    states: tuple[str, ...] = module.STATES
    trigger_order = {trigger: n for n, (_, trigger) in enumerate(compiled)}
    lines = [f"Initial state: `{module.INITIAL}`.", "",
             "| from | trigger | guard | to |", "|---|---|---|---|"]
    for (source, trigger), alternatives in sorted(
            compiled.items(), key=lambda item: (states.index(item[0][0]), trigger_order[item[0][1]])):
        guarded_before = False
        for need, unless, dest in alternatives:
            conditions = [*need, *(f"not {u}" for u in unless)]
            if conditions:
                guard = " and ".join(f"`{c}`" for c in conditions)
                guarded_before = True
            else:
                guard = "otherwise" if guarded_before else ""
            lines.append(f"| `{source}` | `{trigger}` | {guard} | `{dest}` |")
    return "\n".join(lines) + "\n"


def _with_table(page: str, name: str) -> str | None:
    """*page* with its generated table replaced, or None when it has no markers."""
    start = page.find(BEGIN_TABLE)
    end = page.find(END_TABLE, start + 1) if start >= 0 else -1
    if start < 0 or end < 0:
        return None
    return page[:start + len(BEGIN_TABLE)] + "\n" + markdown_table(name) + page[end:]


def _page_stub(name: str) -> str:
    title = "The loop's graph" if name == LOOP else f"The {name} machine"
    return (f"# {title}\n\n"
            f"Diagram: [{name}.svg]({name}.svg) (source: [{name}.dot]({name}.dot)).\n\n"
            f"## Transition table\n\n{BEGIN_TABLE}\n{markdown_table(name)}{END_TABLE}\n")


def write(directory: str | Path) -> list[Path]:
    """Write ``<name>.dot`` for every machine and refresh the table in ``<name>.md``.

    A missing page is created as a stub (title, links, table) to be completed
    by hand. Returns the paths whose contents changed.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    changed: list[Path] = []

    def put(path: Path, text: str) -> None:
        if not path.exists() or path.read_text(encoding="utf-8") != text:
            path.write_text(text, encoding="utf-8")
            changed.append(path)

    for name, dot in dot_sources().items():
        put(root / f"{name}.dot", dot)
        page_path = root / f"{name}.md"
        page = page_path.read_text(encoding="utf-8") if page_path.exists() else None
        updated = _with_table(page, name) if page is not None else None
        if updated is None:
            if page is not None:
                raise ValueError(f"{page_path}: has no generated-table markers ({BEGIN_TABLE!r} "
                                 f"... {END_TABLE!r}); add them where the table belongs")
            updated = _page_stub(name)
        put(page_path, updated)
    return changed


def check(directory: str | Path) -> list[str]:
    """Problems with the checked-in files under *directory*: one line per stale file."""
    root = Path(directory)
    problems: list[str] = []
    sources = dot_sources()
    for name, dot in sources.items():
        path = root / f"{name}.dot"
        if not path.exists():
            problems.append(f"{path}: missing")
        elif path.read_text(encoding="utf-8") != dot:
            problems.append(f"{path}: out of date with {_SOURCE[name]}")
        page_path = root / f"{name}.md"
        if not page_path.exists():
            problems.append(f"{page_path}: missing")
            continue
        page = page_path.read_text(encoding="utf-8")
        updated = _with_table(page, name)
        if updated is None:
            problems.append(f"{page_path}: has no generated transition table")
        elif updated != page:
            problems.append(f"{page_path}: transition table out of date with {_SOURCE[name]}")
    for path in sorted(root.glob("*.dot")):
        if path.stem not in sources:
            problems.append(f"{path}: no machine or loop named {path.stem!r}")
    return problems
