"""The tool batch (rule R10): planning, starting calls in exclusive and parallel groups,
settlements taken as they come (P6), finalize, and commits in model order."""
from __future__ import annotations

import json
from collections.abc import Generator
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
    Output,
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


class ToolBatch(Failures):
    """One tool batch of a step (R10)."""

    def _mode(self, call: _Call) -> ToolMode:
        return self.config.tool_modes.get(call.name, "exclusive")

    def _tool_batch(self, blocks: list[FrozenDict]) -> Generator[Output | _Wait, _Mail | None, bool]:
        batch = _Batch([_Call(i, str(b["id"]), str(b["name"]), plan_arguments(str(b["arguments"])))
                        for i, b in enumerate(blocks)])
        calls = batch.calls
        ctrl = self._ctrl
        assert ctrl is not None
        while batch.next_start < len(calls) and batch.failed_at is None and not ctrl.aborted:
            first = calls[batch.next_start]
            pool = self._mode(first) == "parallel"
            limit = self.config.max_parallel_tool_calls if pool else 1
            group_open = True
            batch.in_flight.clear()
            batch.commit_from = batch.next_start
            while True:
                # R10.2: start calls while fewer than the limit are in flight (dispatched and
                # not yet taken), committing what is committable after each start.
                while (group_open and batch.failed_at is None and not ctrl.aborted
                       and len(batch.in_flight) < limit and batch.next_start < len(calls)):
                    call = calls[batch.next_start]
                    if call is not first and (not pool or self._mode(call) != "parallel"):
                        group_open = False
                        break
                    batch.next_start += 1
                    yield from self._start_call(batch, call)            # R10.3
                    batch.note(call)
                    if not pool:
                        group_open = False
                    yield from self._commit_ready(batch)
                if not batch.in_flight:
                    if (batch.failed_at is not None or ctrl.aborted or not group_open
                            or batch.next_start >= len(calls)):
                        break
                    continue
                # R10.2: take a settled call (the earliest started), waiting for a settlement
                # if none has come; every settlement that has arrived is taken with it (P6).
                if not any(c.outcome != "running" for c in batch.in_flight.values()):
                    mail = yield _Wait(batch.running())
                    assert mail is not None
                    self._absorb(batch, mail)
                    while (more := self._take_mail(batch.running())) is not None:
                        self._absorb(batch, more)
                taken = next(e for e, c in batch.in_flight.items() if c.outcome != "running")
                del batch.in_flight[taken]
                yield from self._commit_ready(batch)
        if batch.failed_at is not None:                           # R10.9
            failed = calls[batch.failed_at]
            assert failed.error is not None
            raise _Failure(failed.error, code="INVALID_TOOL_RESULT")
        if ctrl.aborted:                                          # R10.7 synthetic pairs
            for call in calls[batch.next_start:]:
                call_event = self._commit(ev.TOOL_CALL, self._call_data(call))
                call.call_seq = call_event.event.seq
                yield call_event
                yield self._tool_result(call, ABD_RESULT)
        return batch.concluded

    def _absorb(self, batch: _Batch, mail: _Mail) -> None:
        """R10.3 step 5: a settlement of a dispatched call, taken (P6) when it arrives before
        what the batch waits for; the call stays in flight until the batch takes it."""
        effect_id, kind, value = mail
        ctrl = self._ctrl
        assert ctrl is not None
        call = batch.in_flight[effect_id]
        self._settle_call(call, kind, value, ctrl.aborted)
        batch.note(call)

    def _batch_await(self, batch: _Batch,
                     effect_id: int) -> Generator[Output | _Wait, _Mail | None, _Mail]:
        """Wait for a prepare or finalize completion; settlements of dispatched calls that
        arrive before it settle their calls first, in arrival order (P6)."""
        while True:
            mail = yield _Wait(frozenset((effect_id,)) | batch.running())
            assert mail is not None
            if mail[0] == effect_id:
                return mail
            self._absorb(batch, mail)

    def _commit_ready(self, batch: _Batch) -> Generator[Output | _Wait, _Mail | None, None]:
        """R10.4: commit settled calls in model order, up to the first unsettled or failed one."""
        calls = batch.calls
        while batch.commit_from < batch.next_start and (
                batch.failed_at is None or batch.commit_from < batch.failed_at):
            call = calls[batch.commit_from]
            if call.outcome in ("pending", "running"):
                break
            if (yield from self._commit_call(batch, call)):
                batch.concluded = True
            if call.outcome == "failed":
                batch.note(call)
                break
            batch.commit_from += 1

    def _call_data(self, call: _Call) -> dict[str, Frozen]:
        return {"turn": self._turn, "step": self._step, "callId": call.call_id,
                "name": call.name, "arguments": call.arguments}

    def _stage_payload(self, call: _Call, **extra: Frozen) -> FrozenDict:
        return FrozenDict({"turn": self._turn, "step": self._step, "signal": self._signal(),
                           "callId": call.call_id, "name": call.name,
                           "arguments": call.arguments, **extra})

    def _start_call(self, batch: _Batch,
                    call: _Call) -> Generator[Output | _Wait, _Mail | None, None]:
        """R10.3: tool/call, prepare, then dispatch (or not)."""
        call_event = self._commit(ev.TOOL_CALL, self._call_data(call))
        call.call_seq = call_event.event.seq
        yield call_event
        ctrl = self._ctrl
        assert ctrl is not None
        call.outcome = "settled"
        if ctrl.aborted:                                          # R10.3 step 2: not prepared
            call.result = ABD_RESULT
            return
        prepare = self._new_effect(TOOL_PREPARE, self._stage_payload(call))
        yield prepare
        _, kind, value = yield from self._batch_await(batch, prepare.id)
        if kind == "raise":                                       # a final error result
            assert isinstance(value, ErrorInfo)
            call.result = raised_result(value)
            return
        if value is not None:                                     # a final result
            try:
                call.result = ToolResult.from_json(value)
            except ValidationError as problem:
                call.outcome, call.error = "failed", _invalid_result(problem)
            return
        call.needs_finalize = True
        if ctrl.aborted:                                          # R10.3 step 4: not dispatched
            call.result = ABD_RESULT
            return
        execute = self._new_effect(TOOL_EXECUTE, self._stage_payload(call))
        batch.in_flight[execute.id] = call
        call.outcome, call.dispatched = "running", True
        yield execute

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

    def _commit_call(self, batch: _Batch,
                     call: _Call) -> Generator[Output | _Wait, _Mail | None, bool]:
        """R10.4: finalize, validate, append the result, stage contexts; True if it concludes."""
        if call.outcome == "failed":
            return False
        result = call.result
        assert result is not None
        if call.needs_finalize:                                   # R10.4 step 1
            finalize = self._new_effect(TOOL_FINALIZE, self._stage_payload(
                call, result=frozen_json(normalized(result))))
            yield finalize
            _, kind, value = yield from self._batch_await(batch, finalize.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                result = raised_result(value)
            else:
                try:
                    result = ToolResult.from_json(value)
                except ValidationError as problem:
                    call.outcome, call.error = "failed", _invalid_result(problem)
                    return False
                ctrl = self._ctrl
                if ctrl is not None and ctrl.aborted and not result.is_error:   # R10.4 step 1
                    result = (_canonical_result(ABORTED_ERROR, ABORTED_TEXT,
                                                result.additional_contexts) if call.dispatched
                              else _canonical_result(ABD_ERROR, ABD_TEXT,
                                                     result.additional_contexts))
        result = normalized(result)                               # R10.4 step 2 (V16)
        yield self._tool_result(call, result)                     # R10.4 step 3
        for context in result.additional_contexts:                # R10.4 step 4
            self.outbox.stage(context, False)
        return decisions.concludes(result.concludes_turn, result.is_error, False)  # R10.6

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
