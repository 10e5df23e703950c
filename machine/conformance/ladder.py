"""The first vectors: a ladder of short vectors a new port passes one rung at a time.

A port cannot pass A1 (a whole turn: admission, request, stream, tools, flush) before it
has most of the loop; these vectors need a little more each, from the three publication
notices to the first complete turn, so a port gets its first green in an hour and then
climbs. Each rung is tagged ``first`` and ``first:<n>`` (``turnstile check --port ...
--tag first:1``); the kit's README ("First vectors") says what each rung adds, and
``tests/test_conformance_ladder.py`` checks that every rung is short, adds only a few
things the earlier rungs did not need, and asks nothing of a port of the original that it
does not do.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FIRST_VECTORS", "LADDER_TAG", "ladder_tags"]

#: The tag every rung carries; ``first:<n>`` is its place (1 first).
LADDER_TAG: Final = "first"

#: The rungs, in order.
FIRST_VECTORS: Final = (
    "M26-cancel",                       # publication notices; a cancel with nothing pending
    "A2-idle-inject-appends-only",      # an idle inject: the first durable event
    "E4-cancel-parked-quiet-item",      # a quiet send queued, then cancelled and reported
    "G1a-enclosure-turn-still-open",    # direct appends and the log's refusals
    "B3-block-nothing-durable",         # the wake, admission, a blocked prompt
    "M05-cancel",                       # an admitted prompt opens a turn; cancel, flush, settle
    "E14a-cancel-from-step-start",      # the step hooks, step/start and step/end
    "A1-simple-prompt-turn",            # the first whole turn: request, stream, message
)


def ladder_tags(vector_id: str) -> tuple[str, ...]:
    """The ladder's tags for *vector_id*: ``("first", "first:<n>")`` for a rung, else none."""
    if vector_id not in FIRST_VECTORS:
        return ()
    return (LADDER_TAG, f"{LADDER_TAG}:{FIRST_VECTORS.index(vector_id) + 1}")
