"""Ids and names as a provider accepts them (specs/providers.md W2.5, W2.6).

A call's id and a tool's name come from the model, or from whatever wrote the log (another
provider, a port, a hand-made session): any non-empty string (V3). A provider refuses some of
them (a character outside its pattern, a string too long). What the adapters send instead is
derived, deterministically, from the original: the same history always gives the same
request, and two different originals never give the same wire form.
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

__all__ = ["wire_form"]

_HASH: Final = 10


def wire_form(original: str, taken: int, *, allowed: re.Pattern[str], invalid: re.Pattern[str],
              max_length: int, empty: str) -> str:
    """*original* when it matches *allowed* (a whole-string pattern) and is the first of its
    value in the request (``taken`` 1); otherwise the valid characters of *original* (each
    run of others one ``_``), cut to fit, then ``_`` and a hash of the original (and of
    ``taken`` for a second call with the same id), so that different originals never meet.
    *empty* stands for the characters when none is valid."""
    if taken == 1 and allowed.fullmatch(original):
        return original
    digest = hashlib.sha256(f"{taken}\x00{original}".encode("utf-8", "surrogatepass")).hexdigest()
    suffix = "_" + digest[:_HASH]
    kept = invalid.sub("_", original).strip("_") or empty
    return kept[: max_length - len(suffix)] + suffix
