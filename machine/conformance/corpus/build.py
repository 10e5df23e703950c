"""Build the conformance corpus: play every scenario, review it, write its vector.

    python -m machine.conformance.corpus            # (re)write the vectors
    python -m machine.conformance.corpus --check    # exit 1 if any file is stale
    python -m machine.conformance.corpus A1 B3      # only ids starting with these

A scenario whose review (its assertions against scenarios.md and the spec) fails is NOT
written: it is reported as a suspected core bug, and the build exits 1. The vectors are
``conformance/vectors`` of the spec folder `machine.specfiles.spec_root` finds (``specs/`` of
a checkout).
"""

from __future__ import annotations

import dataclasses
import sys
import traceback
from importlib import resources
from pathlib import Path

from machine.conformance.corpus import scenarios
from machine.conformance.ladder import ladder_tags
from machine.conformance.vectors import dump_vector, parse_vector
from machine.specfiles import spec_root

__all__ = ["ORIGINAL_STEPS", "build", "main", "original_steps", "vectors_folder"]


def original_steps() -> dict[str, tuple[int, str, str]]:
    """Where the original implementation departs, per vector tagged differs-from-original: the
    step of its first divergence (when the corpus was run against it, specs/differences.md
    "How this was established"; for vectors added since, read from its code), where in its
    code, and what it does there. Informative; written into the vectors as "original"."""
    text = resources.files("machine.conformance.corpus").joinpath("original-steps.tsv").read_text("utf-8")
    found: dict[str, tuple[int, str, str]] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            vector_id, step, where, does = line.split("\t")
            found[vector_id] = (int(step), where, does)
    return found


ORIGINAL_STEPS: dict[str, tuple[int, str, str]] = original_steps()


def vectors_folder() -> Path:
    """The corpus folder the build writes (``specs/conformance/vectors`` of the checkout)."""
    root = spec_root()
    if root is None:
        raise SystemExit("no spec folder found (specs/ of a checkout, or machine/_specs)")
    return root / "conformance" / "vectors"


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
                step, where, does = ORIGINAL_STEPS[item.id]
                vector = dataclasses.replace(vector, original_step=step, original_does=does,
                                             original_where=where)
            if ladder_tags(item.id):                  # the kit's first vectors, in order
                vector = dataclasses.replace(vector, tags=(*vector.tags, *ladder_tags(item.id)))
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
    vectors = vectors_folder()
    texts, problems = build(prefixes)
    stale: list[str] = []
    for vector_id, text in sorted(texts.items()):
        path = vectors / f"{vector_id}.json"
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current != text:
            stale.append(vector_id)
            if not check:
                path.write_text(text, encoding="utf-8")
    if prefixes is None:
        known = set(texts) | set(problems)
        for path in sorted(vectors.glob("*.json")):
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
