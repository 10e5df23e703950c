"""Stratified random sampling of mutmut's unevaluated mutants, and the score estimate.

A full mutmut run over machine/ (about 10,000 mutants, many of whose test selections
include the 50-second exploration test) takes hours on a 2-core machine. This script
picks a reproducible random sample of the mutants mutmut has not evaluated yet,
stratified by module, so that `mutmut run NAMES...` evaluates a representative part;
`estimate` then combines the exact results of every evaluated mutant with the
sample's kill rate per module (specs/ASSURANCE.md, "Mutation score").

    python .ci/mutation_sample.py generate
    python .ci/mutation_sample.py pick --fraction 0.12 --seed 2026 > mutants/sample.json
    mutmut run $(python .ci/mutation_sample.py names mutants/sample.json)
    python .ci/mutation_sample.py estimate mutants/sample.json \
        --killed bench/mutation/killed-*.txt --equivalent bench/mutation/equivalent-*.md

``--killed`` files name survivors that tests added after the run kill (each verified by
running the new test with ``MUTANT_UNDER_TEST=NAME`` in ./mutants); they count as
detected. ``--equivalent`` files name survivors judged equivalent (with the reason);
they leave the count, in the evaluated part and in the sample alike. Those records, the
sample plan and the estimate live in bench/mutation/ (``make mutation-sample`` writes them).

``generate`` writes the mutants into ./mutants without running any (what the first step of
``mutmut run`` does), so that ``pick`` has a population to sample in a fresh clone: until
then ``mutmut results`` lists nothing. It leaves unchanged files and known verdicts alone.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Set
from typing import TypedDict

DETECTED = {"killed", "killed (added test)", "timeout", "suspicious", "segfault"}
MUTMUT = ".venv/bin/mutmut"


def results() -> dict[str, str]:
    """Every mutant's status as `mutmut results --all true` reports it."""
    text = subprocess.run([MUTMUT, "results", "--all", "true"], check=True,
                          capture_output=True, text=True).stdout
    statuses: dict[str, str] = {}
    for line in text.splitlines():
        name, _, status = line.strip().rpartition(": ")
        if name:
            statuses[name] = status
    return statuses


def generate(children: int) -> None:
    """Write every mutant into ./mutants, as `mutmut run` does before it runs any.

    mutmut 3.8 has no command for this step alone: these are the calls `mutmut run` makes
    first (mutmut/__main__.py, `_run`). A file whose mutants are already written (newer
    than its source) is left as it is, with its verdicts; a changed function's are reset.
    """
    # Imported here: mutmut.__main__ sets the multiprocessing start method on import.
    from mutmut.__main__ import create_mutants, store_lines_covered_by_tests
    from mutmut.mutation.trampoline import set_mutant_under_test
    from mutmut.utils.file_utils import copy_also_copy_files, copy_src_dir, setup_source_paths
    set_mutant_under_test("mutant_generation")
    os.makedirs("mutants", exist_ok=True)
    copy_src_dir()
    copy_also_copy_files()
    setup_source_paths()
    store_lines_covered_by_tests()
    stats = create_mutants(children)
    print(f"mutants written: {stats.mutated} files mutated, {stats.unmodified} unchanged, "
          f"{stats.ignored} not mutated", file=sys.stderr)


def module_of(name: str) -> str:
    """`machine.core.xǁAgentCoreǁ_run__mutmut_3` -> `machine.core`."""
    head = name.split("__mutmut_")[0]
    parts = head.split(".")
    return ".".join(p for p in parts if not p.startswith("x"))


class Plan(TypedDict):
    """What `pick` writes and `names` and `estimate` read: the sample, per module."""

    seed: int
    fraction: float
    unevaluated: dict[str, int]  # module -> how many of its mutants were not evaluated
    sample: dict[str, list[str]]  # module -> the sampled mutant names


def pick(fraction: float, seed: int) -> Plan:
    statuses = results()
    if not statuses:
        raise SystemExit("mutmut knows no mutant: run `.ci/mutation_sample.py generate` first")
    population: dict[str, list[str]] = defaultdict(list)
    for name, status in sorted(statuses.items()):
        if status == "not checked":
            population[module_of(name)].append(name)
    rng = random.Random(seed)
    sample = {module: sorted(rng.sample(names, max(1, round(len(names) * fraction))))
              for module, names in sorted(population.items())}
    return {"seed": seed, "fraction": fraction,
            "unevaluated": {m: len(n) for m, n in population.items()}, "sample": sample}


NAME = re.compile(r"(?:machine\.)?((?:core(?:\.\w+)?|decisions|events|invariants|jsonvalue|log|vocabulary"
                  r"|machines\.\w+)\.x[\wǁ]*__mutmut_\d+)")
HEADING = re.compile(r"^#+\s")
#: A section lists equivalent mutants when its heading says so, and nothing else.
EQUIVALENT = re.compile(r"equivalent", re.IGNORECASE)
NOT_EQUIVALENT = re.compile(r"unresolved|cosmetic|formerly|bug|dead", re.IGNORECASE)


def names_in(paths: list[str], *, tables_under: re.Pattern[str] | None = None) -> set[str]:
    """The mutant names in the files; with *tables_under*, only those in table rows of
    sections whose heading matches it (and not `NOT_EQUIVALENT`)."""
    found: set[str] = set()
    for path in paths:
        counting = tables_under is None
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                if tables_under is not None and HEADING.match(line):
                    counting = bool(tables_under.search(line)) and not NOT_EQUIVALENT.search(line)
                    continue
                if counting and (tables_under is None or line.startswith("|")):
                    found.update("machine." + name for name in NAME.findall(line))
    return found


def wilson_low(hits: int, n: int, z: float) -> float:
    """The Wilson lower bound of a detection rate of *hits* in *n* (z=1.645: one-sided 95 %)."""
    p = hits / n
    return ((p + z * z / (2 * n) - z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)))
            / (1 + z * z / n))


def estimate(plan: Plan, killed: Set[str] = frozenset(), equivalent: Set[str] = frozenset()
             ) -> str:
    every = {name: ("killed (added test)" if name in killed and status in {"survived", "no tests"}
                    else status)
             for name, status in results().items()}
    statuses = {name: status for name, status in every.items() if name not in equivalent}
    unevaluated = plan["unevaluated"]
    sample = plan["sample"]
    sampled = {name for names in sample.values() for name in names}
    counted = [n for n in statuses if statuses[n] != "not checked" and n not in sampled]
    lines = []
    census = Counter(statuses[n] for n in counted)
    census_detected = sum(census[s] for s in DETECTED)
    census_total = sum(census.values())
    lines.append(f"evaluated outside the sample: {census_total} mutants, detected "
                 f"{census_detected} ({100 * census_detected / max(census_total, 1):.1f}%) "
                 f"{dict(census)}")
    total = census_total
    detected = float(census_detected)
    variance = 0.0
    pending = 0
    sampled_done = sampled_hits = unevaluated_total = 0
    for module, names in sorted(sample.items()):
        kept = [n for n in names if n not in equivalent]
        done = [n for n in kept if statuses.get(n, "not checked") != "not checked"]
        pending += len(kept) - len(done)
        if not done:
            continue
        hits = sum(statuses[n] in DETECTED for n in done)
        sampled_done += len(done)
        sampled_hits += hits
        rate = hits / len(done)
        # equivalent mutants found in the sample leave the stratum in proportion
        size = round(unevaluated[module] * len(kept) / len(names))
        total += size
        unevaluated_total += size
        detected += size * rate
        # finite-population variance of the stratum total
        correction = (size - len(done)) / max(size - 1, 1)
        variance += size * size * rate * (1 - rate) / len(done) * correction
        survivors = [n for n in done if statuses[n] not in DETECTED]
        lines.append(f"{module}: sample {len(done)} of {size} unevaluated, detected {hits} "
                     f"({100 * rate:.1f}%); not detected: {', '.join(survivors) or '-'}")
    score = detected / total
    margin = 1.96 * math.sqrt(variance) / total
    lines.append(f"estimated score over all {total} mutants: {100 * score:.1f}% "
                 f"(95% interval {100 * (score - margin):.1f}-{100 * (score + margin):.1f}%)"
                 + (f"; {pending} sampled mutants not evaluated yet" if pending else ""))
    if sampled_done:
        # Why: the normal interval collapses when every sampled mutant is detected. The
        # sample takes the same fraction of every module, so pooled it is a simple random
        # sample; the Wilson lower bound of its detection rate bounds the score from below.
        low = wilson_low(sampled_hits, sampled_done, 1.96)
        floor = (census_detected + unevaluated_total * low) / total
        lines.append(f"pooled sample: {sampled_hits} of {sampled_done} detected; with 95% "
                     f"confidence the score is at least {100 * floor:.1f}% (Wilson lower bound "
                     f"{100 * low:.2f}% for the unevaluated part)")
    # The strict measure (specs/ASSURANCE.md): every equivalent mutant of the sample
    # counted as a survivor, so the judgement of equivalence cannot raise the score.
    strict = [every[n] for names in sample.values() for n in names
              if every.get(n, "not checked") != "not checked"]
    if strict:
        hits = sum(status in DETECTED for status in strict)
        lines.append(f"strict, every equivalent mutant counted as a survivor: sample {hits} of "
                     f"{len(strict)} detected = {100 * hits / len(strict):.1f}% (one-sided 95% "
                     f"lower bound {100 * wilson_low(hits, len(strict), 1.645):.1f}%)")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("generate")
    g.add_argument("--max-children", type=int, default=2)
    p = sub.add_parser("pick")
    p.add_argument("--fraction", type=float, default=0.12)
    p.add_argument("--seed", type=int, default=2026)
    n = sub.add_parser("names")
    n.add_argument("plan")
    e = sub.add_parser("estimate")
    e.add_argument("plan")
    e.add_argument("--killed", nargs="*", default=[])
    e.add_argument("--equivalent", nargs="*", default=[])
    args = parser.parse_args()
    if args.command == "generate":
        generate(args.max_children)
    elif args.command == "pick":
        json.dump(pick(args.fraction, args.seed), sys.stdout, indent=1)
        print()
    else:
        with open(args.plan, encoding="utf-8") as handle:
            plan: Plan = json.load(handle)
        if args.command == "names":
            print(" ".join(name for names in plan["sample"].values() for name in names))
        else:
            print(estimate(plan, names_in(args.killed),
                           names_in(args.equivalent, tables_under=EQUIVALENT)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
