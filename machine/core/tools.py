"""The tool batch (rule R10): planning, starting calls in exclusive and parallel groups,
settlements taken as they come (P6), finalize, and commits in model order."""
from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final

from machine import decisions
from machine import events as ev
from machine.core.config import ToolMode
from machine.core.loop import (
    DONE,
    Action,
    Batch,
    BatchFrame,
    Call,
    CommitCallFrame,
    CommitReadyFrame,
    StartCallFrame,
    finished,
    goto,
    phase,
)
from machine.core.records import Failure, Mail, Wait, frozen_json, frozen_message
from machine.errors import ValidationError
from machine.io import TOOL_EXECUTE, TOOL_FINALIZE, TOOL_PREPARE, Durable
from machine.jsonvalue import Frozen, FrozenDict, FrozenList, freeze
from machine.vocabulary import (
    ABORTED_BEFORE_DISPATCH_TEXT,
    ABORTED_TEXT,
    ErrorInfo,
    Message,
    ToolResult,
)

if TYPE_CHECKING:
    from machine.core.state import CoreState

#: R10.10 / R10.11: the errors of the canonical aborted results.
ABORTED_BEFORE_DISPATCH_ERROR: Final = FrozenDict({"name": "AbortError",
                                                   "code": "ABORTED_BEFORE_DISPATCH"})
ABORTED_ERROR: Final = FrozenDict({"name": "AbortError", "code": "ABORTED"})


def plan_arguments(raw: str) -> Frozen:
    """R10.1: '' -> {}, valid JSON text -> its value, anything else -> the raw string."""
    if raw == "":
        return FrozenDict()

    def refuse(_constant: str) -> None:
        raise ValueError("not JSON")

    try:
        return freeze(json.loads(raw, parse_constant=refuse), "arguments")
    except (ValueError, ValidationError, RecursionError):  # too deep for the parser: unparsable
        return raw


def _canonical_result(error: FrozenDict, text: str,
                      contexts: tuple[Message, ...] = ()) -> ToolResult:
    """R10.10 / R10.11: a canonical aborted result, carrying *contexts* when it replaces a
    result that had some."""
    return ToolResult(content=FrozenList((FrozenDict({"type": "text", "text": text}),)),
                      is_error=True, error=error, additional_contexts=contexts)


#: R10.10: the result of a call aborted before its dispatch.
ABORTED_BEFORE_DISPATCH: Final = _canonical_result(ABORTED_BEFORE_DISPATCH_ERROR,
                                                   ABORTED_BEFORE_DISPATCH_TEXT)


def raised_result(error: ErrorInfo) -> ToolResult:
    """R10.12: the error result a raising tool stage stands for: the text ``Error: `` and the
    error's message, and ``error {name, code}`` only for a coded error."""
    info = FrozenDict({"name": error.name, "code": error.code}) if error.code is not None else None
    return ToolResult(content=FrozenList((FrozenDict({"type": "text",
                                                      "text": f"Error: {error.message}"}),)),
                      is_error=True, error=info)


def normalized(result: ToolResult) -> ToolResult:
    """V16: an error result carries no concludesTurn and a successful one no error, as
    finalize sees it and as it is committed."""
    if result.is_error and result.concludes_turn:
        return ToolResult(content=result.content, is_error=True, error=result.error,
                          additional_contexts=result.additional_contexts, meta=result.meta)
    if not result.is_error and result.error is not None:
        return ToolResult(content=result.content, additional_contexts=result.additional_contexts,
                          concludes_turn=result.concludes_turn, meta=result.meta)
    return result


def _invalid_result(problem: ValidationError) -> ErrorInfo:
    return ErrorInfo(f"invalid tool result: {problem}", "InvalidToolResultError",
                     "INVALID_TOOL_RESULT")


def _mode(core: CoreState, call: Call) -> ToolMode:
    return core.config.tool_modes.get(call.name, "exclusive")


def _aborted(core: CoreState) -> bool:
    ctrl = core.controller
    assert ctrl is not None
    return ctrl.aborted


# -- the batch --------------------------------------------------------------------------


def tool_batch(blocks: list[FrozenDict]) -> BatchFrame:
    """R10.1: the batch of the step's tool calls, planned, in groups."""
    batch = Batch([Call(i, str(b["id"]), str(b["name"]), plan_arguments(str(b["arguments"])))
                   for i, b in enumerate(blocks)])
    return BatchFrame(phase=batch_group, batch=batch)


@phase("batch", "group")
def batch_group(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    """R10.2: the next group (an exclusive call, or a pool of parallel ones)."""
    batch = frame.batch
    calls = batch.calls
    if not (batch.next_start < len(calls) and batch.failed_at is None and not _aborted(core)):
        return goto(core, frame, batch_end)
    first = frame.first = calls[batch.next_start]
    frame.pool = _mode(core, first) == "parallel"
    frame.limit = core.config.max_parallel_tool_calls if frame.pool else 1
    frame.group_open = True
    batch.in_flight.clear()
    batch.commit_from = batch.next_start
    return goto(core, frame, batch_fill)


@phase("batch", "fill")
def batch_fill(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    """R10.2: start calls while fewer than the limit are in flight (dispatched and not yet
    taken), committing what is committable after each start."""
    batch = frame.batch
    calls = batch.calls
    if (frame.group_open and batch.failed_at is None and not _aborted(core)
            and len(batch.in_flight) < frame.limit and batch.next_start < len(calls)):
        call = calls[batch.next_start]
        if call is not frame.first and (not frame.pool or _mode(core, call) != "parallel"):
            frame.group_open = False
            return goto(core, frame, batch_take)
        batch.next_start += 1
        frame.call = call
        frame.phase = batch_started
        return StartCallFrame(phase=start_call, batch=batch, call=call)   # R10.3
    return goto(core, frame, batch_take)


@phase("batch", "started")
def batch_started(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    call = frame.call
    assert call is not None
    frame.call = None
    frame.batch.note(call)
    if not frame.pool:
        frame.group_open = False
    frame.phase = batch_fill
    return CommitReadyFrame(phase=commit_ready, batch=frame.batch)


@phase("batch", "take")
def batch_take(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    """R10.2: take a settled call (the earliest started), waiting for a settlement if none
    has come; every settlement that has arrived is taken with it (P6)."""
    batch = frame.batch
    if not batch.in_flight:
        # Why the next group: `batch_fill` comes here with nothing in flight only when the
        # group can take no further call (closed, failed, aborted, or every call started).
        return goto(core, frame, batch_group)
    if not any(c.outcome != "running" for c in batch.in_flight.values()):
        frame.phase = batch_settled
        return Wait(batch.running())
    return goto(core, frame, batch_taken)


@phase("batch", "settled")
def batch_settled(core: CoreState, frame: BatchFrame, mail: Mail) -> Action:
    batch = frame.batch
    _absorb(core, batch, mail)
    while (more := core.take_mail(batch.running())) is not None:
        _absorb(core, batch, more)
    return goto(core, frame, batch_taken)


@phase("batch", "taken")
def batch_taken(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    batch = frame.batch
    taken = next(e for e, c in batch.in_flight.items() if c.outcome != "running")
    del batch.in_flight[taken]
    frame.phase = batch_fill
    return CommitReadyFrame(phase=commit_ready, batch=batch)


@phase("batch", "end")
def batch_end(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    batch = frame.batch
    calls = batch.calls
    if batch.failed_at is not None:                           # R10.9
        failed = calls[batch.failed_at]
        assert failed.error is not None
        raise Failure(failed.error)
    frame.result = batch.concluded
    if _aborted(core):                                        # R10.7 synthetic pairs
        frame.synthetic = batch.next_start
        return goto(core, frame, batch_synthetic_call)
    return DONE


@phase("batch", "synthetic_call")
def batch_synthetic_call(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    calls = frame.batch.calls
    if frame.synthetic >= len(calls):
        return DONE
    call = calls[frame.synthetic]
    call_event = core.commit(ev.TOOL_CALL, _call_data(core, call))
    call.call_seq = call_event.event.seq
    frame.phase = batch_synthetic_result
    return call_event


@phase("batch", "synthetic_result")
def batch_synthetic_result(core: CoreState, frame: BatchFrame, _sent: object) -> Action:
    call = frame.batch.calls[frame.synthetic]
    frame.synthetic += 1
    frame.phase = batch_synthetic_call
    return _tool_result(core, call, ABORTED_BEFORE_DISPATCH)


def _absorb(core: CoreState, batch: Batch, mail: Mail) -> None:
    """R10.3 step 5: a settlement of a dispatched call, taken (P6) when it arrives before
    what the batch waits for; the call stays in flight until the batch takes it."""
    effect_id, kind, value = mail
    call = batch.in_flight[effect_id]
    _settle_call(call, kind, value, _aborted(core))
    batch.note(call)


def _stage_wait(batch: Batch, effect_id: int) -> Wait:
    """Wait for a prepare or finalize completion; settlements of dispatched calls that
    arrive before it settle their calls first, in arrival order (P6)."""
    return Wait(frozenset((effect_id,)) | batch.running())


def _settle_call(call: Call, kind: str, value: Any, aborted: bool) -> None:
    """R10.3 step 5: the body's result (the R10.11 aborted result in place of a success
    settled while the signal is aborted), R10.12's for a raise, a failure if invalid."""
    if kind == "raise":
        assert isinstance(value, ErrorInfo)
        call.outcome, call.result = "settled", raised_result(value)
        return
    try:
        result = ToolResult.from_json(value)
    except ValidationError as problem:
        call.outcome, call.error = "failed", _invalid_result(problem)
        return
    if aborted and not result.is_error:
        result = _canonical_result(ABORTED_ERROR, ABORTED_TEXT, result.additional_contexts)
    call.outcome, call.result = "settled", result


def _call_data(core: CoreState, call: Call) -> dict[str, Frozen]:
    return {"turn": core.turn, "step": core.step, "callId": call.call_id,
            "name": call.name, "arguments": call.arguments}


def _stage_payload(core: CoreState, call: Call, **extra: Frozen) -> FrozenDict:
    return FrozenDict._adopt({"turn": core.turn, "step": core.step, "signal": core.signal(),
                              "callId": call.call_id, "name": call.name,
                              "arguments": call.arguments, **extra})


# -- one call's start (R10.3) -----------------------------------------------------------


@phase("start-call", "begin")
def start_call(core: CoreState, frame: StartCallFrame, _sent: object) -> Action:
    """R10.3: tool/call, prepare, then dispatch (or not)."""
    call = frame.call
    call_event = core.commit(ev.TOOL_CALL, _call_data(core, call))
    call.call_seq = call_event.event.seq
    frame.phase = start_call_prepare
    return call_event


@phase("start-call", "prepare")
def start_call_prepare(core: CoreState, frame: StartCallFrame, _sent: object) -> Action:
    call = frame.call
    call.outcome = "settled"
    if _aborted(core):                                        # R10.3 step 2: not prepared
        call.result = ABORTED_BEFORE_DISPATCH
        return DONE
    prepare = core.new_effect(TOOL_PREPARE, _stage_payload(core, call))
    frame.effect = prepare.id
    frame.phase = start_call_wait
    return prepare


@phase("start-call", "await_prepare")
def start_call_wait(core: CoreState, frame: StartCallFrame, _sent: object) -> Action:
    frame.phase = start_call_prepared
    return _stage_wait(frame.batch, frame.effect)


@phase("start-call", "prepared")
def start_call_prepared(core: CoreState, frame: StartCallFrame, mail: Mail) -> Action:
    if mail[0] != frame.effect:
        _absorb(core, frame.batch, mail)
        return goto(core, frame, start_call_wait)
    _, kind, value = mail
    call = frame.call
    if kind == "raise":                                       # a final error result
        assert isinstance(value, ErrorInfo)
        call.result = raised_result(value)
        return DONE
    if value is not None:                                     # a final result
        try:
            call.result = ToolResult.from_json(value)
        except ValidationError as problem:
            call.outcome, call.error = "failed", _invalid_result(problem)
        return DONE
    call.needs_finalize = True
    if _aborted(core):                                        # R10.3 step 4: not dispatched
        call.result = ABORTED_BEFORE_DISPATCH
        return DONE
    execute = core.new_effect(TOOL_EXECUTE, _stage_payload(core, call))
    frame.batch.in_flight[execute.id] = call
    call.outcome, call.dispatched = "running", True
    frame.phase = finished
    return execute


# -- commits in model order (R10.4) -----------------------------------------------------


@phase("commit-ready", "next")
def commit_ready(core: CoreState, frame: CommitReadyFrame, _sent: object) -> Action:
    """R10.4: commit settled calls in model order, up to the first unsettled or failed one."""
    batch = frame.batch
    if batch.commit_from < batch.next_start and (
            batch.failed_at is None or batch.commit_from < batch.failed_at):
        call = batch.calls[batch.commit_from]
        if call.outcome in ("pending", "running"):
            return DONE
        frame.call = call
        frame.phase = commit_ready_next
        return CommitCallFrame(phase=commit_call, batch=batch, call=call, result=False)
    return DONE


@phase("commit-ready", "committed")
def commit_ready_next(core: CoreState, frame: CommitReadyFrame, concludes: bool) -> Action:
    batch, call = frame.batch, frame.call
    assert call is not None
    frame.call = None
    if concludes:
        batch.concluded = True
    if call.outcome == "failed":
        batch.note(call)
        return DONE
    batch.commit_from += 1
    return goto(core, frame, commit_ready)


@phase("commit-call", "begin")
def commit_call(core: CoreState, frame: CommitCallFrame, _sent: object) -> Action:
    """R10.4: finalize, validate, append the result, stage contexts; True if it concludes."""
    call = frame.call
    result = call.result
    # Why settled: a call that failed is noted by the batch as soon as it fails (R10.9),
    # and nothing at or after the first failing call is committed.
    assert call.outcome == "settled" and result is not None
    if call.needs_finalize:                                   # R10.4 step 1
        finalize = core.new_effect(TOOL_FINALIZE, _stage_payload(
            core, call, result=frozen_json(normalized(result))))
        frame.effect = finalize.id
        frame.phase = commit_call_wait
        return finalize
    return _commit_result(core, frame, result)


@phase("commit-call", "await_finalize")
def commit_call_wait(core: CoreState, frame: CommitCallFrame, _sent: object) -> Action:
    frame.phase = commit_call_finalized
    return _stage_wait(frame.batch, frame.effect)


@phase("commit-call", "finalized")
def commit_call_finalized(core: CoreState, frame: CommitCallFrame, mail: Mail) -> Action:
    if mail[0] != frame.effect:
        _absorb(core, frame.batch, mail)
        return goto(core, frame, commit_call_wait)
    _, kind, value = mail
    call = frame.call
    if kind == "raise":
        assert isinstance(value, ErrorInfo)
        result = raised_result(value)
    else:
        try:
            result = ToolResult.from_json(value)
        except ValidationError as problem:
            call.outcome, call.error = "failed", _invalid_result(problem)
            return DONE
        if core.aborted and not result.is_error:              # R10.4 step 1
            result = (_canonical_result(ABORTED_ERROR, ABORTED_TEXT,
                                        result.additional_contexts) if call.dispatched
                      else _canonical_result(ABORTED_BEFORE_DISPATCH_ERROR,
                                             ABORTED_BEFORE_DISPATCH_TEXT,
                                             result.additional_contexts))
    return _commit_result(core, frame, result)


def _commit_result(core: CoreState, frame: CommitCallFrame, result: ToolResult) -> Action:
    result = normalized(result)                               # R10.4 step 2 (V16)
    frame.committed = result
    frame.phase = commit_call_staged
    return _tool_result(core, frame.call, result)             # R10.4 step 3


@phase("commit-call", "staged")
def commit_call_staged(core: CoreState, frame: CommitCallFrame, _sent: object) -> Action:
    result = frame.committed
    assert result is not None
    for context in result.additional_contexts:                # R10.4 step 4
        core.outbox.stage(context, False)
    frame.result = decisions.concludes(result.concludes_turn, result.is_error, False)  # R10.6
    return DONE


def _tool_result(core: CoreState, call: Call, result: ToolResult) -> Durable:
    block: dict[str, Frozen] = {"type": "tool-result", "toolCallId": call.call_id,
                                "content": result.content}
    if result.is_error:
        block["isError"] = True
    seq = len(core.log)
    message = Message(id=core.mint_id("tool-result", seq), role="user",
                      content=FrozenList((FrozenDict(block),)),
                      source=FrozenDict({"kind": "tool", "callId": call.call_id}))
    data: dict[str, Frozen] = {"turn": core.turn, "step": core.step,
                               "message": frozen_message(message)}
    if result.error is not None:
        data["error"] = result.error
    if result.meta is not None:
        data["meta"] = result.meta
    return core.commit(ev.TOOL_RESULT, data, surface=True, sources=[call.call_seq])
