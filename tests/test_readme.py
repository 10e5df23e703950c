"""The README's python examples run as written (``tests/readme_examples.py``).

The same runner is used by the packaging test in a fresh environment; here it runs in the
development environment, and the runner itself is tested on a small Markdown file.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import readme_examples

ROOT = Path(__file__).resolve().parents[1]
RUNNER = Path(readme_examples.__file__)


def run_runner(path: Path) -> tuple[int, str]:
    result = subprocess.run([sys.executable, str(RUNNER), str(path)], capture_output=True,
                            text=True, timeout=600)
    return result.returncode, result.stdout + result.stderr


def test_every_python_block_of_the_readme_runs_and_prints_what_it_shows() -> None:
    blocks = readme_examples.blocks((ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(blocks) >= 4                          # the short example, the loop, runtime, testing
    status, out = run_runner(ROOT / "README.md")
    ran = sum(block.not_run is None for block in blocks)
    assert status == 0, out
    assert out.splitlines()[-1] == (f"ran {ran} python blocks of {ROOT / 'README.md'} "
                                    f"({len(blocks) - ran} not run), 0 failed")
    assert sum(block.expected is not None for block in blocks) >= 2   # outputs are compared


def test_the_runner_fails_on_errors_wrong_output_and_failing_test_functions(
        tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("\n".join([
        "# a page", "",
        "```python", "print('hello')", "```", "",
        "```text", "hello", "```", "",
        "```python", "print('hullo')", "```",
        "```text", "hello", "```", "",
        "```python", "def test_it():", "    assert 1 == 2", "```", "",
        "<!-- readme: not run (needs an API key) -->", "",
        "```python", "raise SystemExit(9)", "```", "",
        "```python", "x = 1", "y = undefined_name", "```", "",
    ]) + "\n", encoding="utf-8")
    status, out = run_runner(page)
    lines = out.splitlines()
    assert status == 1
    assert lines[0] == f"{page}:4: ran and its output: ok"
    assert lines[1].startswith(f"{page}:12: FAILED: printed:")
    assert f"{page}:19: FAILED: exit status 1" in out and "assert 1 == 2" in out
    assert f"{page}:26: not run (needs an API key)" in lines
    # the traceback names the README's own line of the failing statement
    assert f'File "{page}", line 31' in out and "NameError" in out
    assert lines[-1] == f"ran 4 python blocks of {page} (1 not run), 3 failed"


def test_a_file_without_python_blocks_is_a_usage_error(tmp_path: Path) -> None:
    page = tmp_path / "empty.md"
    page.write_text("# nothing\n\n```sh\nls\n```\n", encoding="utf-8")
    assert run_runner(page) == (2, f"{page}: no python block\n")
