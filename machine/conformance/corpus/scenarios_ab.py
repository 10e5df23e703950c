"""Scenarios A (idle routing and the wake) and B (prompt admission) of scenarios.md."""

from __future__ import annotations

from collections.abc import Callable

from machine.conformance.authoring import Session, error, live, notation, scenario
from machine.conformance.corpus.common import block, started
from machine.errors import ValidationError
from machine.io import Control, Effect

U = {"inputTokens": 3, "outputTokens": 2}


@scenario("A1-simple-prompt-turn",
          "A1. A followup on an idle agent runs one complete turn: wake, claim, admission, one "
          "step with its request header, turn-stopping, turn end, flush, settlement, idle",
          ["R0.1", "R0.2", "R0.3", "R0.4", "R3.1", "R3.2", "R4.2", "R4.3", "R5.3", "R5.4", "R5.5",
           "R6.1", "R6.2", "R7.2", "R7.4", "R7.5", "R7.6",
           "R7.9", "R8.1", "R8.2", "R8.3", "R8.4", "R8.5", "R8.7", "R9.1", "R9.3", "R9.4", "R9.5",
           "R9.6", "R9.7", "R9.8", "R9.10", "R8.8", "R12.4", "R12.5", "R12.7", "R20.3", "P1",
           "P4", "P8", "P11"],
          ["scenario", "scenario:A1"])
def a1() -> Session:
    s = Session(["unused"])
    s.env.replies = [[{"type": "text", "text": "hello "}, {"type": "text", "text": "there"},
                      {"type": "usage", "usage": U}, {"type": "finish", "kind": "stop"}]]
    s.followup("hi")
    s.run()
    s.expect_log("TS(1,msg:user) UM('hi') SS(1.1) RH(initial) CH… AM(1.1;'hello there') SE(1.1) "
                 "TE(1,completed)")
    am = s.data("assistant/message")[0]
    assert am["usage"] == U
    chunk_seqs = [e.seq for e in s.events() if e.type == "assistant/chunk"]
    assert len(chunk_seqs) == 4    # text, text, usage, finish
    assert [e.source_event_seqs for e in s.events() if e.type == "assistant/message"] == [
        tuple(chunk_seqs)]
    assert [m.role for m in s.core.log.derive_messages()] == ["user", "assistant"]
    assert s.trace(durable=("TS", "UM", "TE"),
                   effects=("prompt-submit", "step", "request", "turn-stopping", "flush")) == notation(
        "enq(hi,q) running ⟨prompt-submit⟩ deq(hi,q) [TS(1,msg:user)] [UM('hi')] ⟨step 1.1⟩ "
        "⟨request 1.1⟩ ⟨turn-stopping 1⟩ [TE(1,completed)] flush(1) settled(1,completed) idle")
    s.expect_live("enq(hi,q) running deq(hi,q) settled(1,completed) idle")
    assert s.trace(durable=()) == [
        "tick(wake)", "enq(hi,q)", "running", "⟨prompt-submit⟩", "deq(hi,q)", "⟨step 1.1⟩",
        "⟨system-prompt 1.1⟩", "⟨request 1.1⟩", "⟨model 1.1⟩", "⟨turn-stopping 1⟩", "flush(1)",
        "settled(1,completed)", "idle"]
    assert s.requests() == [["'hi'"]]
    return s


@scenario("A2-idle-inject-appends-only",
          "A2. An idle inject appends one user/message and does nothing else: no status, no inbox "
          "notification, no wake, no request, no flush",
          ["R5.2", "R5.6", "R6.1", "R18"], ["scenario", "scenario:A2"])
def a2() -> Session:
    s = Session()
    s.inject("context", "plugin:p")
    assert s.core.is_quiescent            # whenIdle() completes at once
    s.run()
    s.expect_log("UM('context';plugin:p)")
    assert s.live() == [] and s.effects() == []
    assert s.core.is_quiescent and s.core.status == "idle"
    return s


@scenario("A3-invalid-messages-refused",
          "A3. Invalid messages and options are refused at the call with a validation error and "
          "no effect (empty id, assistant role, missing source, source without kind, block "
          "without type, next-turn without wakeup, an extra option); a later valid followup runs "
          "as turn 1",
          ["R5.1", "D5", "V7", "V10"], ["scenario", "scenario:A3", "differs-from-original", "D5"])
def a3() -> Session:
    s = Session("ok")
    s.pump()

    def refused(command: Callable[[], object], named: str) -> None:
        """A validation error (a ValueError) naming the field; the recorder records it."""
        try:
            command()
        except ValidationError as exc:
            assert isinstance(exc, ValueError) and named in str(exc), exc
            s.caught.append(str(exc))
        else:
            raise AssertionError("accepted")
    bad_id = s.msg("x", "plugin:p", id="")
    refused(lambda: s.core.inject(bad_id), "id")
    assistant = {**s.msg("x"), "role": "assistant"}
    refused(lambda: s.core.followup(assistant), "role")
    no_source = {k: v for k, v in s.msg("x").items() if k != "source"}
    refused(lambda: s.core.steer(no_source), "source")
    kindless = {**s.msg("x"), "source": {"plugin": "p"}}
    refused(lambda: s.core.steer(kindless), "kind")
    typeless = {**s.msg("x"), "content": [{"text": "no type"}]}
    refused(lambda: s.core.inject(typeless), "type")
    refused(lambda: s.core.send(s.msg("x"), {"target": "next-turn"}), "wakeup")
    refused(lambda: s.core.send(s.msg("x"), {"target": "next-turn", "wakeup": True,
                                             "context": []}), "context")
    assert len(s.caught) == 7
    assert s.log() == [] and s.live() == [] and s.effects() == []
    assert s.core.is_quiescent and not s.core.wake_pending
    s.followup("ok")
    s.run()
    s.expect_log("TS(1,msg:user) UM('ok') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    return s


@scenario("A4-idle-context-then-prompt",
          "A4. Idle context is appended at once, between turns, and the next turn's request "
          "contains it verbatim, as its own user message, before the prompt",
          ["R5.2", "L13", "R9.4", "R20.3"], ["scenario", "scenario:A4"])
def a4() -> Session:
    s = Session("ok")
    s.inject("file changed: a.ts", "plugin:watcher")
    s.run()
    assert s.log() == ["UM('file changed: a.ts';plugin:watcher)"] and s.effects() == []
    assert s.core.status == "idle"
    assert s.data("user/message") == [{"id": "m1", "role": "user", "content": [
        {"type": "text", "text": "file changed: a.ts"}], "source": {"kind": "plugin", "plugin": "watcher"}}]
    s.followup("go")
    s.run()
    s.expect_log("UM('file changed: a.ts';plugin:watcher) TS(1,msg:user) UM('go') SS(1.1) "
                 "RH(initial) CH… AM(1.1;'ok') SE(1.1) TE(1,completed)")
    assert s.requests() == [["'file changed: a.ts';plugin:watcher", "'go'"]]
    history = s.effects("model")[0].history
    assert history is not None and [m.to_json() for m in history] == s.data("user/message")
    return s


@scenario("A5-idle-steer-is-a-prompt",
          "A5. An idle steer is queued (placement queued) and becomes an ordinary prompt turn "
          "whose trigger carries the steer's source; no steering/message",
          ["R5.3", "R5.4", "R5.6", "R6.2", "R7.9", "V13"], ["scenario", "scenario:A5"])
def a5() -> Session:
    s = Session("ok")
    s.steer("steer idle", "plugin:test")
    s.run()
    s.expect_log("TS(1,msg:plugin:test) UM('steer idle';plugin:test) SS(1.1) RH(initial) CH… "
                 "AM(1.1;'ok') SE(1.1) TE(1,completed)")
    s.expect_live("enq(steer idle,q) running deq(steer idle,q) settled(1,completed) idle")
    assert s.data("turn/start")[0]["trigger"] == {"kind": "message",
                                                  "source": {"kind": "plugin", "plugin": "test"}}
    assert len(s.effects("model")) == 1
    return s


@scenario("A6-two-idle-steers-two-turns",
          "A6. Two idle steers issued in one synchronous stack are both queued and make two turns "
          "in one running interval; each request contains only its own prompt",
          ["R6.3", "R5.3", "R6.1", "R12.7", "R4.1", "R4.2", "R7.1"], ["scenario", "scenario:A6"])
def a6() -> Session:
    s = Session("first", "second")
    s.steer("S1")
    s.steer("S2")
    s.run()
    s.expect_log("TS(1,msg:user) UM('S1') SS(1.1) RH(initial) CH… AM(1.1;'first') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('S2') SS(2.1) CH… AM(2.1;'second') SE(2.1) "
                 "TE(2,completed)")
    s.expect_live("enq(S1,q) enq(S2,q) running deq(S1,q) settled(1,completed) deq(S2,q) "
                  "settled(2,completed) idle")
    assert s.requests() == [["'S1'"], ["'S1'", "'first'", "'S2'"]]
    assert len(s.effects("tick")) == 1
    assert s.trace(durable=(), effects=("flush",)) == notation(
        "enq(S1,q) enq(S2,q) running deq(S1,q) flush(1) settled(1,completed) deq(S2,q) "
        "flush(2) settled(2,completed) idle")
    return s


@scenario("A8-quiet-send-parked",
          "A8. A quiet send (next-turn, no wakeup) is announced but parked: no wake, no status; a "
          "later waking followup claims it first, in FIFO order, in the same running interval",
          ["R5.7", "R5.5", "R6.1", "R4.1", "R7.1", "R7.2", "R12.7"], ["scenario", "scenario:A8"])
def a8() -> Session:
    s = Session("reply", "ok")
    s.send("quiet", {"target": "next-turn", "wakeup": False})
    s.run()
    assert s.log() == [] and s.live() == ["enq(quiet,q)"] and s.effects() == []
    assert s.core.is_quiescent and s.core.status == "idle"
    s.followup("wake")
    s.run()
    s.expect_log("TS(1,msg:user) UM('quiet') SS(1.1) RH(initial) CH… AM(1.1;'reply') SE(1.1) "
                 "TE(1,completed) TS(2,msg:user) UM('wake') SS(2.1) CH… AM(2.1;'ok') SE(2.1) "
                 "TE(2,completed)")
    s.expect_live("enq(quiet,q) enq(wake,q) running deq(quiet,q) settled(1,completed) deq(wake,q) "
                  "settled(2,completed) idle")
    return s


@scenario("A10-sends-keep-their-sources",
          "A10. A followup sent while the first claim's admission is pending is queued without a "
          "wake (the agent is busy) and its turn keeps its own plugin source as trigger",
          ["R6.1", "V13", "R7.9", "R5.6", "R12.7"], ["scenario", "scenario:A10"])
def a10() -> Session:
    s = started("one", "two", hold="prompt-submit", prompt="user message")
    assert s.core.status == "running"
    s.followup("plugin message", "plugin:test")
    assert len(s.effects("tick")) == 1 and not s.core.wake_pending   # queued without a wake
    s.resolve("prompt-submit", {"kind": "allow"})
    s.run()
    s.expect_log("TS(1,msg:user) UM('user message') SS(1.1) RH(initial) CH… AM(1.1;'one') "
                 "SE(1.1) TE(1,completed) TS(2,msg:plugin:test) UM('plugin message';plugin:test) "
                 "SS(2.1) CH… AM(2.1;'two') SE(2.1) TE(2,completed)")
    assert [d["trigger"] for d in s.data("turn/start")] == [
        {"kind": "message", "source": {"kind": "user"}},
        {"kind": "message", "source": {"kind": "plugin", "plugin": "test"}}]
    assert [d["source"] for d in s.data("user/message")] == [
        {"kind": "user"}, {"kind": "plugin", "plugin": "test"}]
    assert len(s.effects("tick")) == 1
    return s


@scenario("A12-session-start-context",
          "A12. Context injected by an agent/session-start observer is appended before the first "
          "turn and reaches its request with its plugin source",
          ["R5.2", "R19", "L13", "R4.3"], ["scenario", "scenario:A12"])
def a12() -> Session:
    s = Session("ok")
    s.on(live("agent/session-start"), lambda o: s.inject("session preamble", "plugin:test"))
    s.pump()
    s.followup("go")
    s.run()
    s.expect_log("UM('session preamble';plugin:test) TS(1,msg:user) UM('go') SS(1.1) RH(initial) "
                 "CH… AM(1.1;'ok') SE(1.1) TE(1,completed)")
    assert s.requests() == [["'session preamble';plugin:test", "'go'"]]
    return s


# --------------------------------------------------------------------------
# B. Prompt admission
# --------------------------------------------------------------------------


@scenario("B1-allow-rewrites-content",
          "B1. An allow decision with replacement content records a prompt with the claimed "
          "message's id and source and the new content; the dequeue reports the original",
          ["R7.7", "V5", "R7.6", "V17"], ["scenario", "scenario:B1"])
def b1() -> Session:
    s = Session("ok")
    s.handle("prompt-submit", lambda e: ("resolve", {
        "kind": "allow", "content": [{"type": "text", "text": "REWRITTEN"}]}))
    s.followup(s.msg("original", id="m1"))
    s.run()
    s.expect_log("TS(1,msg:user) UM('REWRITTEN') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    um = s.data("user/message")[0]
    assert um["id"] == "m1" and um["source"] == {"kind": "user"}
    assert s.requests() == [["'REWRITTEN'"]]
    s.expect_live("enq(original,q) running deq(original,q) settled(1,completed) idle")
    assert s.payloads("agent/inbox/dequeue")[0]["message"] == {
        "id": "m1", "role": "user", "content": [{"type": "text", "text": "original"}],
        "source": {"kind": "user"}}
    return s


@scenario("B2-allow-with-contexts",
          "B2. An allow decision with additional contexts records the prompt first, then each "
          "context as its own user message, before the first step",
          ["R7.7", "R8.3", "V17"], ["scenario", "scenario:B2"])
def b2() -> Session:
    s = Session("ok")
    ctx = s.msg("injected ctx", "plugin:test", id="ctx-1")
    s.handle("prompt-submit", lambda e: ("resolve", {
        "kind": "allow", "content": [{"type": "text", "text": "REWRITTEN prompt"}],
        "additionalContexts": [ctx]}))
    seen: list[list[str]] = []

    def step_hook(e: Effect) -> None:         # the default answer: it only looks
        seen.append(s.history())
    s.handle("step", step_hook, times=1)
    s.followup("ORIGINAL prompt")
    s.run()
    assert seen == [["'REWRITTEN prompt'", "'injected ctx';plugin:test"]]
    s.expect_log("TS(1,msg:user) UM('REWRITTEN prompt') UM('injected ctx';plugin:test) SS(1.1) "
                 "RH(initial) CH… AM(1.1;'ok') SE(1.1) TE(1,completed)")
    assert s.data("user/message")[1]["id"] == "ctx-1" and s.data("user/message")[0]["id"] != "ctx-1"
    assert s.data("user/message")[1]["source"] == ctx["source"]
    assert s.requests() == [["'REWRITTEN prompt'", "'injected ctx';plugin:test"]]
    return s


@scenario("B3-block-nothing-durable",
          "B3. A blocked admission writes nothing: no turn, no settlement, no flush, no error; "
          "the window closes and the rejected-admission tick precedes idle",
          ["R7.7", "R7.10", "R12.6", "R4.3"], ["scenario", "scenario:B3"])
def b3() -> Session:
    s = Session()
    s.handle("prompt-submit", lambda e: ("resolve", {"kind": "block", "reason": "blocked by policy"}))
    s.followup("do something")
    s.run()
    assert s.log() == []
    s.expect_live("enq(do something,q) running deq(do something,q) idle")
    assert s.trace() == ["tick(wake)", "enq(do something,q)", "running", "⟨prompt-submit⟩",
                         "deq(do something,q)", "tick(rejected-admission)", "idle"]
    assert not s.core.accepts_next_step
    return s


@scenario("B4-inject-and-steer-during-admission",
          "B4. Context and steering sent while an admission is pending are staged (the window is "
          "open) and drained after the prompt: UM(prompt), UM(context), then STM",
          ["R4.3", "R5.2", "R5.3", "R7.3", "R8.3", "R11.1", "R11.2", "R19"],
          ["scenario", "scenario:B4"])
def b4() -> Session:
    s = started("ok", hold="prompt-submit", prompt="admitted prompt")
    assert s.core.status == "running" and s.core.accepts_next_step and s.log() == []
    s.inject("attached context", "plugin:test")
    s.steer("admission steering")
    assert s.core.status == "running" and s.core.accepts_next_step and s.log() == []
    s.resolve("prompt-submit", {"kind": "allow"})
    s.run()
    assert s.trace(durable=("TS", "UM", "STM", "TE"),
                   effects=("prompt-submit", "step", "flush")) == notation(
        "enq(admitted prompt,q) running ⟨prompt-submit⟩ deq(admitted prompt,q) "
        "enq(admission steering,s) [TS(1,msg:user)] [UM('admitted prompt')] "
        "[UM('attached context';plugin:test)] deq(admission steering,s) "
        "[STM(1;'admission steering';user)] ⟨step 1.1⟩ [TE(1,completed)] flush(1) "
        "settled(1,completed) idle")
    s.expect_log("TS(1,msg:user) UM('admitted prompt') UM('attached context';plugin:test) "
                 "STM(1;'admission steering';user) SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    s.expect_live("enq(admitted prompt,q) running deq(admitted prompt,q) enq(admission steering,s) "
                  "deq(admission steering,s) settled(1,completed) idle")
    assert s.requests() == [["'admitted prompt'", "'attached context';plugin:test",
                             "'admission steering'"]]
    assert not s.core.accepts_next_step
    return s


@scenario("B7-block-appends-context-between-turns",
          "B7. A blocked admission with only context staged appends that context between turns, "
          "after the window closes; no turn, no flush, no settlement",
          ["R7.10", "R11.2", "R4.3"], ["scenario", "scenario:B7"])
def b7() -> Session:
    s = started(hold="prompt-submit", prompt="blocked prompt")
    s.inject("independent context", "plugin:test")
    assert s.log() == []
    block(s)
    s.expect_log("UM('independent context';plugin:test)")
    s.expect_live("enq(blocked prompt,q) running deq(blocked prompt,q) idle")
    assert s.trace(durable=("UM",), effects=("flush",)) == notation(
        "enq(blocked prompt,q) running deq(blocked prompt,q) "
        "[UM('independent context';plugin:test)] idle")
    assert not s.effects("flush") and not s.effects("model")
    return s


@scenario("B8-rejected-admission-append-then-prompt",
          "B8. The rejected-admission context append cannot be vetoed (D7): a pre-commit observer "
          "vetoes the next append, that context's user/message (P14), and nothing changes; a "
          "later prompt's request holds that context first",
          ["R7.10", "D7", "L13", "L11", "P14"],
          ["scenario", "scenario:B8", "differs-from-original", "D7"])
def b8() -> Session:
    s = started("retried", hold="prompt-submit", prompt="blocked")
    s.inject("retained context", "plugin:test")
    s.observer_vetoes()
    block(s)
    assert s.log() == ["UM('retained context';plugin:test)"]
    # neither removed nor delayed: appended at the rejected path, before continue-or-idle
    assert s.trace(durable=("UM",), effects=("tick",))[-3:] == notation(
        "[UM('retained context';plugin:test)] tick(rejected-admission) idle")
    assert s.core.is_quiescent
    s.followup("resume")
    s.run()
    s.expect_log("UM('retained context';plugin:test) TS(1,msg:user) UM('resume') SS(1.1) "
                 "RH(initial) CH… AM(1.1;'retried') SE(1.1) TE(1,completed)")
    assert s.requests() == [["'retained context';plugin:test", "'resume'"]]
    assert "error" not in " ".join(s.live())
    return s


@scenario("B9-blocked-and-allowed-independent",
          "B9. A blocked prompt and an allowed prompt queued behind it stay independent: one turn, "
          "for the allowed prompt only, in one running interval",
          ["R7.7", "R7.10", "R12.7", "R4.2"], ["scenario", "scenario:B9"])
def b9() -> Session:
    s = Session("ok")

    def decide(e: object) -> object:
        text = e.payload["message"]["content"][0]["text"]  # type: ignore[attr-defined]
        return ("resolve", {"kind": "block", "reason": "secret"} if text == "secret"
                else {"kind": "allow"})
    s.handle("prompt-submit", decide)
    s.followup("secret")
    s.followup("safe")
    s.run()
    s.expect_log("TS(1,msg:user) UM('safe') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    s.expect_live("enq(secret,q) enq(safe,q) running deq(secret,q) deq(safe,q) "
                  "settled(1,completed) idle")
    assert s.trace(durable=(), effects=("prompt-submit",)) == notation(
        "enq(secret,q) enq(safe,q) running ⟨prompt-submit⟩ deq(secret,q) ⟨prompt-submit⟩ "
        "deq(safe,q) settled(1,completed) idle")
    return s


@scenario("B10-raising-admission-drops-prompt",
          "B10. A raising admission handler drops only that prompt, with the warning 'prompt "
          "admission failed: <rendered>' and no agent/error; the next prompt runs",
          ["R7.7", "R7.10", "R0.9", "R12.7"], ["scenario", "scenario:B10"])
def b10() -> Session:
    s = Session("ok")
    s.handle("prompt-submit", lambda e: ("raise", error("handler exploded", "AdmissionError")),
             times=1)
    s.followup("first")
    s.followup("second")
    s.run()
    s.expect_log("TS(1,msg:user) UM('second') SS(1.1) RH(initial) CH… AM(1.1;'ok') SE(1.1) "
                 "TE(1,completed)")
    s.expect_live("enq(first,q) enq(second,q) running deq(first,q) "
                  "warn('prompt admission failed: handler exploded') deq(second,q) "
                  "settled(1,completed) idle")
    assert s.requests() == [["'second'"]]
    return s


@scenario("B11-cancel-cooperative-admission",
          "B11. Cancelling a pending admission aborts its signal; the handler's later allow is "
          "ignored (no warning), no turn opens, nothing is discarded",
          ["R7.7", "R7.8", "R16.2", "R16.4", "R4.4", "R0.7"], ["scenario", "scenario:B11"])
def b11() -> Session:
    s = started(hold="prompt-submit")
    s.cancel()
    s.run()
    s.resolve("prompt-submit", {"kind": "allow"})
    s.run()
    assert s.log() == []
    s.expect_live("enq(go,q) running deq(go,q) cancel-req(user) idle")
    assert s.trace() == ["tick(wake)", "enq(go,q)", "running", "⟨prompt-submit⟩", "deq(go,q)",
                         "cancel-req(user)", "abort(user)", "tick(rejected-admission)", "idle"]
    # the admission has its own signal (distinct from any turn's)
    (abort,) = [o for o in s.outputs if isinstance(o, Control) and o.kind == "abort"]
    assert abort.payload["signal"] == s.effects("prompt-submit")[0].payload["signal"]
    return s

