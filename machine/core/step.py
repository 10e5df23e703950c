"""One step (rules R9, R13.2, R14, P12, P13): hooks, the request and its header, the model
stream folded into content blocks, the assistant message, the tool batch, the step's end."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TypeAlias

from machine import decisions
from machine import events as ev
from machine.core.config import _unset
from machine.core.records import (
    DEFAULT_ABORT_FAILURE,
    DONE,
    NO_ROUTE_MESSAGE,
    Action,
    Frame,
    Phase,
    _Aborted,
    _Failure,
    _Mail,
    _StepOutcome,
    _Wait,
    frozen_json,
    frozen_message,
)
from machine.core.tools import (
    ToolBatch,
)
from machine.errors import (
    ValidationError,
)
from machine.io import (
    MODEL,
    REQUEST,
    REQUEST_ERROR,
    STEP_HOOK,
    SYSTEM_PROMPT,
    EffectKind,
)
from machine.jsonvalue import (
    Frozen,
    FrozenDict,
    FrozenList,
    JsonLike,
    freeze,
    same_json,
)
from machine.vocabulary import (
    CHUNK_TYPES,
    WHITESPACE,
    ErrorInfo,
    LlmFailure,
    Message,
    block_problem,
    freeze_source,
    minted_id,
    validate_chunk,
)

#: R9.6: what the request effect's resolution may hold: the header's fields and the prepared
#: request's retry policy (opaque, handed to recovery by R13.2 as the original does).
_RESOLUTION_FIELDS = frozenset({"config", "system", "tools", "retryPolicy"})


def _is_retry(value: JsonLike) -> bool:
    """R13.2: only exactly {kind:'retry'} authorizes a retry."""
    return (isinstance(value, (dict, FrozenDict)) and len(value) == 1
            and value.get("kind") == "retry")


def _chunk_content_problem(chunk: FrozenDict) -> str | None:
    """Rule P12: a streamed chunk's type is one of CHUNK_TYPES (D5), a finish carries no
    usage (usage is its own chunk), and a content-carrying chunk has the fields it needs."""
    kind = chunk["type"]
    if kind not in CHUNK_TYPES:
        return (f"invalid chunk: {kind!r} is not a chunk type (one of "
                f"{', '.join(sorted(CHUNK_TYPES))})")
    if kind == "finish" and "usage" in chunk:
        return "invalid chunk: a finish chunk carries no usage; usage is its own chunk"
    if kind in ("text", "reasoning") and not isinstance(chunk.get("text"), str):
        return f"invalid chunk: a {kind} chunk needs a string 'text'"
    if kind == "tool-call":
        if not isinstance(chunk.get("id"), str) or not chunk.get("id"):
            return "invalid chunk: a tool-call chunk needs a non-empty string 'id'"
        if not isinstance(chunk.get("name"), str):
            return "invalid chunk: a tool-call chunk needs a string 'name'"
        if not isinstance(chunk.get("arguments"), str):
            return "invalid chunk: a tool-call chunk needs 'arguments', JSON text (a string)"
    if kind == "block":
        block = chunk.get("block")
        problem = block_problem(block) if block is not None else "a block chunk needs a 'block'"
        if problem:
            return f"invalid chunk: {problem}"
    return None


#: What `_fold` builds: content blocks, and for a run of text or reasoning chunks a list
#: [kind, piece, piece, ...] that `_folded_blocks` joins into one block at the end.
_Folded: TypeAlias = "FrozenDict | list[str]"


def _fold(content: list[_Folded], chunk: FrozenDict, open_kind: str | None) -> str | None:
    """Rule P12: how the core folds model chunks into content blocks.

    Consecutive ``text`` chunks extend one text block (likewise ``reasoning``):
    *open_kind* is the kind of the block the previous content chunk started, and the
    kind to pass next time is returned. ``tool-call`` chunks {id, name, arguments} add a
    call and ``block`` chunks add their ``block`` as is; both end a run of text. Other
    chunk types carry no content and leave the run as it is. (A run is kept as its
    pieces and joined once by `_folded_blocks`: joining at every chunk would copy the
    text so far each time.)
    """
    kind = chunk["type"]
    if kind in ("text", "reasoning"):
        piece = str(chunk["text"])
        if content and open_kind == kind:
            run = content[-1]
            assert type(run) is list
            run.append(piece)
        else:
            content.append([str(kind), piece])
        return str(kind)
    if kind == "tool-call":
        content.append(FrozenDict({"type": "tool-call", "id": chunk["id"],
                                   "name": chunk["name"], "arguments": chunk["arguments"]}))
        return None
    if kind == "block":
        block = chunk["block"]
        assert isinstance(block, FrozenDict)
        content.append(block)
        return None
    return open_kind


def _folded_blocks(content: list[_Folded]) -> list[FrozenDict]:
    """The content blocks `_fold` built, each run of text or reasoning joined into one."""
    return [FrozenDict({"type": item[0], "text": "".join(item[1:])}) if type(item) is list
            else item for item in content]  # type: ignore[misc]


@dataclass(slots=True, kw_only=True)
class StepFrame(Frame):
    """One step in progress (R9): its turn, step and signal, the system prompt and request
    header it prepared, the model stream and what it folded so far (P12), and the outcome."""

    turn: int
    step: int
    signal: int
    hook: int = -1                    # the hook effect waited for, and the phase after it
    then: Phase | None = None
    system: Frozen = None
    history_end: int = 0
    header: FrozenDict | None = None
    # R9.6: the prepared request's {retryPolicy} when its preparation named one (R13.2 passes
    # it on; absent stays absent, as every optional field of a payload)
    prepared: FrozenDict | None = None
    model: int = -1
    awaiting: _Wait | None = None
    folded: list[_Folded] = field(default_factory=list)
    open_kind: str | None = None      # P12: the run of text or reasoning chunks being folded
    chunk_seqs: list[int] = field(default_factory=list)
    chunk: FrozenDict | None = None   # the chunk just appended, folded when the loop goes on
    finish: FrozenDict | None = None
    usage: Frozen = None              # R9.8: the last usage chunk's figures
    failure: _Failure | None = None   # raised once its release notice is out
    interrupted: bool = False         # D15: the abort stopped the stream; keep what it delivered
    calls: list[FrozenDict] = field(default_factory=list)   # R9.9: the message's tool calls
    concluded: bool = False
    took_steering: bool = False
    max_tokens: bool = False


@dataclass(slots=True, kw_only=True)
class RequestFailedFrame(Frame):
    """R13.2: a failed model request: step/end, recovery, classification."""

    error: ErrorInfo
    facts: LlmFailure
    prepared: FrozenDict | None = None
    effect: int = -1
    failure_json: FrozenDict | None = None


class Step(ToolBatch):
    """One step of a turn (R9)."""

    def _hook(self, frame: StepFrame, kind: EffectKind, payload: FrozenDict,
              then: Phase) -> Action:
        """Request an effect, wait, and go on with *then* given its value; a failure of the
        effect fails the turn (R15)."""
        effect = self._new_effect(kind, payload)
        frame.hook, frame.then = effect.id, then
        frame.phase = Step._hook_wait
        return effect

    def _hook_wait(self, frame: StepFrame, _sent: object) -> Action:
        frame.phase = Step._hook_answered
        return _Wait(frozenset((frame.hook,)))

    def _hook_answered(self, frame: StepFrame, mail: _Mail) -> Action:
        _, mail_kind, value = mail
        if mail_kind == "raise":
            assert isinstance(value, ErrorInfo)
            raise _Failure(value)
        then = frame.then
        assert then is not None
        frame.phase, frame.then = then, None
        return then(self, frame, value)

    def _one_step(self) -> StepFrame:
        """R9: one step."""
        return StepFrame(phase=Step._step_begin, turn=self._turn, step=self._step,
                         signal=self._signal())

    def _step_begin(self, frame: StepFrame, _sent: object) -> Action:
        return self._hook(frame, STEP_HOOK, FrozenDict._adopt({
            "turn": frame.turn, "step": frame.step, "signal": frame.signal}),
            Step._step_hooked)                                    # R9.1

    def _step_hooked(self, frame: StepFrame, _sent: object) -> Action:
        self._check_signal()
        return self._drain(frame, Step._step_assemble)            # R9.2

    def _step_assemble(self, frame: StepFrame, _sent: object) -> Action:
        self.lifecycle.fire("assemble")
        return self._hook(frame, SYSTEM_PROMPT, FrozenDict._adopt({
            "turn": frame.turn, "step": frame.step, "signal": frame.signal}),
            Step._step_system)                                    # R9.3

    def _step_system(self, frame: StepFrame, system: JsonLike) -> Action:
        try:
            frame.system = freeze(system, "system")
        except ValidationError as bad_system:
            raise _Failure(ErrorInfo(str(bad_system), "InvalidSystemPromptError",
                                     "INVALID_SYSTEM_PROMPT")) from None
        self._check_signal()
        self.lifecycle.fire("request")
        frame.history_end = len(self.log)                         # R9.4
        frame.phase = Step._step_started
        return self._commit(ev.STEP_START, {"turn": frame.turn, "step": frame.step})   # R9.5

    def _step_started(self, frame: StepFrame, _sent: object) -> Action:
        self._check_signal()
        seed = self.config.request_options if not self._header_logged else (
            self.log.last_header or FrozenDict()).get("config", FrozenDict())
        return self._hook(frame, REQUEST, FrozenDict({
            "turn": frame.turn, "step": frame.step, "signal": frame.signal, "config": seed,
            "system": frame.system}), Step._step_header)          # R9.6

    def _step_header(self, frame: StepFrame, raw_header: JsonLike) -> Action:
        self._check_signal()
        header = frame.header = self._validate_header(raw_header)
        if "retryPolicy" in header:                               # R9.6: not part of the header
            frame.prepared = FrozenDict._adopt({"retryPolicy": header["retryPolicy"]})
            header = frame.header = FrozenDict._adopt(
                {key: value for key, value in header.items() if key != "retryPolicy"})
        header_reason = decisions.header_reason(
            self._header_logged, self.log.has_header,
            # Why: same_json compares as canonical JSON text would, without encoding twice.
            self._header_logged and not same_json(header, self.log.last_header))
        self._header_logged = True
        if header_reason is not None:
            frame.phase = Step._step_stream
            return self._commit(ev.REQUEST_HEADER, {"header": header, "reason": header_reason})
        return Step._step_stream(self, frame, None)

    def _step_stream(self, frame: StepFrame, _sent: object) -> Action:
        self.lifecycle.fire("stream")                             # R9.7
        model = self._new_effect(MODEL, FrozenDict._adopt({
            "turn": frame.turn, "step": frame.step, "signal": frame.signal,
            "header": frame.header, "historyEnd": frame.history_end}),
            self.log.history(frame.history_end))
        frame.model = model.id
        # Why one _Wait for the whole stream (what a hook waits with, without one per chunk):
        # the phases below run once per chunk.
        frame.awaiting = _Wait(frozenset((model.id,)))
        frame.phase = Step._step_stream_wait
        return model

    def _step_stream_wait(self, frame: StepFrame, _sent: object) -> Action:
        chunk = frame.chunk
        if chunk is not None:                                     # the chunk just appended
            frame.chunk = None
            chunk_type = chunk["type"]
            if chunk_type == "finish":
                frame.finish = chunk
            elif chunk_type == "usage":
                frame.usage = chunk["usage"]
            else:
                frame.open_kind = _fold(frame.folded, chunk, frame.open_kind)
        frame.phase = Step._step_stream_mail
        assert frame.awaiting is not None
        return frame.awaiting

    def _step_stream_mail(self, frame: StepFrame, mail: _Mail) -> Action:
        _, kind, value = mail
        if kind == "raise":
            assert isinstance(value, ErrorInfo)
            if value.failure is None:                             # not a model failure
                return self._stream_stopped(frame, _Failure(value))
            frame.phase = Step._step_request_failed
            return self._request_failed(value, value.failure, frame.prepared)
        if kind == "end":
            if frame.finish is None:
                return self._stream_stopped(frame, _Failure(ErrorInfo(
                    "model stream ended without a finish chunk", "InvalidChunkError",
                    "INVALID_CHUNK")))
            return Step._step_streamed(self, frame, None)
        if self._ctrl is not None and self._ctrl.aborted:        # R9.7.1
            frame.interrupted = True
            release = self._release(frame.model)
            if release is not None:
                frame.phase = Step._step_raise
                return release
            return Step._step_raise(self, frame, None)
        problem: str | None = None
        chunk: FrozenDict | None = None
        if frame.finish is not None:
            problem = "a chunk arrived after the finish chunk"
        else:
            try:
                chunk = validate_chunk(value)
                problem = _chunk_content_problem(chunk)
            except ValidationError as error:
                problem = f"invalid chunk: {error}"
        if problem is not None or chunk is None:                  # R9.7 / D5
            failure = _Failure(ErrorInfo(problem or "invalid chunk", "InvalidChunkError",
                                         "INVALID_CHUNK"))
            release = self._release(frame.model)
            if release is not None:
                frame.failure = failure
                frame.phase = Step._step_raise
                return release
            raise failure
        durable = self._commit(ev.ASSISTANT_CHUNK, {"turn": frame.turn, "step": frame.step,
                                                    "chunk": chunk})
        frame.chunk_seqs.append(durable.event.seq)
        frame.chunk = chunk
        frame.phase = Step._step_stream_wait
        return durable

    def _stream_stopped(self, frame: StepFrame, failure: _Failure) -> Action:
        """The stream ended in a generic failure (R9.7); with the signal aborted, that is the
        cancel stopping it, and what it delivered is kept first (D15)."""
        if self._ctrl is None or not self._ctrl.aborted:
            raise failure
        frame.failure, frame.interrupted = failure, True
        return Step._step_raise(self, frame, None)

    def _step_raise(self, frame: StepFrame, _sent: object) -> Action:
        """The stream was released (P5) or stopped: the step fails, aborted or with its
        failure, once a stream the abort stopped has its interrupted message (D15)."""
        if frame.interrupted:
            frame.interrupted = False
            durable = self._interrupted_message(frame)
            if durable is not None:
                frame.phase = Step._step_raise
                return durable
        if frame.failure is not None:
            raise frame.failure
        raise _Aborted()

    def _interrupted_message(self, frame: StepFrame) -> Action | None:
        """D15: the text and reasoning the stream delivered before the abort stopped it (blocks
        that are not blank, in stream order; tool calls and other blocks left out) become the
        step's assistant message marked interrupted; nothing when there is none."""
        kept = [block for block in _folded_blocks(frame.folded)
                if block["type"] in ("text", "reasoning")
                and str(block["text"]).strip(WHITESPACE)]
        if not kept:
            return None
        assert frame.header is not None
        config = frame.header["config"]
        assert isinstance(config, FrozenDict)
        seq = len(self.log)
        source = freeze_source({"kind": "model", "provider": config["provider"],
                                "model": config["model"]}, "message.source")
        message = Message(id=minted_id(self._mint, "assistant", seq), role="assistant",
                          content=FrozenList(kept), source=source)
        data: dict[str, Frozen] = {"turn": frame.turn, "step": frame.step,
                                   "message": frozen_message(message), "interrupted": True}
        if frame.usage is not None:
            data["usage"] = frame.usage
        frame.folded = []
        return self._commit(ev.ASSISTANT_MESSAGE, data, surface=True, sources=frame.chunk_seqs)

    def _step_request_failed(self, frame: StepFrame, outcome: _StepOutcome) -> Action:
        frame.result = outcome
        return DONE

    def _step_streamed(self, frame: StepFrame, _sent: object) -> Action:
        finish = frame.finish
        assert finish is not None and frame.header is not None
        finish_kind = finish["kind"]
        if finish_kind in ("error", "aborted"):                   # R9.7 request failure
            raw_failure = finish.get("failure")
            facts = (LlmFailure.from_json(raw_failure) if raw_failure is not None
                     else DEFAULT_ABORT_FAILURE)
            frame.phase = Step._step_request_failed
            return self._request_failed(
                ErrorInfo(facts.message, "ModelRequestError", facts.code, failure=facts), facts,
                frame.prepared)
        max_tokens = frame.max_tokens = finish_kind == "max-tokens"
        blocks = _folded_blocks(frame.folded)
        if max_tokens:                                            # R14.1
            blocks = [b for b in blocks if b.get("type") != "tool-call"]
        config = frame.header["config"]
        assert isinstance(config, FrozenDict)
        provider, model_name = config["provider"], config["model"]
        seq = len(self.log)
        source: dict[str, Frozen] = {"kind": "model", "provider": provider, "model": model_name}
        if "replayState" in finish:                               # P12
            source["replayState"] = finish["replayState"]
        message = Message(id=minted_id(self._mint, "assistant", seq), role="assistant",
                          content=FrozenList(blocks), source=freeze_source(source, "message.source"))
        data: dict[str, Frozen] = {"turn": frame.turn, "step": frame.step,
                                   "message": frozen_message(message)}
        if frame.usage is not None:
            data["usage"] = frame.usage
        durable = self._commit(ev.ASSISTANT_MESSAGE, data, surface=True,
                               sources=frame.chunk_seqs)           # R9.8
        frame.folded = []
        frame.calls = [b for b in message.content if isinstance(b, FrozenDict)
                       and b.get("type") == "tool-call"]
        frame.phase = Step._step_tools
        return durable

    def _step_tools(self, frame: StepFrame, _sent: object) -> Action:
        calls = frame.calls
        if calls:                                                 # R9.9
            self.lifecycle.fire("run_tools")
            frame.phase = Step._step_tools_done
            return self._tool_batch(calls)
        return Step._step_tools_done(self, frame, False)

    def _step_tools_done(self, frame: StepFrame, concluded: bool) -> Action:
        frame.concluded = concluded
        self.lifecycle.fire("end_step")
        return self._drain(frame, Step._step_drained)             # R9.10

    def _step_drained(self, frame: StepFrame, took_steering: bool) -> Action:
        frame.took_steering = took_steering
        frame.phase = Step._step_ended
        return self._commit(ev.STEP_END, {"turn": frame.turn, "step": frame.step})

    def _step_ended(self, frame: StepFrame, _sent: object) -> Action:
        frame.result = _StepOutcome(had_calls=bool(frame.calls), took_steering=frame.took_steering,
                                    concluded=frame.concluded, max_tokens=frame.max_tokens)
        return DONE

    def _validate_header(self, value: JsonLike) -> FrozenDict:
        """R9.6: the request's resolution {config, system?, tools?, retryPolicy?}: the header
        and the retry policy of the prepared request; config names provider and model."""
        try:
            header = freeze(value, "header")
        except ValidationError as problem:
            raise _Failure(ErrorInfo(str(problem), "RequestConfigError", "INVALID_REQUEST_CONFIG")) from None
        problem_text: str | None = None
        if not isinstance(header, FrozenDict) or not isinstance(header.get("config"), FrozenDict):
            problem_text = "the request header must be a mapping {config, system?, tools?}"
        elif set(header) - _RESOLUTION_FIELDS:
            problem_text = f"unexpected header field(s) {sorted(set(header) - _RESOLUTION_FIELDS)}"
        else:
            config = header["config"]
            assert isinstance(config, FrozenDict)
            if any(_unset(config.get(key)) for key in ("provider", "model")):
                # R9.6 step 3, as the original reports it: an uncoded error (R15.3).
                raise _Failure(ErrorInfo(NO_ROUTE_MESSAGE, "Error"))
            for key in ("provider", "model"):
                if not isinstance(config.get(key), str):
                    problem_text = f"the request config's {key} must be a string"
                    break
        if problem_text is not None:
            raise _Failure(ErrorInfo(problem_text, "RequestConfigError", "INVALID_REQUEST_CONFIG"))
        assert isinstance(header, FrozenDict)
        return header

    def _request_failed(self, error: ErrorInfo, facts: LlmFailure,
                        prepared: FrozenDict | None) -> RequestFailedFrame:
        """R13.2: step/end, recovery, classification."""
        return RequestFailedFrame(phase=Step._request_failed_begin, error=error, facts=facts,
                                  prepared=prepared)

    def _request_failed_begin(self, frame: RequestFailedFrame, _sent: object) -> Action:
        self.lifecycle.fire("request_failed")
        frame.phase = Step._request_failed_recover
        return self._commit(ev.STEP_END, {"turn": self._turn, "step": self._step})

    def _request_failed_recover(self, frame: RequestFailedFrame, _sent: object) -> Action:
        ctrl = self._ctrl
        assert ctrl is not None
        frame.failure_json = frozen_json(frame.facts)
        if not ctrl.aborted:
            payload: dict[str, Frozen] = {
                "turn": self._turn, "step": self._step, "signal": ctrl.signal,
                "error": frozen_json(frame.error), "failure": frame.failure_json,
                "priorFailures": FrozenList(self._prior_failures)}
            if frame.prepared is not None:                        # R13.2: the request's policy
                payload.update(frame.prepared)
            recovery = self._new_effect(REQUEST_ERROR, FrozenDict._adopt(payload))
            frame.effect = recovery.id
            frame.phase = Step._request_failed_wait
            return recovery
        return Step._request_failed_classify(self, frame, None)

    def _request_failed_wait(self, frame: RequestFailedFrame, _sent: object) -> Action:
        frame.phase = Step._request_failed_answered
        return _Wait(frozenset((frame.effect,)))

    def _request_failed_answered(self, frame: RequestFailedFrame, mail: _Mail) -> Action:
        _, kind, value = mail
        if kind == "raise":
            assert isinstance(value, ErrorInfo)
            frame.phase = Step._request_failed_classify
            return self._warn(f"request recovery failed: {value.rendered()}")
        ctrl = self._ctrl
        assert ctrl is not None
        if _is_retry(value) and not ctrl.aborted:
            self._pending_retry = True
        return Step._request_failed_classify(self, frame, None)

    def _request_failed_classify(self, frame: RequestFailedFrame, _sent: object) -> Action:
        assert frame.failure_json is not None
        self._prior_failures = [*self._prior_failures, frame.failure_json]
        frame.phase = Step._request_failed_done
        return self._classify(_Failure(frame.error, request_failure=frame.facts))

    def _request_failed_done(self, frame: RequestFailedFrame, _sent: object) -> Action:
        frame.result = _StepOutcome(request_failed=True)
        return DONE
