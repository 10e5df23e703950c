"""Which vectors a run checks, and which ones a port expects to fail (PROTOCOL.md §6).

**Selection** (``turnstile check --run/--skip/--tag/--rule``). Each option takes
patterns, repeated or comma-separated. A vector is selected when its id matches
one ``--run`` glob (if any is given), it carries a tag matching one ``--tag``
glob (if any), it covers a rule matching one ``--rule`` pattern (if any), and
its id matches no ``--skip`` glob. Globs are shell-style and case-sensitive
(``A*``, ``M1?-cancel``, ``scenario:E*``); a rule pattern also matches the
rules under it (``R16`` matches ``R16``, ``R16.2`` and ``R16.2.1``, not ``R160``).

**Known failures** (``--known-failures FILE``). A port keeps, in its own
repository, the vectors it does not pass yet: a UTF-8 text file with one vector
id per line, optionally followed by ``#`` and why; blank lines and lines
starting with ``#`` are comments::

    # myport: vectors we do not pass yet (corpus 1.0)
    A5-idle-steer-is-a-prompt      # routing ignores the acceptance window (issue 12)
    M07-cancel                     # cancel inside turn/start observers

A listed vector that fails (or breaks the adapter protocol) counts as a *known
failure* and does not fail the run; a listed vector that passes is *fixed*,
reported with the line to remove, and fails the run, so the file never hides a
regression behind a stale entry. Ids are exact (no globs): a new vector is never
excused by accident. Listed ids that name no vector of the run are noted.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from fnmatch import fnmatchcase
from pathlib import Path

from machine.cli.terminal import read_text, shown
from machine.conformance.checker import Outcome
from machine.conformance.vectors import ID_PATTERN, Vector
from machine.errors import TurnstileError

__all__ = ["KnownFailure", "KnownFailures", "KnownFailuresError", "Selection", "apply_known",
           "known_failures_text", "load_known_failures", "patterns"]

def patterns(values: Iterable[str]) -> tuple[str, ...]:
    """Option values as patterns: each value may hold several, separated by commas."""
    return tuple(part.strip() for value in values for part in value.split(",") if part.strip())


def _rule_matches(pattern: str, rule: str) -> bool:
    return fnmatchcase(rule, pattern) or rule.startswith(pattern + ".")


@dataclass(frozen=True, slots=True)
class Selection:
    """The ``--run``, ``--skip``, ``--tag`` and ``--rule`` patterns of one run."""

    run: tuple[str, ...] = ()
    skip: tuple[str, ...] = ()
    tags: tuple[str, ...] = ()
    rules: tuple[str, ...] = ()

    def selects(self, vector: Vector) -> bool:
        if self.run and not any(fnmatchcase(vector.id, p) for p in self.run):
            return False
        if any(fnmatchcase(vector.id, p) for p in self.skip):
            return False
        if self.tags and not any(fnmatchcase(tag, p) for tag in vector.tags for p in self.tags):
            return False
        return not self.rules or any(_rule_matches(p, rule) for rule in vector.rules
                                     for p in self.rules)

    def split(self, vectors: Sequence[Vector]) -> tuple[list[Vector], int]:
        """The selected vectors, in order, and how many were left out."""
        chosen = [vector for vector in vectors if self.selects(vector)]
        return chosen, len(vectors) - len(chosen)


@dataclass(frozen=True, slots=True)
class KnownFailure:
    vector: str
    reason: str        # the comment after the id ("" when there is none)
    line: int


class KnownFailuresError(TurnstileError):
    """A known-failures file that cannot be used: names the file, the line and the problem."""

    code = "KNOWN_FAILURES"


@dataclass(frozen=True, slots=True)
class KnownFailures:
    path: str
    entries: dict[str, KnownFailure]

    def reason(self, vector: str) -> str:
        entry = self.entries[vector]
        return entry.reason or f"listed in {self.path}:{entry.line}"


def load_known_failures(path: str | Path) -> KnownFailures:
    """Read a known-failures file (``-``: standard input); raises KnownFailuresError
    (file:line: problem)."""
    name = shown(path)
    try:
        text = read_text(path)
    except FileNotFoundError:
        raise KnownFailuresError(f"{name}: no such file") from None
    except IsADirectoryError:
        raise KnownFailuresError(f"{name}: is a directory, not a known-failures file") from None
    except UnicodeDecodeError as error:
        raise KnownFailuresError(f"{name}: not UTF-8 text ({error.reason} at byte "
                                 f"{error.start})") from None
    except OSError as error:
        raise KnownFailuresError(f"{name}: cannot read: {error.strerror or error}") from None
    entries: dict[str, KnownFailure] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        vector, _, reason = line.partition("#")
        vector = vector.strip()
        if " " in vector or "\t" in vector:
            raise KnownFailuresError(f"{name}:{number}: one vector id per line, optionally "
                                     f"followed by '# why'; got {line!r}")
        if ID_PATTERN.match(vector) is None:
            raise KnownFailuresError(f"{name}:{number}: {vector!r} is not a vector id (letters, "
                                     "digits, '.', '_' and '-'; globs are not allowed here)")
        if vector in entries:
            raise KnownFailuresError(f"{name}:{number}: {vector} is also listed on line "
                                     f"{entries[vector].line}")
        entries[vector] = KnownFailure(vector, reason.strip(), number)
    return KnownFailures(name, entries)


def apply_known(outcomes: Sequence[Outcome], known: KnownFailures) -> None:
    """Mark the outcomes of listed vectors: ``known-failure`` or ``fixed`` (in place)."""
    for outcome in outcomes:
        vector = outcome.vector.id
        if vector not in known.entries or outcome.status == "skipped":
            continue
        outcome.known = known.reason(vector)
        outcome.ran = outcome.status
        outcome.status = "fixed" if outcome.status == "passed" else "known-failure"


def known_failures_text(outcomes: Sequence[Outcome], *, previous: KnownFailures | None = None,
                        corpus: str | None = None) -> str:
    """A known-failures file listing every vector of *outcomes* that did not pass.

    Reasons already written in *previous* are kept; a new entry gets its first difference
    (or port failure) as its comment, to be replaced by the real reason.
    """
    lines = ["# Vectors this implementation does not pass yet: `turnstile check "
             "--known-failures FILE`.",
             "# One id per line, then '# why'. A listed vector that passes fails the run "
             "until its line is removed."]
    if corpus is not None:
        lines.append(f"# Written for conformance corpus {corpus}.")
    for outcome in outcomes:
        ran = outcome.ran or outcome.status
        if ran not in ("failed", "error"):
            continue
        vector = outcome.vector.id
        kept = previous.entries.get(vector) if previous is not None else None
        if kept is not None and kept.reason:
            reason = kept.reason
        elif outcome.divergence is not None:
            reason = outcome.divergence.difference or \
                f"step {outcome.divergence.index + 1}: expected {outcome.divergence.expected}"
        else:
            reason = f"port failure: {outcome.reason}"
        reason = " ".join(reason.split())
        if len(reason) > 120:
            reason = reason[:119] + "…"
        lines.append(f"{vector}  # {reason}")
    return "\n".join(lines) + "\n"
