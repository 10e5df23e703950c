"""Compaction (§25, S19–S21): a checkpoint message that replaces a surface range.

A **surface node** is one entry of the current derived history (§21.2) together
with the seq of the event that produced it (its *origin*). A compaction
appends one `user/message` with source ``{kind:'plugin', plugin:'compact'}``,
``surfaceOp {op:'replace', start, end}`` and ``sourceEventSeqs`` listing the
origins of the nodes it shadows. Between-turn user messages are nodes like
any other and can be shadowed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from machine.core import AgentCore
from machine.errors import ValidationError
from machine.events import ASSISTANT_MESSAGE, SURFACE_TYPES, USER_MESSAGE, Event
from machine.jsonvalue import FrozenDict, JsonLike
from machine.log import SessionLog
from machine.store.errors import CompactionError
from machine.vocabulary import Message, user_message

__all__ = [
    "COMPACT_SOURCE",
    "SurfaceNode",
    "checkpoint_message",
    "choose_compaction_range",
    "compact",
    "compaction_problem",
    "surface_nodes",
]

COMPACT_SOURCE: Final = FrozenDict({"kind": "plugin", "plugin": "compact"})


@dataclass(frozen=True, slots=True)
class SurfaceNode:
    """One entry of the derived history and the seq of the event that produced it."""

    origin: int
    message: Message
    event: Event


def _project(event: Event) -> Message:
    if event.type == USER_MESSAGE:
        return Message.from_json(event.data, "data")
    return Message.from_json(event.data["message"], "data.message")


def surface_nodes(events: Sequence[Event]) -> list[SurfaceNode]:
    """The derived history of valid *events* (§21.2), each entry with its origin (S19).

    The messages are exactly `machine.log.derive_history` of the same events.
    """
    nodes: list[SurfaceNode] = []
    for event in events:
        if event.type not in SURFACE_TYPES:
            continue
        message = _project(event)
        skipped = message.role == "assistant" and not message.content
        op = event.surface_op
        if not isinstance(op, FrozenDict):
            if not skipped:
                nodes.append(SurfaceNode(event.seq, message, event))
            continue
        start, end = op["start"], op["end"]
        assert isinstance(start, int) and isinstance(end, int)
        kept: list[SurfaceNode] = []
        position: int | None = None
        for node in nodes:
            if start <= node.origin <= end:
                if position is None:
                    position = len(kept)
                continue
            if position is None and node.origin > end:
                position = len(kept)
            kept.append(node)
        if not skipped:
            kept.insert(len(kept) if position is None else position,
                        SurfaceNode(event.seq, message, event))
        nodes = kept
    return nodes


def checkpoint_message(message_id: str, summary: str | Sequence[JsonLike]) -> Message:
    """A checkpoint user message (§25.2): source ``{kind:'plugin', plugin:'compact'}``."""
    return user_message(message_id, summary, COMPACT_SOURCE)


def _call_step(node: SurfaceNode) -> tuple[object, object]:
    return node.event.data.get("turn"), node.event.data.get("step")


def compaction_problem(nodes: Sequence[SurfaceNode], start: int, end: int, *,
                       open_step: tuple[int, int] | None = None) -> str | None:
    """S20: why replacing the seqs ``start..end`` would cut through a tool call, or None.

    The range cuts through a call when the call's assistant node and one of its
    result nodes lie on different sides of it, or when the call is inside the
    range, has no result yet and belongs to the open step (*open_step*), so
    that its result will land after the range.
    """
    def inside(node: SurfaceNode) -> bool:
        return start <= node.origin <= end

    results: dict[str, list[SurfaceNode]] = {}
    for node in nodes:
        if node.message.source.get("kind") == "tool":
            call_id = node.message.source.get("callId")
            if isinstance(call_id, str):
                results.setdefault(call_id, []).append(node)
    for node in nodes:
        if node.message.role != "assistant" or node.event.type != ASSISTANT_MESSAGE:
            continue
        for block in node.message.tool_calls:
            call_id = block.get("id")
            if not isinstance(call_id, str):
                continue
            answers = results.get(call_id, [])
            if inside(node):
                outside = [a.origin for a in answers if not inside(a)]
                if outside:
                    return (f"tool call {call_id!r} (seq {node.origin}) is inside the range but "
                            f"its result (seq {outside[0]}) is not")
                if not answers and open_step is not None and _call_step(node) == open_step:
                    return (f"tool call {call_id!r} (seq {node.origin}) is still unanswered in "
                            f"the open step {open_step[0]}.{open_step[1]}")
            else:
                within = [a.origin for a in answers if inside(a)]
                if within:
                    return (f"the result (seq {within[0]}) of tool call {call_id!r} is inside "
                            f"the range but the call (seq {node.origin}) is not")
    return None


def _open_step(log: SessionLog) -> tuple[int, int] | None:
    turn, step = log.open_turn, log.open_step
    return None if turn is None or step is None else (turn, step)


def choose_compaction_range(log: SessionLog | Sequence[Event], keep_tail: int, *,
                            min_nodes: int = 1) -> tuple[int, int] | None:
    """S21 (§25.2): the largest head prefix of surface nodes to compact, or None.

    The range starts at the first node, leaves at least the *keep_tail* most
    recent nodes alone, shadows at least *min_nodes* nodes, shadows no node
    outside the prefix, and never cuts through a tool call (S20).
    """
    if type(keep_tail) is not int or keep_tail < 0:
        raise ValidationError("keep_tail", "must be a non-negative integer")
    if type(min_nodes) is not int or min_nodes < 1:
        raise ValidationError("min_nodes", "must be a positive integer")
    if isinstance(log, SessionLog):
        events, open_step = log.events, _open_step(log)
    else:
        events = log
        checker = SessionLog(events)
        open_step = _open_step(checker)
    nodes = surface_nodes(events)
    for count in range(len(nodes) - keep_tail, min_nodes - 1, -1):
        origins = [node.origin for node in nodes[:count]]
        start, end = min(origins), max(origins)
        if any(start <= node.origin <= end for node in nodes[count:]):
            continue
        if compaction_problem(nodes, start, end, open_step=open_step) is None:
            return start, end
    return None


def compact(target: SessionLog | AgentCore, start: int, end: int, summary: Message) -> Event:
    """S19–S20 (§25): append a checkpoint replacing the surface nodes of seqs ``start..end``.

    *target* is the log, or the agent whose log it is (the append then goes
    through `AgentCore.append`, so drivers and stores see it). Refused with a
    `CompactionError` outside an open turn (``COMPACTION_OUTSIDE_TURN``), when
    the range shadows nothing (``COMPACTION_EMPTY_RANGE``), or when it cuts
    through a tool call (``COMPACTION_CUTS_TOOL_CALL``).
    """
    log = target.log if isinstance(target, AgentCore) else target
    if not isinstance(summary, Message) or summary.role != "user" \
            or summary.source.get("kind") != "plugin" or summary.source.get("plugin") != "compact":
        raise ValidationError("summary", "must be a user message with source "
                              "{kind:'plugin', plugin:'compact'} (see checkpoint_message)")
    for name, value in (("start", start), ("end", end)):
        if type(value) is not int or not 0 <= value < len(log):
            raise ValidationError(name, f"{value!r} does not name an event of the log "
                                  f"(it has {len(log)} events)")
    if start > end:
        raise ValidationError("start", f"{start} is after end {end}")
    if log.open_turn is None:
        raise CompactionError("compaction runs only inside an open turn (the latest turn "
                              "boundary is a turn/end)", code="COMPACTION_OUTSIDE_TURN")
    nodes = surface_nodes(log.events)
    shadowed = sorted(node.origin for node in nodes if start <= node.origin <= end)
    if not shadowed:
        raise CompactionError(f"the range {start}..{end} shadows no surface node",
                              code="COMPACTION_EMPTY_RANGE")
    problem = compaction_problem(nodes, start, end, open_step=_open_step(log))
    if problem is not None:
        raise CompactionError(f"the range {start}..{end} cuts through a tool call: {problem}",
                              code="COMPACTION_CUTS_TOOL_CALL")
    op = {"op": "replace", "start": start, "end": end}
    if isinstance(target, AgentCore):
        return target.append(USER_MESSAGE, summary.to_json(), surface_op=op,
                             source_event_seqs=shadowed)
    return log.append(USER_MESSAGE, summary, surface_op=op, source_event_seqs=shadowed)
