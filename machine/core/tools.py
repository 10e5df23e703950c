"""The tool batch (rule R10): planning, starting calls in exclusive and parallel groups,
settlements taken as they come (P6), finalize, and commits in model order."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from machine import decisions
from machine import events as ev
from machine.core.config import ToolMode
from machine.core.failures import Failures
from machine.core.records import (
    ABD_ERROR,
    ABD_TEXT,
    ABORTED_ERROR,
    ABORTED_TEXT,
    DONE,
    Action,
    Frame,
    _Failure,
    _Mail,
    _Wait,
    frozen_json,
    frozen_message,
)
from machine.errors import (
    ValidationError,
)
from machine.io import (
    TOOL_EXECUTE,
    TOOL_FINALIZE,
    TOOL_PREPARE,
    Durable,
)
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
    FrozenList,
    freeze,
)
from machine.vocabulary import (
    ErrorInfo,
    Message,
    ToolResult,
    minted_id,
)


@dataclass(slots=True)
class _Call:
    """One planned tool call of a batch (R10)."""

    index: int
    call_id: str
    name: str
    arguments: Frozen
    call_seq: int = -1
    #: pending: not started; running: executing; settled: has its result; failed: a stage's
    #: value did not validate (R10.9)
    outcome: Literal["pending", "running", "settled", "failed"] = "pending"
    result: ToolResult | None = None
    needs_finalize: bool = False     # R10.4.1: its result still goes through finalize
    dispatched: bool = False         # its execute was requested (R10.11 vs R10.10)
    error: ErrorInfo | None = None


@dataclass(slots=True)
class _Batch:
    """One tool batch in progress (R10): its calls, the dispatched calls not yet taken (by
    execute effect id, in start order), and how far starting and committing have come."""

    calls: list[_Call]
    in_flight: dict[int, _Call] = field(default_factory=dict)
    next_start: int = 0
    commit_from: int = 0
    failed_at: int | None = None
    concluded: bool = False

    def running(self) -> frozenset[int]:
        """The execute effects of dispatched calls still waiting for their settlement."""
        return frozenset(e for e, c in self.in_flight.items() if c.outcome == "running")

    def note(self, call: _Call) -> None:
        """R10.9: a failing call (the first in model order) stops the batch."""
        if call.outcome == "failed" and (self.failed_at is None or call.index < self.failed_at):
            self.failed_at = call.index


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


ABD_RESULT: Final = _canonical_result(ABD_ERROR, ABD_TEXT)


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


@dataclass(slots=True, kw_only=True)
class ToolBatchFrame(Frame):
    """A tool batch in progress (R10): the batch, and the group being started: its first
    call, whether it is a parallel pool, its limit, whether it still takes calls, and the
    call just started. Its result says whether a committed result concluded the turn."""

    batch: _Batch
    first: _Call | None = None
    pool: bool = False
    limit: int = 1
    group_open: bool = False
    call: _Call | None = None
    synthetic: int = 0


@dataclass(slots=True, kw_only=True)
class StartCallFrame(Frame):
    """R10.3: one call being started: its tool/call, prepare, then dispatch (or not)."""

    batch: _Batch
    call: _Call
    effect: int = -1


@dataclass(slots=True, kw_only=True)
class CommitReadyFrame(Frame):
    """R10.4: settled calls being committed in model order; ``call`` is the one in commit."""

    batch: _Batch
    call: _Call | None = None


@dataclass(slots=True, kw_only=True)
class CommitCallFrame(Frame):
    """R10.4: one call's commit: finalize, validate, append, stage; the result says whether
    it concludes the turn."""

    batch: _Batch
    call: _Call
    effect: int = -1
    committed: ToolResult | None = None


class ToolBatch(Failures):
    """One tool batch of a step (R10)."""

    def _mode(self, call: _Call) -> ToolMode:
        return self.config.tool_modes.get(call.name, "exclusive")

    def _aborted(self) -> bool:
        ctrl = self._ctrl
        assert ctrl is not None
        return ctrl.aborted

    def _tool_batch(self, blocks: list[FrozenDict]) -> ToolBatchFrame:
        """R10: the batch of the step's tool calls, in groups."""
        batch = _Batch([_Call(i, str(b["id"]), str(b["name"]), plan_arguments(str(b["arguments"])))
                        for i, b in enumerate(blocks)])
        return ToolBatchFrame(phase=ToolBatch._batch_group, batch=batch)

    def _batch_group(self, frame: ToolBatchFrame, _sent: object) -> Action:
        """R10.2: the next group (an exclusive call, or a pool of parallel ones)."""
        batch = frame.batch
        calls = batch.calls
        if not (batch.next_start < len(calls) and batch.failed_at is None
                and not self._aborted()):
            return ToolBatch._batch_end(self, frame, None)
        first = frame.first = calls[batch.next_start]
        frame.pool = self._mode(first) == "parallel"
        frame.limit = self.config.max_parallel_tool_calls if frame.pool else 1
        frame.group_open = True
        batch.in_flight.clear()
        batch.commit_from = batch.next_start
        return ToolBatch._batch_fill(self, frame, None)

    def _batch_fill(self, frame: ToolBatchFrame, _sent: object) -> Action:
        """R10.2: start calls while fewer than the limit are in flight (dispatched and not yet
        taken), committing what is committable after each start."""
        batch = frame.batch
        calls = batch.calls
        if (frame.group_open and batch.failed_at is None and not self._aborted()
                and len(batch.in_flight) < frame.limit and batch.next_start < len(calls)):
            call = calls[batch.next_start]
            if call is not frame.first and (not frame.pool or self._mode(call) != "parallel"):
                frame.group_open = False
                return ToolBatch._batch_take(self, frame, None)
            batch.next_start += 1
            frame.call = call
            frame.phase = ToolBatch._batch_started
            return StartCallFrame(phase=ToolBatch._start_call, batch=batch, call=call)   # R10.3
        return ToolBatch._batch_take(self, frame, None)

    def _batch_started(self, frame: ToolBatchFrame, _sent: object) -> Action:
        call = frame.call
        assert call is not None
        frame.call = None
        frame.batch.note(call)
        if not frame.pool:
            frame.group_open = False
        frame.phase = ToolBatch._batch_fill
        return CommitReadyFrame(phase=ToolBatch._commit_ready, batch=frame.batch)

    def _batch_take(self, frame: ToolBatchFrame, _sent: object) -> Action:
        """R10.2: take a settled call (the earliest started), waiting for a settlement if none
        has come; every settlement that has arrived is taken with it (P6)."""
        batch = frame.batch
        if not batch.in_flight:
            if (batch.failed_at is not None or self._aborted() or not frame.group_open
                    or batch.next_start >= len(batch.calls)):
                return ToolBatch._batch_group(self, frame, None)
            return ToolBatch._batch_fill(self, frame, None)
        if not any(c.outcome != "running" for c in batch.in_flight.values()):
            frame.phase = ToolBatch._batch_settled
            return _Wait(batch.running())
        return ToolBatch._batch_taken(self, frame, None)

    def _batch_settled(self, frame: ToolBatchFrame, mail: _Mail) -> Action:
        batch = frame.batch
        self._absorb(batch, mail)
        while (more := self._take_mail(batch.running())) is not None:
            self._absorb(batch, more)
        return ToolBatch._batch_taken(self, frame, None)

    def _batch_taken(self, frame: ToolBatchFrame, _sent: object) -> Action:
        batch = frame.batch
        taken = next(e for e, c in batch.in_flight.items() if c.outcome != "running")
        del batch.in_flight[taken]
        frame.phase = ToolBatch._batch_fill
        return CommitReadyFrame(phase=ToolBatch._commit_ready, batch=batch)

    def _batch_end(self, frame: ToolBatchFrame, _sent: object) -> Action:
        batch = frame.batch
        calls = batch.calls
        if batch.failed_at is not None:                           # R10.9
            failed = calls[batch.failed_at]
            assert failed.error is not None
            raise _Failure(failed.error)
        frame.result = batch.concluded
        if self._aborted():                                       # R10.7 synthetic pairs
            frame.synthetic = batch.next_start
            return ToolBatch._batch_synthetic_call(self, frame, None)
        return DONE

    def _batch_synthetic_call(self, frame: ToolBatchFrame, _sent: object) -> Action:
        calls = frame.batch.calls
        if frame.synthetic >= len(calls):
            return DONE
        call = calls[frame.synthetic]
        call_event = self._commit(ev.TOOL_CALL, self._call_data(call))
        call.call_seq = call_event.event.seq
        frame.phase = ToolBatch._batch_synthetic_result
        return call_event

    def _batch_synthetic_result(self, frame: ToolBatchFrame, _sent: object) -> Action:
        call = frame.batch.calls[frame.synthetic]
        frame.synthetic += 1
        frame.phase = ToolBatch._batch_synthetic_call
        return self._tool_result(call, ABD_RESULT)

    def _absorb(self, batch: _Batch, mail: _Mail) -> None:
        """R10.3 step 5: a settlement of a dispatched call, taken (P6) when it arrives before
        what the batch waits for; the call stays in flight until the batch takes it."""
        effect_id, kind, value = mail
        call = batch.in_flight[effect_id]
        self._settle_call(call, kind, value, self._aborted())
        batch.note(call)

    def _stage_wait(self, batch: _Batch, effect_id: int) -> _Wait:
        """Wait for a prepare or finalize completion; settlements of dispatched calls that
        arrive before it settle their calls first, in arrival order (P6)."""
        return _Wait(frozenset((effect_id,)) | batch.running())

    def _commit_ready(self, frame: CommitReadyFrame, _sent: object) -> Action:
        """R10.4: commit settled calls in model order, up to the first unsettled or failed one."""
        batch = frame.batch
        if batch.commit_from < batch.next_start and (
                batch.failed_at is None or batch.commit_from < batch.failed_at):
            call = batch.calls[batch.commit_from]
            if call.outcome in ("pending", "running"):
                return DONE
            frame.call = call
            frame.phase = ToolBatch._commit_ready_next
            return CommitCallFrame(phase=ToolBatch._commit_call, batch=batch, call=call,
                                   result=False)
        return DONE

    def _commit_ready_next(self, frame: CommitReadyFrame, concludes: bool) -> Action:
        batch, call = frame.batch, frame.call
        assert call is not None
        frame.call = None
        if concludes:
            batch.concluded = True
        if call.outcome == "failed":
            batch.note(call)
            return DONE
        batch.commit_from += 1
        return ToolBatch._commit_ready(self, frame, None)

    def _call_data(self, call: _Call) -> dict[str, Frozen]:
        return {"turn": self._turn, "step": self._step, "callId": call.call_id,
                "name": call.name, "arguments": call.arguments}

    def _stage_payload(self, call: _Call, **extra: Frozen) -> FrozenDict:
        return FrozenDict._adopt({"turn": self._turn, "step": self._step, "signal": self._signal(),
                           "callId": call.call_id, "name": call.name,
                           "arguments": call.arguments, **extra})

    def _start_call(self, frame: StartCallFrame, _sent: object) -> Action:
        """R10.3: tool/call, prepare, then dispatch (or not)."""
        call = frame.call
        call_event = self._commit(ev.TOOL_CALL, self._call_data(call))
        call.call_seq = call_event.event.seq
        frame.phase = ToolBatch._start_call_prepare
        return call_event

    def _start_call_prepare(self, frame: StartCallFrame, _sent: object) -> Action:
        call = frame.call
        call.outcome = "settled"
        if self._aborted():                                       # R10.3 step 2: not prepared
            call.result = ABD_RESULT
            return DONE
        prepare = self._new_effect(TOOL_PREPARE, self._stage_payload(call))
        frame.effect = prepare.id
        frame.phase = ToolBatch._start_call_wait
        return prepare

    def _start_call_wait(self, frame: StartCallFrame, _sent: object) -> Action:
        frame.phase = ToolBatch._start_call_prepared
        return self._stage_wait(frame.batch, frame.effect)

    def _start_call_prepared(self, frame: StartCallFrame, mail: _Mail) -> Action:
        if mail[0] != frame.effect:
            self._absorb(frame.batch, mail)
            return ToolBatch._start_call_wait(self, frame, None)
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
        if self._aborted():                                       # R10.3 step 4: not dispatched
            call.result = ABD_RESULT
            return DONE
        execute = self._new_effect(TOOL_EXECUTE, self._stage_payload(call))
        frame.batch.in_flight[execute.id] = call
        call.outcome, call.dispatched = "running", True
        frame.phase = Failures._finished
        return execute

    def _settle_call(self, call: _Call, kind: str, value: Any, aborted: bool) -> None:
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

    def _commit_call(self, frame: CommitCallFrame, _sent: object) -> Action:
        """R10.4: finalize, validate, append the result, stage contexts; True if it concludes."""
        call = frame.call
        if call.outcome == "failed":
            return DONE
        result = call.result
        assert result is not None
        if call.needs_finalize:                                   # R10.4 step 1
            finalize = self._new_effect(TOOL_FINALIZE, self._stage_payload(
                call, result=frozen_json(normalized(result))))
            frame.effect = finalize.id
            frame.phase = ToolBatch._commit_call_wait
            return finalize
        return self._commit_result(frame, result)

    def _commit_call_wait(self, frame: CommitCallFrame, _sent: object) -> Action:
        frame.phase = ToolBatch._commit_call_finalized
        return self._stage_wait(frame.batch, frame.effect)

    def _commit_call_finalized(self, frame: CommitCallFrame, mail: _Mail) -> Action:
        if mail[0] != frame.effect:
            self._absorb(frame.batch, mail)
            return ToolBatch._commit_call_wait(self, frame, None)
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
            ctrl = self._ctrl
            if ctrl is not None and ctrl.aborted and not result.is_error:   # R10.4 step 1
                result = (_canonical_result(ABORTED_ERROR, ABORTED_TEXT,
                                            result.additional_contexts) if call.dispatched
                          else _canonical_result(ABD_ERROR, ABD_TEXT,
                                                 result.additional_contexts))
        return self._commit_result(frame, result)

    def _commit_result(self, frame: CommitCallFrame, result: ToolResult) -> Action:
        result = normalized(result)                               # R10.4 step 2 (V16)
        frame.committed = result
        frame.phase = ToolBatch._commit_call_staged
        return self._tool_result(frame.call, result)              # R10.4 step 3

    def _commit_call_staged(self, frame: CommitCallFrame, _sent: object) -> Action:
        result = frame.committed
        assert result is not None
        for context in result.additional_contexts:                # R10.4 step 4
            self.outbox.stage(context, False)
        frame.result = decisions.concludes(result.concludes_turn, result.is_error, False)  # R10.6
        return DONE

    def _tool_result(self, call: _Call, result: ToolResult) -> Durable:
        block: dict[str, Frozen] = {"type": "tool-result", "toolCallId": call.call_id,
                                    "content": result.content}
        if result.is_error:
            block["isError"] = True
        seq = len(self.log)
        message = Message(id=minted_id(self._mint, "tool-result", seq), role="user",
                          content=FrozenList((FrozenDict(block),)),
                          source=FrozenDict({"kind": "tool", "callId": call.call_id}))
        data: dict[str, Frozen] = {"turn": self._turn, "step": self._step,
                                   "message": frozen_message(message)}
        if result.error is not None:
            data["error"] = result.error
        if result.meta is not None:
            data["meta"] = result.meta
        return self._commit(ev.TOOL_RESULT, data, surface=True, sources=[call.call_seq])
