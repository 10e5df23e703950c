"""Where the spec's files are: the repository's ``specs/`` folder, or the copy in the package.

A wheel carries the spec documents, the conformance kit (``PROTOCOL.md``, ``README.md``,
``vector.schema.json``, ``corpus.json``, the vectors) and the example scripts and logs in
``machine/_specs/``, copied from ``specs/`` at build time (setup.py). In a checkout (an
editable install, or none) nothing is copied and ``specs/`` itself is used, so a regenerated
corpus is seen at once. `spec_root` decides which; the other functions name places under it.

``turnstile check --version`` prints the corpus version and where the kit is.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from machine.errors import TurnstileError

__all__ = ["CHECKOUT_SPECS", "SHIPPED_SPECS", "CorpusInfo", "CorpusInfoError", "conformance_dir",
           "corpus_info", "spec_root", "vectors_dir"]

_PACKAGE: Final = Path(__file__).resolve().parent
#: The copy inside an installed wheel.
SHIPPED_SPECS: Final = _PACKAGE / "_specs"
#: ``specs/`` of the repository checkout this package was imported from, if it is one.
CHECKOUT_SPECS: Final = _PACKAGE.parent / "specs"
_MARKER: Final = Path("conformance", "vector.schema.json")


def spec_root() -> Path | None:
    """The folder holding the spec's files, or None when neither copy is there.

    The checkout wins when this package is the one of a checkout (``pyproject.toml`` beside
    ``specs/``): the shipped copy, if one was ever built in place, could be stale.
    """
    if (CHECKOUT_SPECS.parent / "pyproject.toml").is_file() and (CHECKOUT_SPECS / _MARKER).is_file():
        return CHECKOUT_SPECS
    if (SHIPPED_SPECS / _MARKER).is_file():
        return SHIPPED_SPECS
    return None


def conformance_dir() -> Path | None:
    """The conformance kit's folder (``PROTOCOL.md``, ``vectors/`` …), or None."""
    root = spec_root()
    return None if root is None else root / "conformance"


def vectors_dir() -> Path | None:
    """The shipped corpus of conformance vectors, or None."""
    kit = conformance_dir()
    return None if kit is None or not (kit / "vectors").is_dir() else kit / "vectors"


@dataclass(frozen=True, slots=True)
class CorpusInfo:
    """``corpus.json`` of the conformance kit (PROTOCOL.md §6 says what changes each number)."""

    corpus: str              # the corpus version, MAJOR.MINOR
    vector_format: int       # the "version" every vector carries
    adapter_protocol: int    # the "protocol" of the adapter handshake
    trace_format: int        # the "trace" of a trace header
    path: Path               # the conformance kit's folder


class CorpusInfoError(TurnstileError):
    """``corpus.json`` is missing or malformed (names the file and the field)."""

    code = "CORPUS_INFO"


def corpus_info(kit: Path | None = None) -> CorpusInfo:
    """Read ``corpus.json`` of *kit* (default: `conformance_dir`); raises CorpusInfoError."""
    folder = conformance_dir() if kit is None else kit
    if folder is None:
        raise CorpusInfoError("no conformance kit found (neither specs/ of a checkout nor "
                              f"{SHIPPED_SPECS})")
    path = folder / "corpus.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise CorpusInfoError(f"{path}: cannot read: {error.strerror or error}") from None
    except ValueError as error:
        raise CorpusInfoError(f"{path}: invalid JSON: {error}") from None
    if not isinstance(value, dict):
        raise CorpusInfoError(f"{path}: must be a JSON object")
    corpus = value.get("corpus")
    parts = corpus.split(".") if isinstance(corpus, str) else []
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise CorpusInfoError(f"{path}: /corpus: must be a version string MAJOR.MINOR")
    numbers: list[int] = []
    for name in ("vectorFormat", "adapterProtocol", "traceFormat"):
        number = value.get(name)
        if type(number) is not int or number < 1:
            raise CorpusInfoError(f"{path}: /{name}: must be a positive integer")
        numbers.append(number)
    return CorpusInfo(str(corpus), numbers[0], numbers[1], numbers[2], folder)
