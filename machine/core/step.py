"""One step (rules R9, R13.2, R14, P12, P13): hooks, the request and its header, the model
stream folded into content blocks, the assistant message, the tool batch, the step's end."""
from __future__ import annotations

from collections.abc import Generator
from typing import Any, TypeAlias

from machine import decisions
from machine import events as ev
from machine.core.config import _unset
from machine.core.records import (
    DEFAULT_ABORT_FAILURE,
    NO_ROUTE_MESSAGE,
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
    Output,
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
    ErrorInfo,
    LlmFailure,
    Message,
    block_problem,
    minted_id,
    validate_chunk,
)


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


class Step(ToolBatch):
    """One step of a turn (R9)."""

    def _hook(self, kind: EffectKind, payload: FrozenDict) -> Generator[Output | _Wait, _Mail | None, Any]:
        """Request an effect, wait, and raise its failure as a generic failure."""
        effect = self._new_effect(kind, payload)
        yield effect
        _, mail_kind, value = yield from self._await(effect.id)
        if mail_kind == "raise":
            assert isinstance(value, ErrorInfo)
            raise _Failure(value)
        return value

    def _one_step(self) -> Generator[Output | _Wait, _Mail | None, _StepOutcome]:
        """R9: one step."""
        turn, step, signal = self._turn, self._step, self._signal()
        yield from self._hook(STEP_HOOK, FrozenDict({"turn": turn, "step": step,
                                                     "signal": signal}))   # R9.1
        self._check_signal()
        yield from self._drain()                                  # R9.2
        self.lifecycle.fire("assemble")
        system = yield from self._hook(SYSTEM_PROMPT, FrozenDict({
            "turn": turn, "step": step, "signal": signal}))        # R9.3
        try:
            frozen_system = freeze(system, "system")
        except ValidationError as bad_system:
            raise _Failure(ErrorInfo(str(bad_system), "InvalidSystemPromptError", "INVALID_SYSTEM_PROMPT"),
                           code="INVALID_SYSTEM_PROMPT") from None
        self._check_signal()
        self.lifecycle.fire("request")
        history_end = len(self.log)                               # R9.4
        yield self._commit(ev.STEP_START, {"turn": turn, "step": step})   # R9.5
        self._check_signal()
        seed = self.config.request_options if not self._header_logged else (
            self.log.last_header or FrozenDict()).get("config", FrozenDict())
        raw_header = yield from self._hook(REQUEST, FrozenDict({
            "turn": turn, "step": step, "signal": signal, "config": seed,
            "system": frozen_system}))                             # R9.6
        self._check_signal()
        header = self._validate_header(raw_header)
        header_reason = decisions.header_reason(
            self._header_logged, self.log.has_header,
            # Why: same_json compares as canonical JSON text would, without encoding twice.
            self._header_logged and not same_json(header, self.log.last_header))
        self._header_logged = True
        if header_reason is not None:
            yield self._commit(ev.REQUEST_HEADER, {"header": header, "reason": header_reason})
        self.lifecycle.fire("stream")                             # R9.7
        config = header["config"]
        assert isinstance(config, FrozenDict)
        model = self._new_effect(MODEL, FrozenDict({
            "turn": turn, "step": step, "signal": signal, "header": header,
            "historyEnd": history_end}), self.log.history(history_end))
        yield model
        folded: list[_Folded] = []
        open_kind: str | None = None      # P12: the run of text or reasoning chunks being folded
        chunk_seqs: list[int] = []
        finish: FrozenDict | None = None
        usage: Frozen = None              # R9.8: the last usage chunk's figures
        # Why one _Wait for the whole stream (what `_await` yields, without a generator per
        # chunk): the loop below runs once per chunk.
        awaiting = _Wait(frozenset((model.id,)))
        while True:
            mail = yield awaiting
            assert mail is not None
            _, kind, value = mail
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                if value.failure is None:                         # not a model failure
                    raise _Failure(value)
                return (yield from self._request_failed(value, value.failure))
            if kind == "end":
                if finish is None:
                    raise _Failure(ErrorInfo("model stream ended without a finish chunk",
                                             "InvalidChunkError", "INVALID_CHUNK"))
                break
            if self._ctrl is not None and self._ctrl.aborted:    # R9.7.1
                release = self._release(model.id)
                if release is not None:
                    yield release
                raise _Aborted()
            problem: str | None = None
            chunk: FrozenDict | None = None
            if finish is not None:
                problem = "a chunk arrived after the finish chunk"
            else:
                try:
                    chunk = validate_chunk(value)
                    problem = _chunk_content_problem(chunk)
                except ValidationError as error:
                    problem = f"invalid chunk: {error}"
            if problem is not None or chunk is None:              # R9.7 / D5
                release = self._release(model.id)
                if release is not None:
                    yield release
                raise _Failure(ErrorInfo(problem or "invalid chunk", "InvalidChunkError",
                                         "INVALID_CHUNK"))
            durable = self._commit(ev.ASSISTANT_CHUNK, {"turn": turn, "step": step, "chunk": chunk})
            chunk_seqs.append(durable.event.seq)
            yield durable
            chunk_type = chunk["type"]
            if chunk_type == "finish":
                finish = chunk
            elif chunk_type == "usage":
                usage = chunk["usage"]
            else:
                open_kind = _fold(folded, chunk, open_kind)
        finish_kind = finish["kind"]
        if finish_kind in ("error", "aborted"):                   # R9.7 request failure
            raw_failure = finish.get("failure")
            facts = (LlmFailure.from_json(raw_failure) if raw_failure is not None
                     else DEFAULT_ABORT_FAILURE)
            return (yield from self._request_failed(
                ErrorInfo(facts.message, "ModelRequestError", facts.code, failure=facts), facts))
        max_tokens = finish_kind == "max-tokens"
        blocks = _folded_blocks(folded)
        if max_tokens:                                            # R14.1
            blocks = [b for b in blocks if b.get("type") != "tool-call"]
        provider, model_name = config["provider"], config["model"]
        seq = len(self.log)
        source: dict[str, Frozen] = {"kind": "model", "provider": provider, "model": model_name}
        if "replayState" in finish:                               # P12
            source["replayState"] = finish["replayState"]
        message = Message(id=minted_id(self._mint, "assistant", seq), role="assistant",
                          content=FrozenList(blocks), source=FrozenDict(source))
        data: dict[str, Frozen] = {"turn": turn, "step": step, "message": frozen_message(message)}
        if usage is not None:
            data["usage"] = usage
        yield self._commit(ev.ASSISTANT_MESSAGE, data, surface=True, sources=chunk_seqs)  # R9.8
        calls = [b for b in message.content if isinstance(b, FrozenDict)
                 and b.get("type") == "tool-call"]
        concluded = False
        if calls:                                                 # R9.9
            self.lifecycle.fire("run_tools")
            concluded = yield from self._tool_batch(calls)
        self.lifecycle.fire("end_step")
        took_steering = yield from self._drain()                  # R9.10
        yield self._commit(ev.STEP_END, {"turn": turn, "step": step})
        return _StepOutcome(had_calls=bool(calls), took_steering=took_steering,
                            concluded=concluded, max_tokens=max_tokens)

    def _validate_header(self, value: JsonLike) -> FrozenDict:
        """R9.6: the prepared header {config, system?, tools?}; config names provider and model."""
        try:
            header = freeze(value, "header")
        except ValidationError as problem:
            raise _Failure(ErrorInfo(str(problem), "RequestConfigError", "INVALID_REQUEST_CONFIG"),
                           code="INVALID_REQUEST_CONFIG") from None
        problem_text: str | None = None
        if not isinstance(header, FrozenDict) or not isinstance(header.get("config"), FrozenDict):
            problem_text = "the request header must be a mapping {config, system?, tools?}"
        elif set(header) - {"config", "system", "tools"}:
            problem_text = f"unexpected header field(s) {sorted(set(header) - {'config', 'system', 'tools'})}"
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
            raise _Failure(ErrorInfo(problem_text, "RequestConfigError", "INVALID_REQUEST_CONFIG"),
                           code="INVALID_REQUEST_CONFIG")
        assert isinstance(header, FrozenDict)
        return header

    def _request_failed(self, error: ErrorInfo,
                        facts: LlmFailure) -> Generator[Output | _Wait, _Mail | None, _StepOutcome]:
        """R13.2: step/end, recovery, classification."""
        self.lifecycle.fire("request_failed")
        yield self._commit(ev.STEP_END, {"turn": self._turn, "step": self._step})
        ctrl = self._ctrl
        assert ctrl is not None
        failure_json = frozen_json(facts)
        if not ctrl.aborted:
            recovery = self._new_effect(REQUEST_ERROR, FrozenDict({
                "turn": self._turn, "step": self._step, "signal": ctrl.signal,
                "error": frozen_json(error), "failure": failure_json,
                "priorFailures": FrozenList(self._prior_failures)}))
            yield recovery
            _, kind, value = yield from self._await(recovery.id)
            if kind == "raise":
                assert isinstance(value, ErrorInfo)
                yield self._warn(f"request recovery failed: {value.rendered()}")
            elif _is_retry(value) and not ctrl.aborted:
                self._pending_retry = True
        self._prior_failures = [*self._prior_failures, failure_json]
        yield from self._classify(_Failure(error, request_failure=facts))
        return _StepOutcome(request_failed=True)
