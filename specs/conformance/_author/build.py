"""Build the conformance corpus: play every scenario, review it, write its vector.

    .venv/bin/python specs/conformance/_author/build.py            # (re)write the vectors
    .venv/bin/python specs/conformance/_author/build.py --check    # exit 1 if any file is stale
    .venv/bin/python specs/conformance/_author/build.py A1 B3      # only ids starting with these

A scenario whose review (its assertions against scenarios.md and the spec)
fails is NOT written: it is reported as a suspected core bug, and the build
exits 1.
"""

from __future__ import annotations

import dataclasses
import importlib
import sys
import traceback
from pathlib import Path

HERE = Path(__file__).resolve().parent
VECTORS = HERE.parent / "vectors"
MODULES = ("scenarios_ab", "scenarios_cd", "scenarios_ef", "scenarios_gh", "matrix", "rules",
           "blindspots")

if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

from machine.conformance.authoring import REGISTRY, Scenario  # noqa: E402
from machine.conformance.vectors import dump_vector, parse_vector  # noqa: E402

#: Where the original implementation departs, per vector tagged differs-from-original: the
#: step of its first divergence when the corpus was run against it (specs/differences.md,
#: "How this was established"). Informative; written into the vectors as "original".
ORIGINAL_STEPS: dict[str, int] = {
    line.split("\t")[0]: int(line.split("\t")[1])
    for line in (HERE / "original-steps.tsv").read_text("utf-8").splitlines()
    if line and not line.startswith("#")}


def scenarios() -> list[Scenario]:
    for name in MODULES:
        importlib.import_module(name)
    return list(REGISTRY)


def build(prefixes: list[str] | None = None) -> tuple[dict[str, str], dict[str, str]]:
    """Play every scenario: (id -> vector text) for the reviewed ones, (id -> problem) for the rest."""
    texts: dict[str, str] = {}
    problems: dict[str, str] = {}
    for item in scenarios():
        if prefixes and not any(item.id.startswith(p) for p in prefixes):
            continue
        try:
            vector = item.build()
            if item.id in ORIGINAL_STEPS:
                vector = dataclasses.replace(vector, original_step=ORIGINAL_STEPS[item.id])
            text = dump_vector(vector)
            parse_vector(text, f"{item.id}.json")  # what is written must load
            texts[item.id] = text
        except Exception as exc:  # a failed review: report, do not write
            problems[item.id] = "".join(traceback.format_exception_only(exc)).strip()
            if not isinstance(exc, AssertionError):
                problems[item.id] += "\n" + "".join(traceback.format_tb(exc.__traceback__)[-3:])
    return texts, problems


def main(argv: list[str]) -> int:
    check = "--check" in argv
    prefixes = [a for a in argv if not a.startswith("--")] or None
    texts, problems = build(prefixes)
    stale: list[str] = []
    for vector_id, text in sorted(texts.items()):
        path = VECTORS / f"{vector_id}.json"
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            stale.append(vector_id)
            if not check:
                path.write_text(text, encoding="utf-8")
    if prefixes is None:
        known = set(texts) | set(problems)
        for path in sorted(VECTORS.glob("*.json")):
            if path.stem not in known:
                stale.append(path.stem)
                if not check:
                    path.unlink()
    for vector_id, problem in sorted(problems.items()):
        print(f"REVIEW FAILED {vector_id}: {problem}", file=sys.stderr)
    verb = "stale" if check else "written"
    print(f"{len(texts)} vectors reviewed, {len(stale)} {verb}, {len(problems)} review failures")
    return 1 if problems or (check and stale) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
