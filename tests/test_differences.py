"""Family D (specs/core.md D9–D15, specs/differences.md) and the protocol rules the fidelity
work added (specs/protocol.md P14 observers that fail, P15 internal yields).

Each test drives the machine and the reference model with the same inputs and requires the
same outputs, so a rule here is checked in both readings of the spec.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import pytest
from scenario_helpers import at

from machine.checking.scripted import (
    HOLD,
    Driver,
    ScriptedEnvironment,
    calls_reply,
    model_failure,
    text_reply,
)
from machine.core import AgentCore, CoreConfig
from machine.errors import CodecError, DisposedError, InvariantError, TurnstileError
from machine.events import CANCEL_REQUESTED, CORE_EVENT_TYPES, INBOX_DISCARD, LIVE_TYPES
from machine.io import (
    EFFECT_KINDS,
    Control,
    Durable,
    Effect,
    Live,
    Observer,
    Output,
    input_from_json,
)
from machine.jsonvalue import thaw
from machine.vocabulary import ErrorInfo, user_message

if TYPE_CHECKING:
    # The same files: setup.py installs model/ as machine._model, which mypy cannot follow.
    from model import ModelAgent
else:
    from machine._model import ModelAgent

Core = Callable[[CoreConfig], AgentCore]
IMPLEMENTATIONS: dict[str, Core] = {
    "machine": AgentCore,
    "model": lambda config: cast(AgentCore, ModelAgent(config)),
}
CONFIG = CoreConfig(publish=False)
#: every run below must end well within this many outputs (a loop would not)
BOUND = 2_000


def message(text: str, id: str) -> Any:
    return user_message(id, text)


def driven(core: AgentCore, env: ScriptedEnvironment) -> Driver:
    return Driver(core, env)


def tokens(outputs: list[Output]) -> list[str]:
    out: list[str] = []
    for o in outputs:
        if isinstance(o, Live):
            out.append(o.event.type)
        elif isinstance(o, Durable):
            out.append(f"[{o.event.type}]")
        elif isinstance(o, Effect):
            out.append(f"{{{o.kind}}}")
        elif isinstance(o, Control):
            out.append(o.kind)
    return out


def streaming(core: AgentCore) -> Driver:
    """A driver over *core* whose first turn is streaming (the model effect held)."""
    env = ScriptedEnvironment()
    env.handlers["model"] = lambda _e: HOLD
    driver = driven(core, env)
    core.followup(message("go", "m1"))
    driver.run()
    return driver


def both(run: Callable[[AgentCore], list[Any]], config: CoreConfig = CONFIG) -> list[Any]:
    """Run *run* on the machine and on the model; they must agree; returns the result."""
    results = [run(make(config)) for make in IMPLEMENTATIONS.values()]
    assert results[0] == results[1], f"machine {results[0]}\nmodel   {results[1]}"
    return results[0]


# --------------------------------------------------------------------------
# D9: a cancel joined to one in progress with nothing new to clear does nothing
# --------------------------------------------------------------------------

#: Every kind of output the core produces: each live notification type, each durable event
#: type of the core catalog, each effect kind and both control outputs. `every_kind`
#: produces each of them (the test below checks that its trigger was seen).
OUTPUT_KINDS = sorted({*LIVE_TYPES, *CORE_EVENT_TYPES, *EFFECT_KINDS, "abort", "release"})
#: What an observer issues on every output of a kind: the three cancels, dispose, and a
#: direct append of a harmless (extension) event type.
COMMANDS = ["cancel-user", "cancel-parent", "cancel-keep", "dispose", "append"]
HARMLESS = "x-test/mark"
PUBLISHING = CoreConfig(publish=True)


def issue(core: AgentCore, command: str) -> None:
    if command == "dispose":
        core.dispose()
    elif command == "append":
        core.append(HARMLESS, {"n": 1})
    elif command == "cancel-keep":
        core.cancel({"kind": "parent"}, keep_inbox=True)
    else:
        core.cancel({"kind": command.removeprefix("cancel-")})


def kind_of(output: Output) -> str:
    if isinstance(output, (Live, Durable)):
        return output.event.type
    return output.kind


def matches(output: Output, kind: str) -> bool:
    return kind_of(output) == kind


def every_kind(core: AgentCore, trigger: str | None = None,
               command: str | None = None) -> tuple[list[Any], set[str]]:
    """A run that produces every output kind: a turn with a tool call, a steer taken
    mid-turn, a direct `todo/write`, a failed flush (`agent/warning`), a model failure
    (`request-error`), a streaming turn cancelled with input queued and staged whose stream
    a late chunk then releases, and disposal. With *trigger*, an observer issues *command*
    on every output of that kind. Any command, the scenario's own or the observer's, may be
    refused (a cancel after teardown, say): the refusal is recorded in place. Returns the
    tokens (with the refusals) and the kinds of output seen."""
    refusals: list[tuple[int, str]] = []
    state = {"flush failures": 1, "hold": False, "todo": True, "steer": True}

    def flush(_effect: Effect) -> Any:
        if state["flush failures"]:
            state["flush failures"] -= 1
            return ("raise", ErrorInfo("disk full", "FlushError"))
        return None

    env = ScriptedEnvironment(
        replies=[calls_reply(("c1", "t")), text_reply("after tools"),
                 model_failure("overloaded", "OVERLOADED"), text_reply("done"),
                 [{"type": "text", "text": "half"}, {"type": "bogus"}], text_reply("again")],
        handlers={"flush": flush, "model": lambda _e: HOLD if state["hold"] else None})
    driver = driven(core, env)

    def attempt(what: str, act: Callable[[], object]) -> None:
        try:
            act()
        except TurnstileError as error:
            refusals.append((len(driver.outputs), f"{what} refused: {type(error).__name__}"))

    def scenario(output: Output) -> None:
        if state["todo"] and matches(output, "tool/result"):
            state["todo"] = False
            attempt("todo", lambda: core.append("todo/write", {
                "todos": [{"content": "x", "status": "pending"}]}))
        if state["steer"] and matches(output, "tool-execute"):
            state["steer"] = False
            attempt("steer", lambda: core.steer(message("mid", "m4")))
    driver.on(scenario)

    def observer(output: Output) -> None:
        assert len(driver.outputs) < BOUND, "the run did not stop"
        if command is not None and matches(output, trigger or ""):
            attempt(command, lambda: issue(core, command))
    driver.on(observer)
    attempt("send", lambda: core.send(message("quiet", "q1"),
                                      {"target": "next-turn", "wakeup": False}))
    attempt("followup", lambda: core.followup(message("go", "m1")))
    attempt("steer", lambda: core.steer(message("steer", "m2")))
    attempt("inject", lambda: core.inject(message("ctx", "c1")))
    driver.run()
    state["hold"] = True                    # the next turn streams, held after one chunk
    attempt("followup", lambda: core.followup(message("more", "m3")))
    driver.run()
    state["hold"] = False
    held = [effect for effect in driver.held if effect.kind == "model"]
    attempt("followup", lambda: core.followup(message("queued", "m5")))
    attempt("inject", lambda: core.inject(message("ctx", "c2")))
    if held:
        attempt("chunk", lambda: core.chunk(held[0].id, {"type": "text", "text": "par"}))
    driver.pump()
    attempt("cancel", lambda: core.cancel({"kind": "user"}))
    driver.pump()
    if held:                                # a chunk after the abort: the stream is released
        attempt("chunk", lambda: core.chunk(held[0].id, {"type": "text", "text": "tial"}))
        if held[0] in driver.held:
            driver.held.remove(held[0])
    driver.run()
    core.dispose()
    driver.run()
    assert core.disposed and len(driver.outputs) < BOUND
    out: list[Any] = tokens(driver.outputs)
    for position, refusal in reversed(refusals):
        out.insert(position, refusal)
    return out, {kind_of(o) for o in driver.outputs}


def test_D9_the_observed_run_produces_every_output_kind() -> None:
    """The run the next test observes produces every kind of output (so each trigger
    there fires), machine and model alike."""
    def run(core: AgentCore) -> list[Any]:
        out, kinds = every_kind(core)
        assert set(OUTPUT_KINDS) <= kinds, sorted(set(OUTPUT_KINDS) - kinds)
        assert not [token for token in out if "refused" in token]
        return out
    both(run, PUBLISHING)


@pytest.mark.parametrize("trigger", OUTPUT_KINDS)
@pytest.mark.parametrize("command", COMMANDS)
def test_D9_an_observer_that_cancels_disposes_or_appends_on_every_output_of_a_kind_stops(
        trigger: str, command: str) -> None:
    """D9, P7, R16.1, R17, R20.2: an observer that issues *command* on every output of kind
    *trigger* (every live notification type, durable event type, effect kind and control
    output; the command a cancel by the user, by the parent or with keepInbox, dispose, or
    a direct append of a harmless extension event, which may be refused, after teardown
    say) does not keep the run going: it ends, torn down, within `BOUND` outputs, machine
    and model alike (the same outputs and the same refusals), with the invariants of R20.1
    checked at every output by the driver.

    The commands that add input (steer, followup, inject, send) are deliberately not
    among them: issued on every notification of a kind they cause themselves (an enqueue,
    a dequeue, the events of the turn they start), each adds work, so such an observer
    legitimately never stops (specs/core.md, D9)."""
    def run(core: AgentCore) -> list[Any]:
        out, kinds = every_kind(core, trigger, command)
        assert trigger in kinds, f"{trigger} was never output"
        return out
    both(run, PUBLISHING)


@pytest.mark.parametrize("keep", [False, True])
def test_D9_a_joined_cancel_with_nothing_new_to_clear_emits_nothing(keep: bool) -> None:
    """D9: at the cancel-requested of a running turn's cancel, a second cancel (keepInbox or
    not) that finds nothing new to clear adds no notice and leaves the reason alone."""
    def run(core: AgentCore) -> list[Any]:
        driver = streaming(core)
        driver.on(lambda o: core.cancel({"kind": "parent"}, keep_inbox=keep)
                  if matches(o, CANCEL_REQUESTED) else None)
        core.cancel({"kind": "user"}, keep_inbox=keep)
        driver.run()
        aborts = [at(o.payload, "reason", "kind") for o in driver.outputs
                  if isinstance(o, Control) and o.kind == "abort"]
        notices = [o for o in driver.outputs if matches(o, CANCEL_REQUESTED)]
        assert len(notices) == 1 and aborts == ["user"]
        return tokens(driver.outputs)
    both(run)


def test_D9_a_joined_cancel_with_new_input_announces_itself_and_aborts_first() -> None:
    """P7, R16.3: a joined cancel that clears input accepted at the notice runs, as in the
    original, before the first cancel's abort: its cause is the reason."""
    def run(core: AgentCore) -> list[Any]:
        driver = streaming(core)

        def observer(output: Output) -> None:
            if (isinstance(output, Live) and matches(output, CANCEL_REQUESTED)
                    and at(output.event.payload, "cause", "kind") == "user"):
                core.followup(message("late", "m9"))
                core.cancel({"kind": "parent"})
        driver.on(observer)
        core.cancel({"kind": "user"})
        driver.run()
        aborts = [at(o.payload, "reason", "kind") for o in driver.outputs
                  if isinstance(o, Control) and o.kind == "abort"]
        assert aborts == ["parent"]
        assert (reason := core.signal_reason(2)) is not None and reason.kind == "parent"
        return tokens(driver.outputs)
    order = both(run)
    start = order.index("agent/cancel-requested")
    assert order[start:start + 5] == ["agent/cancel-requested", "agent/inbox/enqueue",
                                      "agent/cancel-requested", INBOX_DISCARD, "abort"]


# --------------------------------------------------------------------------
# D10, D11, D12
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", IMPLEMENTATIONS)
def test_D10_every_command_after_teardown_is_refused(name: str) -> None:
    """D10, R17.3: after session/disposed, steer, inject, followup, send, cancel and append
    raise DisposedError and change nothing; dispose does nothing."""
    core = IMPLEMENTATIONS[name](CONFIG)
    core.dispose()
    outputs = core.drain_outputs()
    assert [o.event.type for o in outputs if isinstance(o, Live)][-1] == "session/disposed"
    attempts: list[Callable[[], object]] = [
        lambda: core.steer(message("s", "a")), lambda: core.inject(message("i", "b")),
        lambda: core.followup(message("f", "c")),
        lambda: core.send(message("x", "d"), {"target": "next-turn", "wakeup": True}),
        lambda: core.cancel({"kind": "user"}),
        lambda: core.append("user/message", message("a", "e"), surface_op="append")]
    for attempt in attempts:
        with pytest.raises(DisposedError):
            attempt()
    core.dispose()
    assert core.drain_outputs() == [] and len(core.log) == 0


def test_D11_disposal_claims_nothing_and_runs_no_admission() -> None:
    """D11, R17.4: a waking prompt sent while a turn is being disposed is discarded at
    continue-or-idle; no prompt-submit is requested for it."""
    def run(core: AgentCore) -> list[Any]:
        env = ScriptedEnvironment()
        driver = driven(core, env)
        driver.on(lambda o: core.followup(message("late", "m2"))
                  if isinstance(o, Durable) and o.event.type == "turn/end" else None)
        core.followup(message("go", "m1"))
        driver.on(lambda o: core.dispose()
                  if isinstance(o, Durable) and o.event.type == "step/start" else None)
        driver.run()
        submits = [o for o in driver.outputs if isinstance(o, Effect) and o.kind == "prompt-submit"]
        assert len(submits) == 1 and core.disposed
        return tokens(driver.outputs)
    both(run)


def test_D12_an_aborted_finish_without_failure_is_a_request_failure() -> None:
    """D12, R9.7: it stands for {model request aborted, ABORTED} and reaches request-error."""
    def run(core: AgentCore) -> list[Any]:
        env = ScriptedEnvironment(replies=[[{"type": "finish", "kind": "aborted"}]])
        driver = driven(core, env)
        core.followup(message("go", "m1"))
        driver.run()
        (recovery,) = [o for o in driver.outputs if isinstance(o, Effect) and o.kind == "request-error"]
        assert recovery.payload["failure"] == {"message": "model request aborted", "code": "ABORTED"}
        return tokens(driver.outputs)
    both(run)


# --------------------------------------------------------------------------
# D13, D14
# --------------------------------------------------------------------------


def test_D13_the_loops_records_are_refused_while_it_runs_and_the_turn_completes() -> None:
    """D13, R20.4: a direct step/end closing the loop's open step is refused while busy (the
    original accepted it and the turn then failed on its own next append)."""
    def run(core: AgentCore) -> list[Any]:
        env = ScriptedEnvironment(replies=[text_reply("one")])
        driver = driven(core, env)
        refused: list[str] = []

        def close_the_step(output: Output) -> None:
            if isinstance(output, Durable) and output.event.type == "step/start":
                try:
                    core.append("step/end", {"turn": 1, "step": 1})
                except InvariantError as error:
                    refused.append(error.rule)
        driver.on(close_the_step)
        core.followup(message("go", "m1"))
        driver.run()
        assert refused == ["R20.4"]
        types = [e.type for e in core.log.events]
        assert types.count("step/end") == 1 and types[-1] == "turn/end"
        assert core.log.events[-1].data["reason"] == {"kind": "completed"}
        return tokens(driver.outputs)
    both(run)


def test_D14_a_turn_appended_while_idle_counts_for_the_next_run() -> None:
    """D14, R4.7: after turn/start 1 and turn/end 1 appended directly, the next run opens
    turn 2 (the original asked for turn 1 again, was refused, and lost the prompt)."""
    def run(core: AgentCore) -> list[Any]:
        env = ScriptedEnvironment(replies=[text_reply("one")])
        driver = driven(core, env)
        core.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
        core.append("turn/end", {"turn": 1, "reason": {"kind": "completed"}})
        core.followup(message("go", "m1"))
        driver.run()
        starts = [e.data["turn"] for e in core.log.events if e.type == "turn/start"]
        assert starts == [1, 2] and core.log.events[-1].type == "turn/end"
        assert [o for o in driver.outputs
                if isinstance(o, Live) and o.event.type == "agent/error"] == []
        return tokens(driver.outputs)
    both(run)


# --------------------------------------------------------------------------
# D15: a cancelled stream keeps what the user watched stream
# --------------------------------------------------------------------------

DELIVERED = [{"type": "reasoning", "text": "think"}, {"type": "text", "text": "Hello "},
             {"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"},
             {"type": "text", "text": "world"}, {"type": "usage", "usage": {"outputTokens": 3}}]


def _cancelled_stream(core: AgentCore, delivered: list[Any], ending: str) -> Driver:
    """A turn whose stream delivered *delivered*, then a cancel, then the stream's *ending*:
    ``chunk`` (the next chunk, consumed with the signal aborted), ``raise`` (an AbortError),
    ``end`` (an end before any finish) or ``failure`` (a provider failure)."""
    driver = streaming(core)
    (model,) = [o for o in driver.outputs if isinstance(o, Effect) and o.kind == "model"]
    for chunk in delivered:
        core.chunk(model.id, chunk)
    driver.run()
    core.cancel({"kind": "user"})
    driver.run()
    if ending == "chunk":
        core.chunk(model.id, {"type": "finish", "kind": "aborted"})
    elif ending == "raise":
        core.fail(model.id, ErrorInfo("the signal was aborted", "AbortError"))
    elif ending == "end":
        core.end(model.id)
    else:
        core.fail(model.id, ErrorInfo.from_exception(model_failure_error()))
    driver.run()
    return driver


def model_failure_error() -> BaseException:
    """A provider failure as an adapter raises it (an exception carrying LlmFailure facts)."""
    from machine.runtime import ModelFailure
    return ModelFailure("connection reset", "NETWORK_ERROR")


@pytest.mark.parametrize("ending", ["chunk", "raise", "end"])
def test_D15_a_stream_the_cancel_stops_keeps_its_text_and_reasoning(ending: str) -> None:
    """D15, R9.7: however the stopped stream ends, the non-blank text and reasoning it
    delivered (tool calls left out) are the step's assistant message marked interrupted,
    with its usage and every chunk as sources, before step/end; the turn ends aborted."""
    def run(core: AgentCore) -> list[Any]:
        driver = _cancelled_stream(core, DELIVERED, ending)
        types = [e.type for e in core.log.events]
        assert types[types.index("assistant/message"):] == ["assistant/message", "step/end",
                                                            "turn/end"]
        (event,) = [e for e in core.log.events if e.type == "assistant/message"]
        kept = thaw(event.data)
        assert kept["interrupted"] is True and kept["usage"] == {"outputTokens": 3}
        assert kept["message"]["content"] == [{"type": "reasoning", "text": "think"},
                                              {"type": "text", "text": "Hello "},
                                              {"type": "text", "text": "world"}]
        assert kept["message"]["source"] == {"kind": "model", "provider": "p", "model": "m"}
        chunks = [e.seq for e in core.log.events if e.type == "assistant/chunk"]
        assert list(event.source_event_seqs or ()) == chunks
        assert core.log.events[-1].data["reason"] == {"kind": "aborted"}
        released = [o for o in driver.outputs if isinstance(o, Control) and o.kind == "release"]
        assert len(released) == (1 if ending == "chunk" else 0)
        if released:                             # the release comes first, then the message
            outputs = list(driver.outputs)
            kept_at = next(i for i, o in enumerate(outputs) if isinstance(o, Durable)
                           and o.event.type == "assistant/message")
            assert outputs.index(released[0]) < kept_at
        return tokens(driver.outputs)
    both(run, CoreConfig(publish=False, request_options={"provider": "p", "model": "m"}))


@pytest.mark.parametrize(("delivered", "ending"), [
    ([{"type": "tool-call", "id": "c1", "name": "t", "arguments": "{}"}], "chunk"),
    ([{"type": "text", "text": " \t\n\u00a0\u3000\ufeff\u2028"}], "raise"),
    ([{"type": "block", "block": {"type": "image", "url": "https://x/cat.png"}}], "end"),
    ([], "chunk"),
    (DELIVERED, "failure"),
])
def test_D15_nothing_is_kept_without_text_or_when_the_provider_failed(
        delivered: list[Any], ending: str) -> None:
    """D15: only non-blank text and reasoning are kept (blank is what ECMAScript's trim
    removes); a provider failure reported after the cancel is a request failure and keeps
    nothing (R13.1)."""
    def run(core: AgentCore) -> list[Any]:
        driver = _cancelled_stream(core, delivered, ending)
        assert [e for e in core.log.events if e.type == "assistant/message"] == []
        assert core.log.events[-1].data["reason"] == {"kind": "aborted"}
        return tokens(driver.outputs)
    both(run)


def test_D15_blank_is_what_ecmascript_trim_removes_and_nothing_else() -> None:
    """D15: a text of U+001C (Python's isspace, not ECMAScript's trim) is not blank, so it is
    kept, as the original keeps it; U+FEFF (trimmed by ECMAScript, not by isspace) is blank.
    Blocks are kept by their type: a block chunk carrying a text block is text."""
    def run(core: AgentCore) -> list[Any]:
        driver = _cancelled_stream(core, [
            {"type": "text", "text": "\x1c"}, {"type": "reasoning", "text": "\ufeff"},
            {"type": "block", "block": {"type": "text", "text": "a text block"}}], "chunk")
        (event,) = [e for e in core.log.events if e.type == "assistant/message"]
        assert thaw(event.data)["message"]["content"] == [
            {"type": "text", "text": "\x1c"}, {"type": "text", "text": "a text block"}]
        return tokens(driver.outputs)
    both(run)


def test_D15_the_next_request_carries_what_the_user_saw() -> None:
    """D15, L13: the interrupted message is history: the next turn's request holds it between
    the cancelled prompt and the follow-up."""
    def run(core: AgentCore) -> list[Any]:
        driver = _cancelled_stream(core, [{"type": "text", "text": "Roses are red"}], "chunk")
        driver.env.handlers.pop("model")
        driver.env.replies.append(text_reply("violets are blue"))
        core.followup(message("go on", "m2"))
        driver.run()
        request = [o for o in driver.outputs if isinstance(o, Effect) and o.kind == "model"][-1]
        assert [(m.role, thaw(m.content[0])["text"]) for m in request.history or ()] == [
            ("user", "go"), ("assistant", "Roses are red"), ("user", "go on")]
        return tokens(driver.outputs)
    both(run)


def test_D15_L6_an_interrupted_mark_is_true_or_absent() -> None:
    """L6: ``interrupted`` on an assistant/message, when present, is true; the typed view
    reads it (false when absent)."""
    from machine.log import SessionLog
    from machine.payloads import AssistantMessageData
    log = SessionLog()
    log.append("turn/start", {"turn": 1, "trigger": {"kind": "retry"}})
    log.append("step/start", {"turn": 1, "step": 1})
    message = {"id": "a1", "role": "assistant", "content": [{"type": "text", "text": "x"}],
               "source": {"kind": "model", "provider": "p", "model": "m"}}
    for bad in (False, "yes", 1):
        with pytest.raises(InvariantError, match="interrupted, when present, must be true"):
            log.append("assistant/message", {"turn": 1, "step": 1, "message": message,
                                             "interrupted": bad}, surface_op="append")
    event = log.append("assistant/message", {"turn": 1, "step": 1, "message": message,
                                             "interrupted": True}, surface_op="append")
    assert event.data_as(AssistantMessageData).interrupted is True
    plain = log.append("assistant/message", {"turn": 1, "step": 1, "message": message},
                       surface_op="append")
    assert plain.data_as(AssistantMessageData).interrupted is False


def test_D16_P3_an_append_marked_ignorable_is_committed_and_output_with_its_mark() -> None:
    """D16, P3, P9: the append input's ``ignorable`` reaches the log and the durable output;
    on a core type it is refused like any bad envelope (L3), nothing appended."""
    def run(core: AgentCore) -> list[Any]:
        driver = driven(core, ScriptedEnvironment())
        core.feed(input_from_json({"in": "append", "type": "x-test/state", "data": {"n": 1},
                                   "ignorable": True}))
        with pytest.raises(InvariantError, match="cannot be ignorable"):
            core.append("user/message", {"id": "m", "role": "user", "content": [],
                                         "source": {"kind": "user"}},
                        surface_op="append", ignorable=True)
        driver.run()
        (durable,) = [o for o in driver.outputs if isinstance(o, Durable)]
        assert durable.to_json() == {"out": "event", "type": "x-test/state", "seq": 0,
                                     "data": {"n": 1}, "ignorable": True}
        return tokens(driver.outputs)
    both(run)
    with pytest.raises(CodecError, match="ignorable: must be true, or omitted"):
        input_from_json({"in": "append", "type": "x/y", "data": {}, "ignorable": 1})


# --------------------------------------------------------------------------
# P14: observers that fail; P15: internal yields
# --------------------------------------------------------------------------


def test_P14_observer_inputs_change_nothing_at_any_position_even_after_teardown() -> None:
    """P14: feeding {"in":"observer"} (throw or veto) after every output gives exactly the
    outputs of the same run without it, machine and model; it is accepted after teardown."""
    def run(core: AgentCore, with_observers: bool) -> list[Any]:
        env = ScriptedEnvironment(replies=[calls_reply(("c1", "t")), text_reply("done")])
        driver = driven(core, env)
        if with_observers:
            def observe(_output: Output) -> None:
                core.feed(Observer("throw"))
                core.feed(Observer("veto"))
            driver.on(observe)
        core.followup(message("go", "m1"))
        driver.run()
        core.dispose()
        driver.run()
        core.feed(Observer("throw"))
        return [o.to_json() for o in driver.outputs]
    for make in IMPLEMENTATIONS.values():
        assert run(make(CONFIG), True) == run(make(CONFIG), False)


@pytest.mark.parametrize("value", [{"in": "observer"}, {"in": "observer", "action": "raise"},
                                   {"in": "observer", "action": "throw", "at": 3}])
def test_P14_a_malformed_observer_input_is_refused_by_the_decoder(value: dict[str, Any]) -> None:
    with pytest.raises(CodecError):
        input_from_json(value)


def test_P15_an_admission_aborted_at_running_appends_its_context_before_the_dequeue() -> None:
    """P15, R7.5: with the admission aborted by a running observer (keepInbox, so staged
    context is kept for the rejected path), the rejected appends come before the claimed
    item's dequeue notice, and the rejected-admission tick after it, as in the original."""
    def run(core: AgentCore) -> list[Any]:
        driver = driven(core, ScriptedEnvironment())

        def at_running(output: Output) -> None:
            if isinstance(output, Live) and output.event.type == "agent/status" \
                    and output.event.payload["status"] == "running":
                core.inject(message("ctx", "c1"))
                core.cancel({"kind": "user"}, keep_inbox=True)
        driver.on(at_running)
        core.followup(message("go", "m1"))
        driver.run()
        return tokens(driver.outputs)
    order = both(run)
    start = order.index("agent/status")
    assert order[start:start + 6] == ["agent/status", "agent/cancel-requested", "abort",
                                      "[user/message]", "agent/inbox/dequeue", "{tick}"]
