"""One step (rules R9, R13.2, R14, P12, P13): hooks, the request and its header, the model
stream folded into content blocks, the assistant message, the tool batch, the step's end; and
a failed request's recovery."""
from __future__ import annotations

from typing import TYPE_CHECKING

from machine import decisions
from machine import events as ev
from machine.core.config import _unset
from machine.core.drains import drain
from machine.core.failures import classify
from machine.core.loop import (
    DONE,
    Action,
    Folded,
    RequestFailedFrame,
    StepFrame,
    goto,
    phase,
    wait_for,
)
from machine.core.records import (
    DEFAULT_ABORT_FAILURE,
    NO_ROUTE_MESSAGE,
    Aborted,
    Failure,
    Mail,
    StepOutcome,
    Wait,
    frozen_json,
    frozen_message,
    warning,
)
from machine.core.tools import tool_batch
from machine.errors import ValidationError
from machine.io import MODEL, REQUEST, REQUEST_ERROR, STEP_HOOK, SYSTEM_PROMPT
from machine.jsonvalue import Frozen, FrozenDict, FrozenList, JsonLike, freeze, same_json
from machine.vocabulary import (
    CHUNK_TYPES,
    WHITESPACE,
    ErrorInfo,
    LlmFailure,
    Message,
    block_problem,
    freeze_source,
    validate_chunk,
)

if TYPE_CHECKING:
    from machine.core.state import CoreState

#: R9.6: what the request effect's resolution may hold: the header's fields and the prepared
#: request's retry policy (opaque, handed to recovery by R13.2 as the original does).
_RESOLUTION_FIELDS = frozenset({"config", "system", "tools", "retryPolicy"})


def _is_retry(value: JsonLike) -> bool:
    """R13.2: only exactly {kind:'retry'} authorizes a retry."""
    return (isinstance(value, (dict, FrozenDict)) and len(value) == 1
            and value.get("kind") == "retry")


def _answer(mail: Mail) -> JsonLike:
    """The value a hook's completion resolved with; a raise fails the turn (R15.3)."""
    _, kind, value = mail
    if kind == "raise":
        assert isinstance(value, ErrorInfo)
        raise Failure(value)
    return value


def _chunk_content_problem(chunk: FrozenDict) -> str | None:
    """P12: a streamed chunk's type is one of CHUNK_TYPES (D5), a finish carries no usage
    (usage is its own chunk), and a content-carrying chunk has the fields it needs."""
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


def _fold(content: list[Folded], chunk: FrozenDict, open_kind: str | None) -> str | None:
    """P12: how the core folds model chunks into content blocks.

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


def _folded_blocks(content: list[Folded]) -> list[FrozenDict]:
    """The content blocks `_fold` built, each run of text or reasoning joined into one."""
    return [FrozenDict({"type": item[0], "text": "".join(item[1:])}) if type(item) is list
            else item for item in content]  # type: ignore[misc]


def one_step(core: CoreState) -> StepFrame:
    """R9: one step of the current turn."""
    return StepFrame(phase=step_begin, turn=core.turn, step=core.step, signal=core.signal())


def _hook_payload(frame: StepFrame) -> FrozenDict:
    return FrozenDict._adopt({"turn": frame.turn, "step": frame.step, "signal": frame.signal})


@phase("step", "begin")
def step_begin(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    hook = core.new_effect(STEP_HOOK, _hook_payload(frame))              # R9.1
    frame.effect = hook.id
    frame.phase = step_await_hook
    return hook


@phase("step", "await_hook")
def step_await_hook(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    return wait_for(frame, step_hooked, frame.effect)


@phase("step", "hooked")
def step_hooked(core: CoreState, frame: StepFrame, mail: Mail) -> Action:
    _answer(mail)
    core.check_signal()
    return drain(core, frame, step_assemble)                            # R9.2


@phase("step", "assemble")
def step_assemble(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    core.enter_assembly()
    system = core.new_effect(SYSTEM_PROMPT, _hook_payload(frame))        # R9.3
    frame.effect = system.id
    frame.phase = step_await_system
    return system


@phase("step", "await_system")
def step_await_system(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    return wait_for(frame, step_system, frame.effect)


@phase("step", "system")
def step_system(core: CoreState, frame: StepFrame, mail: Mail) -> Action:
    system = _answer(mail)
    try:
        frame.system = freeze(system, "system")
    except ValidationError as bad_system:
        raise Failure(ErrorInfo(str(bad_system), "InvalidSystemPromptError",
                                "INVALID_SYSTEM_PROMPT")) from None
    core.check_signal()
    core.enter_request()
    frame.history_end = len(core.log)                                   # R9.4
    frame.phase = step_started
    return core.commit(ev.STEP_START, {"turn": frame.turn, "step": frame.step})   # R9.5


@phase("step", "started")
def step_started(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    core.check_signal()
    seed = core.config.request_options if not core.header_logged else (
        core.log.last_header or FrozenDict()).get("config", FrozenDict())
    request = core.new_effect(REQUEST, FrozenDict({
        "turn": frame.turn, "step": frame.step, "signal": frame.signal, "config": seed,
        "system": frame.system}))                                       # R9.6
    frame.effect = request.id
    frame.phase = step_await_request
    return request


@phase("step", "await_request")
def step_await_request(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    return wait_for(frame, step_header, frame.effect)


@phase("step", "header")
def step_header(core: CoreState, frame: StepFrame, mail: Mail) -> Action:
    raw_header = _answer(mail)
    core.check_signal()
    header = frame.header = _validate_header(raw_header)
    if "retryPolicy" in header:                               # R9.6: not part of the header
        frame.prepared = FrozenDict._adopt({"retryPolicy": header["retryPolicy"]})
        header = frame.header = FrozenDict._adopt(
            {key: value for key, value in header.items() if key != "retryPolicy"})
    header_reason = decisions.header_reason(
        core.header_logged, core.log.has_header,
        # Why: same_json compares as canonical JSON text would, without encoding twice.
        core.header_logged and not same_json(header, core.log.last_header))
    core.handled_header()
    if header_reason is not None:
        frame.phase = step_stream
        return core.commit(ev.REQUEST_HEADER, {"header": header, "reason": header_reason})
    return goto(core, frame, step_stream)


@phase("step", "stream")
def step_stream(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    core.enter_stream()                                                 # R9.7
    model = core.new_effect(MODEL, FrozenDict._adopt({
        "turn": frame.turn, "step": frame.step, "signal": frame.signal,
        "header": frame.header, "historyEnd": frame.history_end}),
        core.log.history(frame.history_end))
    frame.model = model.id
    # Why one Wait for the whole stream (what a hook waits with, without one per chunk):
    # the phases below run once per chunk.
    frame.awaiting = Wait(frozenset((model.id,)))
    frame.phase = step_stream_wait
    return model


@phase("step", "stream_wait")
def step_stream_wait(core: CoreState, frame: StepFrame, _sent: object) -> Action:
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
    frame.phase = step_stream_mail
    assert frame.awaiting is not None
    return frame.awaiting


@phase("step", "stream_mail")
def step_stream_mail(core: CoreState, frame: StepFrame, mail: Mail) -> Action:
    _, kind, value = mail
    if kind == "raise":
        assert isinstance(value, ErrorInfo)
        if value.failure is None:                             # not a model failure
            return _stream_stopped(core, frame, Failure(value))
        frame.phase = step_request_failed
        return request_failed(value, value.failure, frame.prepared)
    if kind == "end":
        if frame.finish is None:
            return _stream_stopped(core, frame, Failure(ErrorInfo(
                "model stream ended without a finish chunk", "InvalidChunkError",
                "INVALID_CHUNK")))
        return goto(core, frame, step_streamed)
    if core.aborted:                                          # R9.7.1
        frame.interrupted = True
        release = core.release(frame.model)
        if release is not None:
            frame.phase = step_interrupted
            return release
        return goto(core, frame, step_interrupted)
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
        failure = Failure(ErrorInfo(problem or "invalid chunk", "InvalidChunkError",
                                    "INVALID_CHUNK"))
        release = core.release(frame.model)
        if release is not None:
            frame.failure = failure
            frame.phase = step_interrupted
            return release
        raise failure
    durable = core.commit(ev.ASSISTANT_CHUNK, {"turn": frame.turn, "step": frame.step,
                                               "chunk": chunk})
    frame.chunk_seqs.append(durable.event.seq)
    frame.chunk = chunk
    frame.phase = step_stream_wait
    return durable


def _stream_stopped(core: CoreState, frame: StepFrame, failure: Failure) -> Action:
    """The stream ended in a generic failure (R9.7); with the signal aborted, that is the
    cancel stopping it, and what it delivered is kept first (D15)."""
    if not core.aborted:
        raise failure
    frame.failure, frame.interrupted = failure, True
    return goto(core, frame, step_interrupted)


@phase("step", "interrupted")
def step_interrupted(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    """The stream was released (P5) or stopped: the step fails, aborted or with its
    failure, once a stream the abort stopped has its interrupted message (D15)."""
    if frame.interrupted:
        frame.interrupted = False
        durable = _interrupted_message(core, frame)
        if durable is not None:
            return durable
    if frame.failure is not None:
        raise frame.failure
    raise Aborted()


def _interrupted_message(core: CoreState, frame: StepFrame) -> Action | None:
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
    seq = len(core.log)
    source = freeze_source({"kind": "model", "provider": config["provider"],
                            "model": config["model"]}, "message.source")
    message = Message(id=core.mint_id("assistant", seq), role="assistant",
                      content=FrozenList(kept), source=source)
    data: dict[str, Frozen] = {"turn": frame.turn, "step": frame.step,
                               "message": frozen_message(message), "interrupted": True}
    if frame.usage is not None:
        data["usage"] = frame.usage
    frame.folded = []
    return core.commit(ev.ASSISTANT_MESSAGE, data, surface=True, sources=frame.chunk_seqs)


@phase("step", "request_failed")
def step_request_failed(core: CoreState, frame: StepFrame, outcome: StepOutcome) -> Action:
    frame.result = outcome
    return DONE


@phase("step", "streamed")
def step_streamed(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    finish = frame.finish
    assert finish is not None and frame.header is not None
    finish_kind = finish["kind"]
    if finish_kind in ("error", "aborted"):                   # R9.7 request failure
        raw_failure = finish.get("failure")
        facts = (LlmFailure.from_json(raw_failure) if raw_failure is not None
                 else DEFAULT_ABORT_FAILURE)
        frame.phase = step_request_failed
        return request_failed(
            ErrorInfo(facts.message, "ModelRequestError", facts.code, failure=facts), facts,
            frame.prepared)
    max_tokens = frame.max_tokens = finish_kind == "max-tokens"
    blocks = _folded_blocks(frame.folded)
    if max_tokens:                                            # R14.1
        blocks = [b for b in blocks if b.get("type") != "tool-call"]
    config = frame.header["config"]
    assert isinstance(config, FrozenDict)
    provider, model_name = config["provider"], config["model"]
    seq = len(core.log)
    source: dict[str, Frozen] = {"kind": "model", "provider": provider, "model": model_name}
    if "replayState" in finish:                               # P12
        source["replayState"] = finish["replayState"]
    message = Message(id=core.mint_id("assistant", seq), role="assistant",
                      content=FrozenList(blocks), source=freeze_source(source, "message.source"))
    data: dict[str, Frozen] = {"turn": frame.turn, "step": frame.step,
                               "message": frozen_message(message)}
    if frame.usage is not None:
        data["usage"] = frame.usage
    durable = core.commit(ev.ASSISTANT_MESSAGE, data, surface=True,
                          sources=frame.chunk_seqs)           # R9.8
    frame.folded = []
    frame.calls = [b for b in message.content if isinstance(b, FrozenDict)
                   and b.get("type") == "tool-call"]
    frame.phase = step_tools
    return durable


@phase("step", "tools")
def step_tools(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    calls = frame.calls
    if calls:                                                 # R9.9
        core.enter_tools()
        frame.phase = step_tools_done
        return tool_batch(calls)
    return goto(core, frame, step_tools_done, False)


@phase("step", "tools_done")
def step_tools_done(core: CoreState, frame: StepFrame, concluded: bool) -> Action:
    frame.concluded = concluded
    core.end_step()
    return drain(core, frame, step_drained)                   # R9.10


@phase("step", "drained")
def step_drained(core: CoreState, frame: StepFrame, took_steering: bool) -> Action:
    frame.took_steering = took_steering
    frame.phase = step_ended
    return core.commit(ev.STEP_END, {"turn": frame.turn, "step": frame.step})


@phase("step", "ended")
def step_ended(core: CoreState, frame: StepFrame, _sent: object) -> Action:
    frame.result = StepOutcome(had_calls=bool(frame.calls), took_steering=frame.took_steering,
                               concluded=frame.concluded, max_tokens=frame.max_tokens)
    return DONE


def _validate_header(value: JsonLike) -> FrozenDict:
    """R9.6: the request's resolution {config, system?, tools?, retryPolicy?}: the header
    and the retry policy of the prepared request; config names provider and model."""
    try:
        header = freeze(value, "header")
    except ValidationError as problem:
        raise Failure(ErrorInfo(str(problem), "RequestConfigError",
                                "INVALID_REQUEST_CONFIG")) from None
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
            raise Failure(ErrorInfo(NO_ROUTE_MESSAGE, "Error"))
        for key in ("provider", "model"):
            if not isinstance(config.get(key), str):
                problem_text = f"the request config's {key} must be a string"
                break
    if problem_text is not None:
        raise Failure(ErrorInfo(problem_text, "RequestConfigError", "INVALID_REQUEST_CONFIG"))
    assert isinstance(header, FrozenDict)
    return header


# -- a failed model request (R13.2) -----------------------------------------------------


def request_failed(error: ErrorInfo, facts: LlmFailure,
                   prepared: FrozenDict | None) -> RequestFailedFrame:
    """R13.2: step/end, recovery, classification."""
    return RequestFailedFrame(phase=request_failed_begin, error=error, facts=facts,
                              prepared=prepared)


@phase("request-failed", "begin")
def request_failed_begin(core: CoreState, frame: RequestFailedFrame, _sent: object) -> Action:
    core.enter_recovery()
    frame.phase = request_failed_recover
    return core.commit(ev.STEP_END, {"turn": core.turn, "step": core.step})


@phase("request-failed", "recover")
def request_failed_recover(core: CoreState, frame: RequestFailedFrame,
                           _sent: object) -> Action:
    ctrl = core.controller
    assert ctrl is not None
    frame.failure_json = frozen_json(frame.facts)
    if not ctrl.aborted:
        payload: dict[str, Frozen] = {
            "turn": core.turn, "step": core.step, "signal": ctrl.signal,
            "error": frozen_json(frame.error), "failure": frame.failure_json,
            "priorFailures": FrozenList(core.prior_failures)}
        if frame.prepared is not None:                        # R13.2: the request's policy
            payload.update(frame.prepared)
        recovery = core.new_effect(REQUEST_ERROR, FrozenDict._adopt(payload))
        frame.effect = recovery.id
        frame.phase = request_failed_wait
        return recovery
    return goto(core, frame, request_failed_classify)


@phase("request-failed", "await_recovery")
def request_failed_wait(core: CoreState, frame: RequestFailedFrame, _sent: object) -> Action:
    return wait_for(frame, request_failed_answered, frame.effect)


@phase("request-failed", "answered")
def request_failed_answered(core: CoreState, frame: RequestFailedFrame, mail: Mail) -> Action:
    _, kind, value = mail
    if kind == "raise":
        assert isinstance(value, ErrorInfo)
        frame.phase = request_failed_classify
        return warning(f"request recovery failed: {value.rendered()}")
    if _is_retry(value) and not core.aborted:
        core.authorize_retry()
    return goto(core, frame, request_failed_classify)


@phase("request-failed", "classify")
def request_failed_classify(core: CoreState, frame: RequestFailedFrame,
                            _sent: object) -> Action:
    assert frame.failure_json is not None
    core.record_request_failure(frame.failure_json)
    frame.phase = request_failed_done
    return classify(Failure(frame.error, request_failure=frame.facts))


@phase("request-failed", "done")
def request_failed_done(core: CoreState, frame: RequestFailedFrame, _sent: object) -> Action:
    frame.result = StepOutcome(request_failed=True)
    return DONE
