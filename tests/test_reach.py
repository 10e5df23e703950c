"""The meters of `machine.checking.reach`: the R19 row of each position, and the rule families a run
exercises. The differential test and the explorer count their reach with them, so a meter
that misnames a position would make their coverage claims wrong: each is pinned here on
runs whose rows are known from the matrix (R19) itself.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from machine.checking.reach import FAMILIES, FamilyTracker, PositionTracker, command_kind
from machine.checking.scripted import Driver, ScriptedEnvironment, calls_reply, model_failure, ok_result
from machine.core import AgentCore, CoreConfig
from machine.io import Cancel, Control, Durable, Effect, Live, Output, Send
from machine.vocabulary import INJECT, STEER


def msg(message_id: str, kind: str = "user") -> dict[str, Any]:
    source: dict[str, Any] = {"kind": kind} if kind == "user" else {"kind": "plugin", "plugin": "p"}
    return {"id": message_id, "role": "user", "content": [{"type": "text", "text": message_id}],
            "source": source}


def token(output: Output) -> str:
    if isinstance(output, Durable):
        return output.event.type
    if isinstance(output, Live):
        return output.event.type.removeprefix("agent/")
    if isinstance(output, Effect):
        return "{" + output.kind + "}"
    assert isinstance(output, Control)
    return output.kind


class Metered:
    """A scripted run with both meters attached; *act(output, run)* may issue commands."""

    def __init__(self, *replies: Any, publish: bool = False, tool_modes: dict[str, Any] | None = None,
                 max_parallel: int = 1) -> None:
        config = CoreConfig(request_options={"provider": "p", "model": "m"}, publish=publish,
                            tool_modes=tool_modes or {}, max_parallel_tool_calls=max_parallel)
        self.core = AgentCore(config)
        self.env = ScriptedEnvironment(replies=list(replies))
        self.driver = Driver(self.core, self.env)
        self.positions = PositionTracker(self.core)
        self.families = FamilyTracker(tool_modes=config.tool_modes, max_parallel=max_parallel)
        self.rows: list[tuple[str, int | None]] = []
        self.acts: list[Callable[[Output, Metered], None]] = []
        self.driver.on(self._observe)

    def _observe(self, output: Output) -> None:
        self.rows.append((token(output), self.positions.output(output)))
        self.families.output(output)
        for act in self.acts:
            act(output, self)

    def command(self, item: Any) -> None:
        window_open = self.core.accepts_next_step
        self.core.feed(item)
        self.positions.command(item)
        self.families.input(item, window_open=window_open)

    def run(self) -> Metered:
        self.driver.run()
        return self

    def row_of(self, name: str, nth: int = 1) -> int | None:
        return [row for tok, row in self.rows if tok == name][nth - 1]


def once(predicate: Callable[[Output], bool], action: Callable[[Metered], None]
         ) -> Callable[[Output, Metered], None]:
    fired = [False]

    def act(output: Output, run: Metered) -> None:
        if not fired[0] and predicate(output):
            fired[0] = True
            action(run)
    return act


def is_(name: str) -> Callable[[Output], bool]:
    return lambda o: token(o) == name


def test_R19_rows_of_a_plain_turn() -> None:
    run = Metered(publish=True)
    run.command(Send(msg("go"), {"target": "next-turn", "wakeup": True}))
    run.run()
    assert run.rows == [
        ("session/created", 26), ("created", 26), ("session-start", 26), ("{tick}", 1),
        ("inbox/enqueue", 1), ("status", 2), ("{prompt-submit}", 3), ("inbox/dequeue", 3),
        ("turn/start", 5), ("user/message", 6), ("{step}", 8), ("{system-prompt}", 10),
        ("step/start", 11), ("{request}", 11), ("request/header", 12), ("{model}", 12),
        ("assistant/chunk", 12), ("assistant/chunk", 12), ("assistant/message", 13),
        ("step/end", 15), ("{turn-stopping}", 16), ("turn/end", 19), ("{flush}", 20),
        ("settled", 21), ("status", 23)]


def test_R19_rows_of_drains_tell_the_inherited_rest_top_and_end_of_step_drains_apart() -> None:
    run = Metered(calls_reply(("c1", "t")), "done")
    run.acts.append(once(is_("{prompt-submit}"), lambda r: r.command(Send(msg("a", "p"), INJECT))))
    run.acts.append(once(is_("{step}"), lambda r: r.command(Send(msg("s"), STEER))))
    run.acts.append(once(is_("tool/call"), lambda r: r.command(Send(msg("b", "p"), INJECT))))
    run.command(Send(msg("go"), {"target": "next-turn", "wakeup": True}))
    run.run()
    rows = [(tok, row) for tok, row in run.rows if tok in (
        "user/message", "inbox/dequeue", "steering/message")]
    assert rows == [
        ("inbox/dequeue", 3),                       # the claimed prompt
        ("user/message", 6),                        # the prompt (R8.3.2)
        ("user/message", 7),                        # 'a', staged during the admission
        ("inbox/dequeue", 9), ("steering/message", 9),  # 's', staged at {step}
        ("user/message", 14)]                       # 'b', staged during the batch


def test_R19_rows_of_a_cancel_and_a_rejected_admission() -> None:
    run = Metered()
    run.acts.append(once(is_("status"), lambda r: r.command(Cancel({"kind": "user"}))))
    run.command(Send(msg("go"), {"target": "next-turn", "wakeup": True}))
    run.command(Send(msg("q"), {"target": "next-turn", "wakeup": False}))
    run.run()
    assert run.rows[3:] == [
        ("status", 2), ("cancel-requested", 24), ("inbox/discard", 25), ("abort", 25),
        ("inbox/dequeue", 3), ("{tick}", 22), ("status", 23)]


def test_R19_rows_of_failures_and_of_teardown() -> None:
    run = Metered(model_failure("down", "UNAVAILABLE"))
    run.env.handlers["flush"] = lambda e: ("raise", model_failure("disk", "EIO"))
    run.command(Send(msg("go"), {"target": "next-turn", "wakeup": True}))
    run.run()
    assert run.row_of("{request-error}") == 17
    assert run.row_of("error", 1) == 18 and run.row_of("error", 2) == 20
    assert run.row_of("warning") == 20
    run.core.dispose()
    run.run()
    assert run.rows[-2:] == [("disposed", 27), ("session/disposed", 27)]


def test_command_kind_names_the_matrix_column() -> None:
    assert command_kind(Send(msg("a"), {"target": "next-turn", "wakeup": False})) == "quiet"
    assert command_kind(Send(msg("a"), STEER)) == "steer"
    assert command_kind(Cancel({"kind": "parent"}, keep_inbox=True)) == "cancel-keepInbox"
    assert command_kind(Cancel({"kind": "nope"})) is None
    assert command_kind(Send(msg("a"), {"target": "elsewhere"})) is None


def test_families_of_a_parallel_pool_larger_than_its_limit() -> None:
    run = Metered(calls_reply(("c1", "p"), ("c2", "p"), ("c3", "p")), "done",
                  tool_modes={"p": "parallel"}, max_parallel=2)
    run.env.tool_results = {"c1": ok_result()}
    run.command(Send(msg("go"), {"target": "next-turn", "wakeup": True}))
    run.run()
    assert {"R10", "R10.2", "R10.2-limit", "R12.5"} <= run.families.reached
    assert "R10.7" not in run.families.reached


def test_families_of_two_cancels_of_one_turn_and_a_keep_inbox_cancel() -> None:
    run = Metered()

    def cancel_twice(r: Metered) -> None:
        r.command(Cancel({"kind": "user"}))
        r.command(Cancel({"kind": "parent"}))
    run.acts.append(once(is_("{step}"), cancel_twice))
    run.command(Send(msg("go"), {"target": "next-turn", "wakeup": True}))
    run.run()
    assert {"R16", "R16.3", "R15.1"} <= run.families.reached
    assert "R16.5" not in run.families.reached
    again = Metered()
    again.acts.append(once(is_("{step}"), lambda r: r.command(Cancel({"kind": "user"}, True))))
    again.command(Send(msg("go"), {"target": "next-turn", "wakeup": True}))
    again.run()
    assert "R16.5" in again.families.reached and "R16.3" not in again.families.reached
    assert set(run.families.reached) <= set(FAMILIES)


def _families_of(configuration: str, *path: tuple[str, ...]) -> set[str]:
    """The families the explorer's *path* in *configuration* (after its prefix) exercised,
    each decision taken once every output before it has been pulled, and every output
    after the last one pulled."""
    from machine.checking.search import CONFIGURATIONS
    explorer = CONFIGURATIONS[configuration].explorer(with_model=False)
    node = explorer.replay(explorer.prefix)
    for action in (*path, None):
        while explorer.pull(node) is not None:
            pass
        if action is not None:
            explorer.apply(node, action)
    return node.families.reached


def test_families_of_a_failed_turn_s_recovery_cancelled_before_and_after_its_retry() -> None:
    """R13.2.3: a retry authorized after the cancel aborted the signal, not before; R13.5
    (D2): a cancel through the failed turn's flush with the retry pending, not without one;
    R13.4: the retry run's failure recovered with the first as a prior failure."""
    late = _families_of("recovering", ("cmd", "cancel"), ("ans", "request-error", "retry"))
    assert "R13.2.3" in late and "R13.5-flush" not in late
    flushing = _families_of("recovering", ("ans", "request-error", "retry"), ("cmd", "cancel"))
    assert "R13.5-flush" in flushing and "R13.2.3" not in flushing
    assert "R13.5-flush" not in _families_of("recovering", ("ans", "request-error", "none"),
                                             ("cmd", "cancel"))
    chain = _families_of("recovering", ("ans", "request-error", "retry"),
                         ("macro", "to:model"), ("ans", "model", "fail"))
    assert {"R13.3", "R13.4-chain"} <= chain
    assert "R13.4-chain" not in _families_of("recovering", ("ans", "request-error", "retry"),
                                             ("macro", "to:model"), ("ans", "model", "text"))


def test_families_of_a_cancel_after_a_dispose_and_of_two_cancels() -> None:
    """R16.3: a later cancel of an activity a dispose aborted, not one a cancel aborted."""
    assert {"R16.3", "R16.3-dispose"} <= _families_of("turn", ("cmd", "dispose"),
                                                      ("cmd", "cancel"))
    twice = _families_of("turn", ("cmd", "cancel"), ("cmd", "dispose"))
    assert "R16.3-dispose" not in twice
