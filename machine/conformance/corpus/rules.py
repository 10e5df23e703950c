"""Vectors for rules that the scenarios and the matrix leave uncovered or cover only in passing.

Ids ``R-<topic>`` (core rules) and ``P-<topic>`` (protocol rules).
"""

from __future__ import annotations

from typing import Any

from machine.conformance.authoring import (
    Session,
    calls,
    durable,
    error,
    live,
    model_failure,
    reply,
    result,
    scenario,
)
from machine.conformance.corpus.common import FAILURE, live_of, started
from machine.io import Effect, Live
from machine.jsonvalue import JsonLike, thaw
from machine.vocabulary import ErrorInfo

PARALLEL: Any = "parallel"


@scenario("R-invalid-decisions",
          "R7.11: a prompt-submit value that is not a valid decision (an unknown kind; an allow "
          "whose additional context is malformed) rejects the admission with the warning "
          "'prompt admission returned an invalid decision: <problem>'; nothing of it is written",
          ["R7.11", "R7.7", "R7.10", "R4.10", "R0.8", "D5", "V17"],
          ["rule", "differs-from-original", "D5"])
def invalid_decisions() -> Session:
    s = Session("ok")
    decisions = iter([{"kind": "maybe"},
                      {"kind": "allow", "additionalContexts": [
                          {"id": "x", "role": "user", "content": [], "source": {}}]},
                      {"kind": "allow"}])
    s.handle("prompt-submit", lambda e: ("resolve", next(decisions)))
    s.followup("first")
    s.followup("second")
    s.followup("third")
    s.run()
    s.expect_log("TS(1,msg:user) UM('third') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    warnings = live_of(s, "warn(")
    assert len(warnings) == 2 and all(
        w.startswith("warn('prompt admission returned an invalid decision: ") for w in warnings)
    assert not live_of(s, "error")
    return s


@scenario("R-tool-arguments-planned",
          "R10.1: tool arguments are planned from the model's text: '' becomes {}, JSON text "
          "becomes its value, unparsable text stays a string; tool/call and every stage carry "
          "the planned value",
          ["R10.1", "R10.3", "R10.4", "R9.9"], ["rule", "tools"])
def arguments() -> Session:
    s = Session(calls(("c1", "t", ""), ("c2", "t", '{"path": "a.ts", "n": [1, 2]}'),
                      ("c3", "t", "{not json")), "done")
    s.followup("go")
    s.run()
    planned = [d["arguments"] for d in s.data("tool/call")]
    assert planned == [{}, {"path": "a.ts", "n": [1, 2]}, "{not json"]
    assert [e.payload["arguments"] for e in s.effects("tool-execute")] == planned
    return s


@scenario("R-tool-stage-raises",
          "R10.12: a raising tool stage stands for an error result, as the original's tool runner "
          "makes it: a body (execute) that raises gets 'Error: <message>' with error {name, code} "
          "(coded errors only), and finalize still sees that result; a raising prepare gives the "
          "call its final error result (no execute, no finalize); a raising finalize replaces the "
          "result; the batch goes on and the model sees every result",
          ["R10.12", "R10.3", "R10.4", "R10.5", "R9.10"], ["rule", "tools"])
def tool_stage_raises() -> Session:
    s = Session(calls(("c1", "t"), ("c2", "t"), ("c3", "t"), ("c4", "t")), "next")
    s.handle("tool-finalize", lambda e: ("resolve", result(contexts=[s.msg("ctx-c1", "plugin:p")]))
             if e.payload["callId"] == "c1" else (
                 ("raise", ErrorInfo("post failed", "PostError")) if e.payload["callId"] == "c4"
                 else None))
    s.handle("tool-execute", lambda e: ("raise", ErrorInfo(
        "disk full", "ToolError", "EIO", causes=("write failed",)))
             if e.payload["callId"] == "c2" else None)
    s.handle("tool-prepare", lambda e: ("raise", ErrorInfo("no such tool", "LookupError"))
             if e.payload["callId"] == "c3" else None)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… "
                 "AM(1.1;call c1+call c2+call c3+call c4) TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) "
                 "TR(1.1;c2;ERR EIO) TC(1.1;c3) TR(1.1;c3;ERR) TC(1.1;c4) TR(1.1;c4;ERR) "
                 "UM('ctx-c1';plugin:p) SE(1.1) SS(1.2) CH… AM(1.2;'next') SE(1.2) TE(1,completed)")
    finalized = {e.payload["callId"]: e.payload["result"] for e in s.effects("tool-finalize")}
    assert set(finalized) == {"c1", "c2", "c4"}, finalized
    assert finalized["c2"] == {"content": [{"type": "text", "text": "Error: disk full"}],
                               "isError": True, "error": {"name": "ToolError", "code": "EIO"}}
    results = [d for d in s.data("tool/result")]
    assert "error" not in results[2] and "error" not in results[3], results
    assert results[3]["message"]["content"][0]["content"] == [
        {"type": "text", "text": "Error: post failed"}]
    return s


@scenario("R-batch-failure-invalid-result",
          "R10.9, R15.4: an invalid tool result (content not a list) fails the batch with the "
          "core-built error InvalidToolResultError / INVALID_TOOL_RESULT (its message is "
          "implementation-worded)",
          ["R10.9", "R15.4", "R15.3", "D5", "V16"], ["rule", "tools", "differs-from-original", "D5"])
def batch_failure_invalid() -> Session:
    s = Session(calls(("c1", "t")))
    s.handle("tool-execute", lambda e: ("resolve", {"content": "not a list"}))
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "SE(1.1) TE(1,error)")
    reason = s.reasons()[0]
    assert reason["code"] == "INVALID_TOOL_RESULT" and reason["step"] == 1
    errors = [o.to_json() for o in s.outputs if o.to_json().get("type") == "agent/error"]
    assert errors[0]["error"]["name"] == "InvalidToolResultError"
    return s


@scenario("R-retry-chain",
          "R13.2–R13.4, R12.5–R12.6: recovery authorizes retries; each retry turn starts after "
          "the failed turn's flush with trigger retry and no settlement in between; "
          "priorFailures grows along the chain; a completed step and a new admitted turn reset it",
          ["R13.2", "R13.3", "R13.4", "R12.5", "R12.6", "R4.9", "R15.2", "V21"], ["rule"])
def retry_chain() -> Session:
    second = model_failure("still unavailable", "UNAVAILABLE", status=503)
    s = Session(FAILURE, second, "finally", model_failure("again", "UNAVAILABLE"))
    s.handle("request-error", lambda e: ("resolve", {"kind": "retry"}), times=2)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error) TS(2,retry) "
                 "SS(2.1) SE(2.1) TE(2,error) TS(3,retry) SS(3.1) CH… AM(3.1;'finally') SE(3.1) "
                 "TE(3,completed)")
    assert live_of(s, "settled") == ["settled(3,completed)"]
    prior = [len(thaw(e.payload)["priorFailures"]) for e in s.effects("request-error")]
    assert prior == [0, 1], prior
    s.followup("next")
    s.run()
    assert [len(thaw(e.payload)["priorFailures"]) for e in s.effects("request-error")] == [0, 1, 0]
    return s


@scenario("R-request-error-retry-policy",
          "R9.6, R13.2: the request's preparation may name its retry policy beside the header "
          "(any JSON value, never logged); recovery gets the policy of the request that failed, "
          "and none after a request whose preparation named none",
          ["R9.6", "R13.2", "R13.3", "P4"], ["rule"])
def request_error_retry_policy() -> Session:
    s = Session(model_failure("rate limited", "RATE_LIMIT", status=429),
                model_failure("still limited", "RATE_LIMIT", status=429))
    policy = {"mode": "normal", "maxRetries": 2, "retryableCodes": ["RATE_LIMIT"],
              "initialDelayMs": 500, "maxDelayMs": 10000, "jitterRatio": 0.1}
    prepared = {"n": 0}

    def prepare(effect: Effect) -> tuple[str, JsonLike]:
        prepared["n"] += 1
        config = thaw(effect.payload)["config"] or {"provider": "p", "model": "m"}
        return ("resolve", {"config": config, "retryPolicy": policy} if prepared["n"] == 1
                else {"config": config})
    s.handle("request", prepare)
    s.handle("request-error", lambda e: ("resolve", {"kind": "retry"}), times=1)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,error) TS(2,retry) "
                 "SS(2.1) SE(2.1) TE(2,error)")
    assert [thaw(e.payload).get("retryPolicy") for e in s.effects("request-error")] == [policy, None]
    assert "retryPolicy" not in thaw(s.effects("request-error")[1].payload)
    assert "retryPolicy" not in thaw(s.of("request/header")[0].data)["header"]
    return s


@scenario("R-interrupted-keeps-what-was-streamed",
          "D15, R9.7: a cancel while the model streams keeps what the user watched stream: the "
          "text and reasoning that are not blank, in stream order (a tool call and a blank text "
          "left out), become the step's assistant message marked interrupted, with the usage "
          "so far and every chunk as its sources, after the release and before step/end; the "
          "next turn's request carries it",
          ["D15", "R9.7", "R9.8", "R8.6", "R15.1", "L6", "L13", "P5"],
          ["rule", "cancel", "differs-from-original", "D15"])
def interrupted_keeps_what_was_streamed() -> Session:
    s = started("ok", hold="model")
    s.stream([{"type": "reasoning", "text": "the user wants "}, {"type": "reasoning", "text": "a poem"},
              {"type": "text", "text": "Roses are "}, {"type": "text", "text": "red,"},
              {"type": "tool-call", "id": "c1", "name": "rhyme", "arguments": "{}"},
              {"type": "text", "text": " \n\t"}, {"type": "usage", "usage": {"outputTokens": 9}}],
             end=False)
    s.pump()
    s.cancel()
    s.run()
    s.stream([{"type": "finish", "kind": "aborted"}])       # the adapter honours the abort
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH CH CH CH CH CH CH "
                 "AM(1.1;reasoning+'Roses are red,';interrupted) SE(1.1) TE(1,aborted)")
    (kept,) = s.data("assistant/message")
    assert kept["interrupted"] is True and kept["usage"] == {"outputTokens": 9}
    assert kept["message"]["content"] == [{"type": "reasoning", "text": "the user wants a poem"},
                                          {"type": "text", "text": "Roses are red,"}]
    (event,) = s.of("assistant/message")
    assert event.source_event_seqs == tuple(e.seq for e in s.of("assistant/chunk"))
    s.followup("go on")
    s.run()
    request = s.effects("model")[-1]
    assert [m.role for m in request.history or ()] == ["user", "assistant", "user"]
    return s


@scenario("R-interrupted-nothing-to-keep",
          "R9.7, R13.1 (D15 keeps nothing here): a cancel that stops a stream which delivered "
          "only a tool call and blank text appends no assistant message; a provider failure "
          "reported after a cancel is a request failure and keeps nothing of its stream",
          ["R9.7", "R13.1", "R13.2", "R15.1", "P5"], ["rule", "cancel"])
def interrupted_nothing_to_keep() -> Session:
    s = started("ok", hold="model")
    s.stream([{"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"},
              {"type": "text", "text": "\u3000 "}], end=False)
    s.pump()
    s.cancel()
    s.run()
    s.fail_model(error("the signal was aborted", "AbortError"))
    s.run()
    s.hold("model")
    s.followup("again")
    s.run()
    s.stream([{"type": "text", "text": "half a"}], end=False)
    s.pump()
    s.cancel()
    s.run()
    s.fail_model(model_failure("connection reset", "NETWORK_ERROR"))
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH CH SE(1.1) TE(1,aborted) "
                 "TS(2,msg:user) UM('again') SS(2.1) CH SE(2.1) TE(2,aborted)")
    assert not s.effects("request-error")
    return s


@scenario("R-invalid-chunks",
          "R9.7, R15.4: a text chunk without text releases the stream and fails the step with "
          "INVALID_CHUNK without being appended; a stream ending without a finish chunk fails "
          "the same way; neither is a request failure",
          ["R9.7", "R15.4", "R13.1", "R15.3", "P5", "P12", "D5", "V18"],
          ["rule", "differs-from-original", "D5"])
def invalid_chunks() -> Session:
    s = started([{"type": "text", "text": "no finish"}], hold="model", prompt="first")
    s.stream([{"type": "text", "text": "fine"}], end=False)
    s.pump()
    s.stream([{"type": "text"}], end=False)
    s.run()
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH SE(1.1) TE(1,error) "
                 "TS(2,msg:user) UM('second') SS(2.1) CH SE(2.1) TE(2,error)")
    assert [r["code"] for r in s.reasons()] == ["INVALID_CHUNK", "INVALID_CHUNK"]
    assert "release" in s.trace() and not s.effects("request-error") and not s.driver.held
    return s


@scenario("R-chunk-after-finish",
          "R9.7: a chunk after the finish chunk is invalid: the stream is released, the step "
          "fails with INVALID_CHUNK and no assistant message is written (D5)",
          ["R9.7", "R15.4", "P5", "D5"], ["rule", "differs-from-original", "D5"])
def chunk_after_finish() -> Session:
    s = started(hold="model")
    s.stream([{"type": "text", "text": "done"}, {"type": "finish", "kind": "stop"},
              {"type": "text", "text": "extra"}], end=False)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… SE(1.1) TE(1,error)")
    assert s.reasons()[0]["code"] == "INVALID_CHUNK"
    assert "release" in s.trace() and not s.driver.held
    return s


@scenario("R-unknown-chunk-type",
          "R9.7, P12: a chunk of a type the stream may not carry ({type:'ping'}) is an invalid "
          "chunk: the stream is released and the step fails with INVALID_CHUNK without appending "
          "it (D5)",
          ["R9.7", "P12", "V18", "R15.4", "D5"], ["rule", "differs-from-original", "D5"])
def unknown_chunk_type() -> Session:
    s = started(hold="model")
    s.stream([{"type": "text", "text": "so far"}, {"type": "ping"}], end=False)
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH SE(1.1) TE(1,error)")
    assert s.reasons()[0]["code"] == "INVALID_CHUNK"
    assert "release" in s.trace() and not s.driver.held
    return s


@scenario("P-invalid-request-header",
          "P13, R9.6: a request config that lacks a model fails request preparation with an "
          "uncoded error named Error (as in the original; its text is implementation-worded), "
          "a generic failure, not a request failure; no header is logged and no model call is "
          "made",
          ["P13", "R9.6", "R15.3", "R13.1"], ["rule"])
def invalid_header() -> Session:
    s = Session()
    s.handle("request", lambda e: ("resolve", {"config": {"provider": "p"}}))
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) SE(1.1) TE(1,error)")
    reason = s.reasons()[0]
    assert "code" not in reason and reason["kind"] == "error" and reason["step"] == 1, reason
    errors = [o.to_json() for o in s.outputs if o.to_json().get("type") == "agent/error"]
    assert errors[0]["error"]["name"] == "Error" and "code" not in errors[0]["error"]
    assert not s.effects("model") and not s.effects("request-error")
    return s


@scenario("R-request-header-change",
          "R9.6: the first header of an instance is logged 'initial'; later requests are seeded "
          "with the last logged config; a header equal to the last one is not logged again, a "
          "different one is logged with reason 'change'",
          ["R9.6", "R4.8", "R20.3", "P4"], ["rule"])
def header_change() -> Session:
    s = Session("one", "two", "three", request_options={"provider": "p", "model": "m1"})
    headers = iter([{"config": {"provider": "p", "model": "m1"}},
                    {"config": {"provider": "p", "model": "m1"}},
                    {"config": {"provider": "p", "model": "m2"}}])
    s.handle("request", lambda e: ("resolve", next(headers)))
    s.followup("a")
    s.followup("b")
    s.followup("c")
    s.run()
    assert [t for t in s.log() if t.startswith("RH")] == ["RH(initial)", "RH(change)"]
    seeds = [e.payload["config"] for e in s.effects("request")]
    assert seeds == [{"provider": "p", "model": "m1"}] * 3
    am = s.data("assistant/message")
    assert am[2]["message"]["source"] == {"kind": "model", "provider": "p", "model": "m2"}
    return s


@scenario("R-request-header-system",
          "R9.6, P4: the request resolution may set the header's system prompt and tools (a seam "
          "the original lacks: its header takes them from the system-prompt assembly; capability "
          "request-header); a header that differs only there is logged with reason 'change'",
          ["R9.6", "P4", "P13"], ["rule", "extension", "extension:request-header"])
def header_system() -> Session:
    s = Session("one", "two", request_options={"provider": "p", "model": "m1"})
    headers = iter([{"config": {"provider": "p", "model": "m1"}},
                    {"config": {"provider": "p", "model": "m1"}, "system": "be brief",
                     "tools": [{"name": "t"}]}])
    s.handle("request", lambda e: ("resolve", next(headers)))
    s.followup("a")
    s.followup("b")
    s.run()
    assert [t for t in s.log() if t.startswith("RH")] == ["RH(initial)", "RH(change)"]
    models = s.effects("model")
    assert thaw(models[1].payload)["header"]["system"] == "be brief"
    return s


@scenario("R-parallel-pool-limit",
          "R10.2, R10.4: a pool of parallel calls keeps at most maxParallelToolCalls in flight; "
          "a settlement with nothing committable yet starts the next call; results are committed "
          "in model order even when a later call settles first",
          ["R10.2", "R10.4", "R10.3", "P6", "P11"], ["rule", "tools"])
def parallel_pool() -> Session:
    s = Session(calls(("c1", "p"), ("c2", "p"), ("c3", "p")), "done",
                tool_modes={"p": PARALLEL}, max_parallel=2)
    s.hold("tool-execute", times=3)
    s.followup("go")
    s.run()
    assert [e.payload["callId"] for e in s.effects("tool-execute")] == ["c1", "c2"]
    execute = {e.payload["callId"]: e for e in s.effects("tool-execute")}
    s.driver.held.remove(execute["c2"])
    s.core.resolve(execute["c2"].id, result("second"))
    s.run()
    assert s.log()[-3:] == ["TC(1.1;c1)", "TC(1.1;c2)", "TC(1.1;c3)"], s.log()
    s.driver.held.remove(execute["c1"])
    s.core.resolve(execute["c1"].id, result("first"))
    s.run()
    s.resolve("tool-execute", result("third"))
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2+call c3) "
                 "TC(1.1;c1) TC(1.1;c2) TC(1.1;c3) TR(1.1;c1;ok) TR(1.1;c2;ok) TR(1.1;c3;ok) "
                 "SE(1.1) SS(1.2) CH… AM(1.2;'done') SE(1.2) TE(1,completed)")
    return s


@scenario("R-prepare-final-result",
          "R10.3, R10.11: a prepare stage that supplies a final result skips execute and "
          "finalize; that result is kept even when the turn was aborted meanwhile (a seam the "
          "original lacks: its pre-execute gate can only allow, deny or ask; capability "
          "prepare-result)",
          ["R10.3", "R10.11", "R10.7"],
          ["rule", "tools", "cancel", "extension", "extension:prepare-result"])
def prepare_final() -> Session:
    s = Session(calls(("c1", "t"), ("c2", "t")))

    def prepare(e: Effect) -> Any:
        if e.payload["callId"] == "c1":
            s.cancel()
            return ("resolve", result("from prepare"))
        return None
    s.handle("tool-prepare", prepare)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                 "TC(1.1;c1) TR(1.1;c1;ok) TC(1.1;c2) TR(1.1;c2;ERR ABD) SE(1.1) TE(1,aborted)")
    assert not s.effects("tool-execute") and not s.effects("tool-finalize")
    return s


@scenario("R-concludes-turn",
          "R10.6, R8.4: a successful result with concludesTurn ends the turn after its step: no "
          "turn-stopping, no second request; steering accepted during the batch is still written "
          "by the end-of-step drain; an error result's concludesTurn does not count",
          ["R10.6", "R8.4", "R9.10"], ["rule", "tools"])
def concludes() -> Session:
    s = Session(calls(("c1", "t"), ("c2", "t")), calls(("c3", "t")))

    def execute(e: Effect) -> Any:
        call_id = e.payload["callId"]
        if call_id == "c1":
            return ("resolve", result("bad", isError=True, concludesTurn=True))
        if call_id == "c2":
            return ("resolve", result("done"))
        s.steer("noted")
        return ("resolve", result("final", concludesTurn=True))
    s.handle("tool-execute", execute)
    s.followup("go")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1+call c2) "
                 "TC(1.1;c1) TR(1.1;c1;ERR) TC(1.1;c2) TR(1.1;c2;ok) SE(1.1) SS(1.2) CH… "
                 "AM(1.2;call c3) TC(1.2;c3) TR(1.2;c3;ok) STM(1;'noted';user) SE(1.2) "
                 "TE(1,completed)")
    assert not s.effects("turn-stopping") and len(s.effects("model")) == 2
    return s


@scenario("R-max-tokens-sticky",
          "R14.2, R14.3: after a max-tokens step a turn-stopping steer continues the turn; the "
          "reason stays max-tokens through the later normal step; the next turn starts at "
          "completed",
          ["R14.2", "R14.3", "R8.5", "V19"], ["rule"])
def max_tokens_sticky() -> Session:
    s = Session(reply("cut", finish="max-tokens"), "rest", "next")
    def stopping(e: Effect) -> None:
        s.steer("continue")
    s.handle("turn-stopping", stopping, times=1)
    s.followup("go")
    s.run()
    s.followup("again")
    s.run()
    assert [r["kind"] for r in s.reasons()] == ["max-tokens", "completed"]
    assert live_of(s, "settled") == ["settled(1,completed)", "settled(2,completed)"]
    return s


@scenario("R-dispose-no-new-work",
          "R17.4, R17.1: while disposing nothing new is claimed: a waking prompt sent during the "
          "turn's disposal is discarded by a disposed cancel at continue-or-idle; a quiet item "
          "sent during the flush is reported at teardown, before agent/disposed (D11)",
          ["R17.4", "R17.1", "R17.3", "R20.1", "D11"], ["rule", "dispose", "differs-from-original", "D11"])
def dispose_no_new_work() -> Session:
    s = Session()
    s.hold("model")
    s.hold("flush")
    s.followup("go")
    s.run()
    s.dispose()
    s.followup("late")
    s.run()
    s.fail_model(error("aborted", "AbortError"))
    s.run()
    s.send("parked", {"target": "next-turn", "wakeup": False})
    s.resolve("flush")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,disposed)")
    tail = s.live()[s.live().index("settled(1,aborted)"):]
    assert tail == ["settled(1,aborted)", "disc[late,parked]", "idle", "agent/disposed",
                    "session/disposed"] or tail == [
        "settled(1,aborted)", "disc[late]", "idle", "disc[parked]", "agent/disposed",
        "session/disposed"], tail
    return s


@scenario("R-keep-inbox-during-turn",
          "R16.5: a keepInbox cancel aborts only the running turn; the queued prompt is claimed "
          "right after the aborted turn's flush with no idle in between, and retained steering "
          "is taken by its inherited drain",
          ["R16.5", "R11.3", "R8.3", "R7.2"], ["rule", "cancel"])
def keep_inbox_turn() -> Session:
    s = started("next reply", hold="model")
    s.followup("next")
    s.steer("kept steering")
    s.cancel(keep_inbox=True)
    s.run()
    s.fail_model(error("aborted", "AbortError"))
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted) "
                 "TS(2,msg:user) STM(2;'kept steering';user) UM('next') SS(2.1) CH… "
                 "AM(2.1;'next reply') SE(2.1) TE(2,completed)")
    assert s.live("agent/status") == ["running", "idle"]
    assert not live_of(s, "disc", "ctxdisc")
    return s


@scenario("R-ignored-signal-awaited",
          "R16.6, R0.7: work that ignores its signal keeps running: after a cancel the turn waits "
          "for the outstanding tool body before it can close, and a body that then fails with an "
          "error result keeps that result",
          ["R16.6", "R0.7", "R10.7", "R10.11"], ["rule", "cancel", "tools"])
def ignored_signal() -> Session:
    s = started(calls(("c1", "t")), hold="tool-execute")
    s.cancel()
    s.run()
    assert s.types()[-1] == "tool/call" and not s.core.is_quiescent
    s.resolve("tool-execute", result("failed anyway", isError=True))
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;call c1) TC(1.1;c1) "
                 "TR(1.1;c1;ERR) SE(1.1) TE(1,aborted)")
    return s


@scenario("P-protocol-errors",
          "P10, P5: completions of an effect that was never requested, already completed or "
          "released, a chunk for a non-model effect, a resolve for a model effect and a raise "
          "without an error are refused with a protocol error and change nothing",
          ["P10", "P5", "P4", "R4.10"], ["rule", "protocol"])
def protocol_errors() -> Session:
    s = Session()
    s.hold("model")
    s.hold("step")
    s.followup("go")
    s.run()
    step = s.held("step")
    for bad in (lambda: s.core.resolve(99, None), lambda: s.core.chunk(step.id, {"type": "x"}),
                lambda: s.core.fail(step.id, "not an error")):
        assert s.attempt(bad) is not None
    s.resolve("step")
    assert s.attempt(lambda: s.core.resolve(step.id, None)) is not None
    s.run()
    model = s.held("model")
    assert s.attempt(lambda: s.core.resolve(model.id, None)) is not None
    s.cancel()
    s.run()
    s.core.chunk(model.id, {"type": "text", "text": "late"})
    s.run()
    assert "release" in s.trace()
    assert s.attempt(lambda: s.core.end(model.id)) is not None
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) SE(1.1) TE(1,aborted)")
    assert len(s.caught) == 6
    return s


@scenario("P-lazy-completions",
          "P6, P3: a completion is buffered and consumed only when the loop next waits for it, so "
          "a command fed after the completion (and before the next pull) takes effect first: "
          "context injected after the step hook's completion still joins the top-of-step drain",
          ["P6", "P3", "R9.2"], ["rule", "protocol"])
def lazy_completions() -> Session:
    s = started("ok", hold="step")
    s.resolve("step")
    s.inject("after completion", "plugin:test")
    s.run()
    s.expect_log("TS(1,msg:user) UM('go') UM('after completion';plugin:test) SS(1.1) RH(initial) "
                 "CH… AM(1.1;'ok') SE(1.1) TE(1,completed)")
    return s


@scenario("P-folding-and-ids",
          "P12, R9.8: consecutive text chunks extend one text block, reasoning likewise, a block "
          "chunk adds its block, a usage chunk adds no content; the assistant id is "
          "assistant-<seq> and its source names the header's provider and model; usage is the "
          "usage chunk's",
          ["P12", "R9.8", "R9.7", "V18"], ["rule", "protocol"])
def folding() -> Session:
    chunks = [{"type": "reasoning", "text": "think "}, {"type": "reasoning", "text": "hard"},
              {"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"},
              {"type": "text", "text": "!"},
              {"type": "block", "block": {"type": "text", "text": "as a block"}},
              {"type": "usage", "usage": {"outputTokens": 7}}, {"type": "finish", "kind": "stop"}]
    s = Session(chunks, request_options={"provider": "acme", "model": "m-1"})
    s.followup("go")
    s.run()
    am = s.data("assistant/message")[0]
    seq = next(e.seq for e in s.events() if e.type == "assistant/message")
    assert am["message"]["id"] == f"assistant-{seq}"
    assert am["message"]["content"] == [
        {"type": "reasoning", "text": "think hard"}, {"type": "text", "text": "Hello!"},
        {"type": "text", "text": "as a block"}], am
    assert am["message"]["source"] == {"kind": "model", "provider": "acme", "model": "m-1"}
    assert am["usage"] == {"outputTokens": 7}
    return s


@scenario("P-observers-throw",
          "P14, R0.1: observers that throw change nothing: their failures are contained by the "
          "driver, at a live notice (running), at durable events (turn/start, a streamed chunk, "
          "turn/end) and at agent/settled; the turn and the next one run as if nothing had "
          "happened",
          ["P14", "R0.1", "L11", "P2"], ["rule", "protocol"])
def observers_throw() -> Session:
    s = Session("one", "two")
    for position in (live("agent/status", status="running"), durable("turn/start"),
                     durable("assistant/chunk"), durable("turn/end"), live("agent/settled")):
        s.on(position, lambda _o: s.observer_throws())
    s.followup("first")
    s.run()
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('first') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('second') SS(2.1) CH… AM(2.1;'two') SE(2.1) "
                 "TE(2,completed)")
    assert s.live().count("idle") == 2
    return s


@scenario("R-step-failure-rendered",
          "R0.9, R15.3: the turn/end message of a generic failure is the rendered text (the "
          "message, then ': ' and each cause); agent/error carries the error as data",
          ["R0.9", "R15.3", "R8.6", "V15"], ["rule"])
def rendered() -> Session:
    s = Session()
    s.handle("system-prompt", lambda e: ("raise", ErrorInfo(
        "", "PromptError", causes=("template missing", "file not found"))))
    s.followup("go")
    s.run()
    assert s.reasons() == [{"kind": "error", "step": 1,
                            "message": "PromptError: template missing: file not found"}]
    return s



@scenario("R-loop-records-while-busy",
          "R20.4: while the agent is busy, a direct append of an event type the loop writes "
          "itself is refused as an invariant violation even where the log alone would accept "
          "it (a step/end closing the loop's open step, an error tool/result in it); nothing "
          "is appended, no seq is consumed, and the turn completes; idle, the same types are "
          "the log's to judge",
          ["R20.4", "R20.2", "L2", "L5", "L7", "D13"], ["rule", "differs-from-original", "D13"])
def loop_records_while_busy() -> Session:
    s = Session("one")
    refusals: list[str | None] = []

    def request(e: Effect) -> Any:
        refusals.append(s.attempt(lambda: s.core.append(
            "step/end", {"turn": 1, "step": 1}) and None))
        refusals.append(s.attempt(lambda: s.core.append(
            "tool/result", {"turn": 1, "step": 1, "message": {
                "id": "x-tr", "role": "user", "source": {"kind": "tool", "callId": "x1"},
                "content": [{"type": "tool-result", "toolCallId": "x1", "content": [],
                             "isError": True}]},
                "error": {"name": "ToolNotStartedError", "code": "TOOL_NOT_STARTED"}},
            surface_op="append") and None))
        return None
    s.handle("request", request, times=1)
    s.followup("go")
    s.run()
    assert len(refusals) == 2 and all(r is not None and "[R20.4]" in r for r in refusals)
    s.expect_log("TS(1,msg:user) UM('go') SS(1.1) RH(initial) CH… AM(1.1;'one') SE(1.1) "
                 "TE(1,completed)")
    return s


@scenario("R-turn-counter-follows-the-log",
          "R4.7, D14: a turn appended directly while the agent is idle (turn/start 1 to "
          "turn/end 1) counts: the next run opens turn 2 and completes, and so does the one "
          "after it",
          ["R4.7", "R8.1", "R8.2", "R20.2", "D14"], ["rule", "differs-from-original", "D14"])
def turn_counter_follows_the_log() -> Session:
    s = Session("one", "two")
    s.core.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    s.core.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
    s.followup("go")
    s.run()
    s.followup("again")
    s.run()
    s.expect_log("TS(1,retry) TE(1,completed) "
                 "TS(2,msg:user) UM('go') SS(2.1) RH(initial) CH… AM(2.1;'one') SE(2.1) "
                 "TE(2,completed) "
                 "TS(3,msg:user) UM('again') SS(3.1) CH… AM(3.1;'two') SE(3.1) TE(3,completed)")
    return s


@scenario("P-turn-cannot-start",
          "P16 case 3: a turn that direct appends left open (the agent idle) keeps a later run "
          "from opening its own: the log refuses that turn/start, so there is no turn; "
          "agent/error reports the refusal at step 0 of turn 2 (the turn the run would have "
          "opened, D14), the agent writes neither the prompt nor a decision's contexts, "
          "flushes and settles nothing, and goes idle",
          ["P16", "R20.4", "L4", "R12.7", "R4.7", "D14"],
          ["rule", "protocol", "differs-from-original", "D14"])
def turn_cannot_start() -> Session:
    s = Session("never")
    s.core.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    s.followup("go")
    s.run()
    assert not live_of(s, "warn("), s.live()
    errors = [o.event.payload for o in s.outputs
              if isinstance(o, Live) and o.event.type == "agent/error"]
    assert [(e["turn"], e["step"], thaw(e["error"])) for e in errors] == [
        (2, 0, {"name": "InvariantError", "code": "INVARIANT",
                "message": "[L4] turn/start: turn 1 is still open"})], errors
    s.expect_log("TS(1,retry)")
    assert s.effects("model") == [] and s.effects("flush") == []
    return s
