"""The distribution works from ``pip install``: built, installed fresh, used from an empty folder.

One test, in steps (each asserts what a new user would see):

1. the source tree is copied (what git tracks or would add, so caches and an in-place build
   cannot leak in) and ``python -m build`` makes the sdist and then the wheel *from the sdist*
   (so the sdist provably holds what a build needs); the sdist holds every file of the tree,
   tests and spec included;
2. the wheel installs only ``machine`` (the reference model as ``machine._model``, the spec
   and the conformance kit in ``machine/_specs``) and carries the metadata of
   ``turnstile-agent`` (SPDX license, license file, classifiers, the ``testing`` and
   ``typed`` extras);
3. it is installed into a fresh virtual environment without extras, and from an empty
   directory holding a hostile ``model.py`` the commands run: ``--version``, ``check`` (the
   shipped corpus), ``check --port "turnstile adapter" --tag scenario --json``, ``demo``,
   ``explore --model``, ``log validate`` of a shipped example, ``python -m
   machine.conformance.corpus --check`` (the corpus's authoring code rebuilds the shipped
   corpus); ``machine.checking.testing`` names its missing extra;
4. with the ``testing``, ``typed``, ``mcp`` and ``tracing`` extras and the OpenTelemetry
   SDK added, every python block of the README runs there.

Nothing is cached between runs except pip's own download cache of ``transitions``,
``hypothesis`` and ``pydantic``: the wheel is built from scratch each time.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SKIPPED_DIRS = {".git", ".venv", "build", "dist", "mutants", "__pycache__", ".mypy_cache",
                ".pytest_cache", ".ruff_cache", ".hypothesis", "_specs"}
HOSTILE_MODEL = "raise SystemExit('the user model.py was imported: it shadows turnstile')\n"


def _tree_files() -> list[str]:
    """The project's files, relative: git's view when there is one (tracked or addable)."""
    try:
        listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                                cwd=ROOT, capture_output=True, text=True, check=True).stdout
        files = [name for name in listed.splitlines() if (ROOT / name).is_file()]
    except (OSError, subprocess.CalledProcessError):   # an unpacked sdist: walk it
        files = [str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if p.is_file()
                 and not SKIPPED_DIRS & set(p.relative_to(ROOT).parts)
                 and not any(part.endswith(".egg-info") for part in p.parts)
                 and p.name not in ("PKG-INFO", "setup.cfg")]
    return sorted(name for name in files if not name.endswith((".pyc", ".pyo")))


def _run(argv: list[str], *, cwd: Path, env: dict[str, str], expect: int = 0,
         timeout: float = 600) -> str:
    result = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == expect, (
        f"{argv} exited {result.returncode} (expected {expect})\n{result.stdout}\n{result.stderr}")
    return result.stdout


def test_the_wheel_installs_alone_and_works_from_an_empty_directory(tmp_path: Path) -> None:
    # 1. build the sdist, then the wheel from it, from a clean copy of the tree
    files = _tree_files()
    source = tmp_path / "source"
    for name in files:
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, source / name)
    dist = tmp_path / "dist"
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    built = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir",
                            str(dist), str(source)], capture_output=True, text=True,
                           env=environ, timeout=600)
    assert built.returncode == 0, built.stdout + built.stderr
    assert "Deprecat" not in built.stdout + built.stderr     # no license-table warnings
    [sdist] = dist.glob("turnstile_agent-*.tar.gz")
    [wheel] = dist.glob("turnstile_agent-*-py3-none-any.whl")
    with tarfile.open(sdist) as archive:
        prefix = archive.getnames()[0].split("/")[0]
        in_sdist = {name.removeprefix(prefix + "/") for name in archive.getnames()}
    missing = [name for name in files if name not in in_sdist and name != ".gitignore"]
    assert not missing, f"the sdist lacks {missing[:10]}"

    # 2. the wheel: only `machine`, everything the tools read, the right metadata
    with zipfile.ZipFile(wheel) as archive:
        in_wheel = set(archive.namelist())
        info = next(n.split("/")[0] for n in in_wheel if n.endswith(".dist-info/METADATA"))
        metadata = archive.read(f"{info}/METADATA").decode()
    assert {name.split("/")[0] for name in in_wheel} == {"machine", info}
    modules = {f"machine/_model/{n.removeprefix('model/')}" if n.startswith("model/") else n
               for n in files if n.startswith(("machine/", "model/")) and n.endswith(".py")}
    assert modules <= in_wheel, f"the wheel lacks {sorted(modules - in_wheel)[:10]}"
    vectors = sorted(n for n in files if n.startswith("specs/conformance/vectors/"))
    kit = ("PROTOCOL.md", "README.md", "vector.schema.json", "corpus.json")
    shipped = {f"machine/_specs/{n.removeprefix('specs/')}" for n in vectors} | {
        f"machine/_specs/conformance/{n}" for n in kit} | {
        "machine/py.typed", "machine/_model/py.typed", "machine/_specs/core.md",
        "machine/_specs/protocol.md", "machine/_specs/examples/multi-turn-with-injection.jsonl",
        "machine/_specs/conformance/skeletons/adapter.ts"}
    assert shipped <= in_wheel, f"the wheel lacks {sorted(shipped - in_wheel)[:10]}"
    for line in ("Name: turnstile-agent", "License-Expression: MIT", "License-File: LICENSE",
                 "Requires-Dist: transitions>=0.9.1", "Provides-Extra: testing",
                 "Provides-Extra: typed",
                 "Classifier: Typing :: Typed", "Description-Content-Type: text/markdown"):
        assert line in metadata.splitlines(), line
    assert "\n# turnstile\n" in metadata and "pip install turnstile-agent" in metadata
    # the README's install section names the wheel `make wheel` writes, as it is named
    assert f"dist/{wheel.name}" in (ROOT / "README.md").read_text(encoding="utf-8")

    # 3. a fresh environment with the wheel alone, used from an empty directory
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=300)
    python = str(venv / "bin" / "python")
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "--quiet",
           "--disable-pip-version-check"]
    _run([*pip, str(wheel)], cwd=tmp_path, env=environ)
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "model.py").write_text(HOSTILE_MODEL, encoding="utf-8")
    env = {**environ, "PATH": f"{venv / 'bin'}{os.pathsep}{environ.get('PATH', '')}"}
    turnstile = str(venv / "bin" / "turnstile")

    assert _run([turnstile, "--version"], cwd=empty, env=env).startswith("turnstile ")
    assert _run([python, "-m", "machine", "--version"], cwd=empty, env=env).startswith(
        "turnstile ")
    version = _run([turnstile, "check", "--version"], cwd=empty, env=env)
    assert f"{len(vectors)} vectors" in version and str(venv) in version
    assert _run([turnstile, "check"], cwd=empty, env=env).splitlines()[-1] == \
        f"{len(vectors)} passed, 0 failed"
    lines = _run([turnstile, "check", "--port", "turnstile adapter", "--tag", "scenario",
                  "--json"], cwd=empty, env=env).splitlines()
    results, summary = [json.loads(line) for line in lines[:-1]], json.loads(lines[-1])
    scenarios = [n for n in vectors
                 if "scenario" in json.loads((ROOT / n).read_text(encoding="utf-8"))["tags"]]
    assert {r["status"] for r in results} == {"passed"} and len(results) == len(scenarios)
    assert summary["summary"]["failed"] == 0 and summary["exit"] == 0
    # the corpus's authoring code ships and imports cleanly: it rebuilds the shipped corpus
    corpus = _run([python, "-m", "machine.conformance.corpus", "--check"], cwd=empty, env=env)
    assert corpus.splitlines()[-1] == f"{len(vectors)} vectors reviewed, 0 stale, 0 review failures"
    demo = _run([turnstile, "demo"], cwd=empty, env=env)
    assert f"{len(vectors)}/{len(vectors)} vectors give exactly the core's outputs" in demo
    explored = json.loads(_run([python, "-m", "machine", "explore", "--model", "--depth", "2",
                                "--quiet", "--json"], cwd=empty, env=env))
    assert explored["ok"] and explored["model"]
    example = venv.glob("lib/python*/site-packages/machine/_specs/examples/"
                        "multi-turn-with-injection.jsonl")
    assert ": OK (37 events, 2 turns)" in _run([turnstile, "log", "validate", str(next(example))],
                                               cwd=empty, env=env)
    no_extra = subprocess.run([python, "-c", "import machine.checking.testing"], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=120)
    assert no_extra.returncode == 1
    assert "pip install 'turnstile-agent[testing]'" in no_extra.stderr
    isolated = subprocess.run([python, "-I", "-c", "import model"], cwd=empty, env=env,
                              capture_output=True, text=True, timeout=120)
    assert isolated.returncode == 1 and "No module named 'model'" in isolated.stderr

    # 4. with the extras they use (and the OpenTelemetry SDK, the application's choice of
    # tracing backend), the README's examples run as written
    _run([*pip, f"{wheel}[testing,typed,mcp,tracing]", "opentelemetry-sdk"], cwd=tmp_path,
         env=environ)
    readme = _run([python, str(ROOT / "tests" / "readme_examples.py"), str(ROOT / "README.md")],
                  cwd=empty, env=env)
    assert readme.splitlines()[-1].endswith(" not run), 0 failed"), readme
