"""Number types of the command lines' options (argparse ``type=``): a value out of range or
not finite (``-5``, ``nan``, ``inf``) is a usage error naming the option's rule, never a
silently accepted run."""

from __future__ import annotations

import argparse
import math

__all__ = ["count", "positive_count", "seconds"]


def seconds(text: str) -> float:
    """A positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be a positive, finite number of "
                                         "seconds")
    return value


def count(text: str) -> int:
    """A non-negative integer."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 0 or more")
    return value


def positive_count(text: str) -> int:
    """A positive integer."""
    value = count(text)
    if value == 0:
        raise argparse.ArgumentTypeError(f"{text!r}: must be 1 or more")
    return value
