"""The reference model shares no code with the machine (issue 32; specs/ASSURANCE.md, "What the
model shares with the machine"): a block the two had in common would make a bug in it a bug of
both, which the differential test and the explorer, comparing the two, cannot see.

The check reads the two trees as text: a run of six or more code lines of ``model/`` that
stands in ``machine/`` too, line for line once white space is folded (blank lines, comments,
docstrings, lone punctuation and import lines aside), is a shared block. The shared
library the model may use (the vocabulary, JSON values, events, inputs and outputs, errors,
the session log) is imported, not copied, and ASSURANCE.md says why it is safe.
"""

from __future__ import annotations

import ast
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
RUN = 6
_PUNCTUATION = re.compile(r"^[\s()\[\]{},:.]*$")


def _code_lines(text: str) -> list[str]:
    """The lines of *text* that count: code, white space folded, without comments, docstrings,
    imports and lines of punctuation only."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        first = body[0] if isinstance(body, list) and body else None
        if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)):
            docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    comments: dict[int, int] = {}
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.start[1]
    lines: list[str] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if number in docstrings:
            continue
        if number in comments:
            line = line[:comments[number]]
        folded = " ".join(line.split())
        if (not folded or _PUNCTUATION.match(folded) or folded.startswith(("import ", "from "))):
            continue
        lines.append(folded)
    return lines


def shared_runs(model: str, machine: list[str]) -> list[list[str]]:
    """The runs of at least `RUN` consecutive code lines of *model* that stand, in the same
    order, in one of the *machine* texts."""
    wanted = _code_lines(model)
    windows: set[tuple[str, ...]] = set()
    for text in machine:
        lines = _code_lines(text)
        windows.update(tuple(lines[i:i + RUN]) for i in range(len(lines) - RUN + 1))
    runs: list[list[str]] = []
    index = 0
    while index <= len(wanted) - RUN:
        if tuple(wanted[index:index + RUN]) in windows:
            runs.append(wanted[index:index + RUN])
            index += RUN
        else:
            index += 1
    return runs


def _machine_texts() -> list[str]:
    return [path.read_text(encoding="utf-8") for path in sorted((ROOT / "machine").rglob("*.py"))]


def test_the_model_shares_no_block_of_code_with_the_machine() -> None:
    model = (ROOT / "model" / "agent.py").read_text(encoding="utf-8")
    assert shared_runs(model, _machine_texts()) == []


def test_the_model_imports_nothing_of_the_machine_s_core() -> None:
    """The model reads its configuration by name; it imports no module of ``machine.core``
    (nor the loop's decisions), so none of the core's code runs in it."""
    tree = ast.parse((ROOT / "model" / "agent.py").read_text(encoding="utf-8"))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                 for alias in node.names}
    names = {f"{module}.{alias.name}" for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and (module := node.module)
             for alias in node.names}
    allowed = {"machine", "machine.events", "machine.io", "machine.jsonvalue", "machine.log",
               "machine.vocabulary", "machine.errors", "machine.checking.search"}
    machine = {m for m in imported if m and m.startswith("machine")}
    assert machine <= allowed, machine - allowed
    assert not any(name.startswith(("machine.core", "machine.decisions")) for name in names)


def test_the_check_finds_a_block_the_earlier_model_shared_with_the_machine() -> None:
    """The model before issue 32 restated the core's input dispatch (P9) line for line: the
    check finds it there, so it is not vacuous."""
    earlier = subprocess.run(["git", "show", "2d64295:model/agent.py"], cwd=ROOT,
                             capture_output=True, text=True)
    if earlier.returncode != 0:
        pytest.skip("needs the repository's history (git), to read the earlier model")
    runs = shared_runs(earlier.stdout, _machine_texts())
    assert runs, "the earlier model's copy of the input dispatch is no longer found"
    assert any("elif isinstance(item, Resolve):" in line for run in runs for line in run)
