"""Run every ```python block of a Markdown file as written: ``python tests/readme_examples.py README.md``.

Used by ``tests/test_readme.py`` (in the development environment) and by
``tests/test_packaging.py`` (in a fresh environment where only the built wheel is
installed), so this file needs nothing but the standard library.

Rules, stated in the README's "Working on turnstile":

* each block runs in its own interpreter, from an empty temporary directory, as a
  script (``__name__ == "__main__"``); line numbers in tracebacks are the README's;
* functions named ``test_*`` that a block defines are then called, as pytest would;
* when the next fenced block after a python block (only blank lines between) is a
  ``text`` block, the python block's standard output must be exactly that text;
* a block preceded by ``<!-- readme: not run (REASON) -->`` (on the line just before
  its fence, blank lines allowed between) is not run and is reported with its reason.

Prints one line per block and a summary ``ran N python blocks of FILE (M not run)``;
exits 1 when a block fails, 2 when the file has no python block at all.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

FENCE = re.compile(r"^```(\w*)\s*$")
NOT_RUN = re.compile(r"^<!--\s*readme:\s*not run\s*\((?P<reason>[^)]+)\)\s*-->\s*$")

#: Runs one block: compiled under the README's name, padded so its line numbers are the file's.
DRIVER = """\
import sys
source_name, first_line = sys.argv[1], int(sys.argv[2])
code = "\\n" * (first_line - 1) + sys.stdin.read()
namespace = {"__name__": "__main__"}
exec(compile(code, source_name, "exec"), namespace)
for name, value in list(namespace.items()):
    if name.startswith("test_") and callable(value):
        value()
"""


@dataclass(frozen=True)
class Block:
    line: int                 # the 1-based line of the block's first code line
    code: str
    expected: str | None      # the text block that follows, if any
    not_run: str | None       # the reason given by the marker, if any


def blocks(text: str) -> list[Block]:
    """The python blocks of a Markdown text, with their expected outputs and markers."""
    lines = text.split("\n")
    fences: list[tuple[str, int, int, str]] = []   # (language, first code line, end, code)
    index = 0
    while index < len(lines):
        match = FENCE.match(lines[index])
        if match is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and lines[end].rstrip() != "```":
            end += 1
        fences.append((match.group(1), index + 1, end, "\n".join(lines[index + 1:end]) + "\n"))
        index = end + 1
    found: list[Block] = []
    for position, (language, first, end, code) in enumerate(fences):
        if language != "python":
            continue
        expected = None
        if position + 1 < len(fences):
            next_language, next_first, _, next_code = fences[position + 1]
            between = lines[end + 1:next_first - 1]
            if next_language == "text" and all(not line.strip() for line in between):
                expected = next_code
        marker = first - 2   # the fence's own line is first - 1 (0-based: first - 1 - 1)
        while marker >= 0 and not lines[marker].strip():
            marker -= 1
        reason = NOT_RUN.match(lines[marker]) if marker >= 0 else None
        found.append(Block(first + 1, code, expected, reason.group("reason") if reason else None))
    return found


def run_block(block: Block, source: str, python: str, cwd: str) -> str | None:
    """Run one block; None when it held, else what went wrong."""
    result = subprocess.run([python, "-c", DRIVER, source, str(block.line)], input=block.code,
                            capture_output=True, text=True, cwd=cwd, timeout=300)
    if result.returncode != 0:
        return f"exit status {result.returncode}\n{result.stdout}{result.stderr}"
    if block.expected is not None and result.stdout != block.expected:
        return (f"printed:\n{result.stdout}\nbut the text block after it says:\n"
                f"{block.expected}")
    return None


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else Path("README.md")
    python = argv[1] if len(argv) > 1 else sys.executable
    found = blocks(path.read_text(encoding="utf-8"))
    if not found:
        print(f"{path}: no python block")
        return 2
    failed = 0
    skipped = 0
    with tempfile.TemporaryDirectory(prefix="readme-") as empty:
        for block in found:
            if block.not_run is not None:
                skipped += 1
                print(f"{path}:{block.line}: not run ({block.not_run})")
                continue
            problem = run_block(block, str(path), python, empty)
            checked = " and its output" if block.expected is not None else ""
            if problem is None:
                print(f"{path}:{block.line}: ran{checked}: ok")
            else:
                failed += 1
                print(f"{path}:{block.line}: FAILED: {problem}")
    ran = len(found) - skipped
    print(f"ran {ran} python block{'' if ran == 1 else 's'} of {path} ({skipped} not run), "
          f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
