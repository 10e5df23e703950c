"""The four explicit machines (machine/machines/): declaration, compiled table, behaviour.

Each machine is declared once with the ``transitions`` library and dispatched
from a table compiled from that declaration. These tests prove that the two
agree on every (state, trigger) pair under every valuation of the guards,
that every state is reachable and every trigger is fired by somebody, and
that the Inbox and Outbox keep the FIFO and counting rules the spec states.
"""

from __future__ import annotations

import inspect
import itertools
import re
import typing
from collections import deque
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transitions.core import MachineError

from machine.cli import diagrams
from machine.cli import main as cli
from machine.machines import Inbox, Lifecycle, Outbox, Window, inbox, lifecycle, outbox, table, window
from machine.machines.table import Row, Table, TransitionError, compile_table, declared_machine, step
from machine.vocabulary import Message, user_message

MODULES: dict[str, ModuleType] = {m.NAME: m for m in (inbox, outbox, window, lifecycle)}
CORE_SOURCE = "\n".join(path.read_text(encoding="utf-8") for path in sorted(
    (Path(__file__).resolve().parent.parent / "machine" / "core").glob("*.py")))
FAST = settings(max_examples=150, deadline=None)


def guard_names(rows: tuple[Row, ...]) -> tuple[str, ...]:
    names: dict[str, None] = {}
    for row in rows:
        for name in (*row.guards, *row.unless):
            names[name] = None
    return tuple(names)


def triggers(module: ModuleType) -> tuple[str, ...]:
    return tuple(dict.fromkeys(row.trigger for row in module.ROWS))


def valuations(names: tuple[str, ...]) -> Iterator[dict[str, bool]]:
    for values in itertools.product((False, True), repeat=len(names)):
        yield dict(zip(names, values, strict=True))


def guard_model(valuation: Mapping[str, bool]) -> Any:
    """A ``transitions`` model whose guard methods return the chosen valuation."""
    methods = {name: (lambda self, value=value: value) for name, value in valuation.items()}
    return type("GuardModel", (), methods)()


def declared_outcome(module: ModuleType, valuation: Mapping[str, bool], state: str,
                     trigger: str) -> tuple[str, str | None]:
    model = guard_model(valuation)
    machine = declared_machine(module.NAME, module.STATES, module.ROWS, module.INITIAL, model=model)
    machine.set_state(state, model=model)
    try:
        fired = getattr(model, trigger)()
    except MachineError:
        return ("disallowed", None)
    if not fired:
        assert model.state == state
        return ("no guard holds", None)
    return ("to", str(model.state))


def table_outcome(compiled: Table, name: str, state: str, trigger: str,
                  valuation: Mapping[str, bool] | None) -> tuple[str, str | None]:
    try:
        return ("to", step(compiled, name, state, trigger, valuation))
    except TransitionError as error:
        assert error.code == "ILLEGAL_TRANSITION"
        return ("disallowed", None) if (state, trigger) not in compiled else ("no guard holds", None)


# --------------------------------------------------------------------------
# Declaration vs compiled table
# --------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(MODULES))
def test_table_agrees_with_declared_machine_on_every_state_trigger_and_guard_valuation(name: str) -> None:
    module = MODULES[name]
    names = guard_names(module.ROWS)
    checked = 0
    for valuation in valuations(names):
        for state in module.STATES:
            for trigger in triggers(module):
                expected = declared_outcome(module, valuation, state, trigger)
                assert table_outcome(module.TABLE, module.NAME, state, trigger, valuation) == expected, (
                    f"{name}: {trigger!r} in {state!r} under {valuation}")
                if not names:  # guard-free machines are dispatched without a valuation
                    assert table_outcome(module.TABLE, module.NAME, state, trigger, None) == expected
                checked += 1
    assert checked == 2 ** len(names) * len(module.STATES) * len(triggers(module))


@pytest.mark.parametrize("name", sorted(MODULES))
def test_compiled_table_is_exactly_the_declared_rows(name: str) -> None:
    module = MODULES[name]
    assert compile_table(module.declared()) == module.TABLE
    rebuilt: dict[tuple[str, str], list[tuple[tuple[str, ...], tuple[str, ...], str]]] = {}
    for row in module.ROWS:
        rebuilt.setdefault((row.source, row.trigger), []).append((row.guards, row.unless, row.dest))
    assert {key: tuple(value) for key, value in rebuilt.items()} == module.TABLE
    for (source, _trigger), alternatives in module.TABLE.items():
        assert source in module.STATES
        assert all(dest in module.STATES for _, _, dest in alternatives)
    assert module.INITIAL in module.STATES


@pytest.mark.parametrize("name", sorted(MODULES))
def test_guarded_alternatives_end_in_an_unguarded_fallback_or_are_exhaustive(name: str) -> None:
    """Dispatch with a valuation never falls through: some alternative always applies."""
    module = MODULES[name]
    for valuation in valuations(guard_names(module.ROWS)):
        for (state, trigger) in module.TABLE:
            step(module.TABLE, module.NAME, state, trigger, valuation)


def test_step_without_a_valuation_refuses_a_guarded_trigger() -> None:
    guarded: Table = {("s", "t"): ((("g",), (), "u"),)}
    with pytest.raises(TransitionError, match="'t' in 's' is guarded; the guard values are required"):
        step(guarded, "m", "s", "t", None)
    assert step(guarded, "m", "s", "t", {"g": True}) == "u"


def test_step_error_names_machine_trigger_and_state() -> None:
    with pytest.raises(TransitionError) as info:
        step(window.TABLE, window.NAME, "closed", "end_run")
    assert str(info.value) == "window: trigger 'end_run' is not allowed in state 'closed'"


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_state_is_reachable_from_the_initial_state(name: str) -> None:
    module = MODULES[name]
    seen = {module.INITIAL}
    frontier = deque([module.INITIAL])
    while frontier:
        state = frontier.popleft()
        for (source, _trigger), alternatives in module.TABLE.items():
            if source != state:
                continue
            for _, _, dest in alternatives:
                if dest not in seen:
                    seen.add(dest)
                    frontier.append(dest)
    assert seen == set(module.STATES)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_every_state_has_a_way_out(name: str) -> None:
    module = MODULES[name]
    for state in module.STATES:
        assert any(source == state and any(dest != state for _, _, dest in alternatives)
                   for (source, _), alternatives in module.TABLE.items()), f"{name}: {state} is a sink"


@pytest.mark.parametrize("name", ["window", "lifecycle"])
def test_every_declared_trigger_is_fired_by_the_core_and_nothing_else_is(name: str) -> None:
    module = MODULES[name]
    fired = set(re.findall(rf'self\.{name}\.fire\("(\w+)"\)', CORE_SOURCE))
    assert fired == set(triggers(module))


@pytest.mark.parametrize("name", ["window", "lifecycle"])
def test_the_trigger_type_names_exactly_the_declared_triggers(name: str) -> None:
    """R4.3, R4.2: ``fire`` takes the machine's ``Trigger`` literal type, so mypy refuses a
    trigger the table does not declare; the type must name exactly the declared ones."""
    module = MODULES[name]
    assert set(typing.get_args(module.Trigger)) == set(triggers(module))


def test_the_effect_kind_type_names_exactly_the_effect_kinds() -> None:
    """P4: the core requests effects through ``EffectKind``; it names exactly EFFECT_KINDS."""
    from machine.io import EFFECT_KINDS, EffectKind

    assert set(typing.get_args(EffectKind)) == set(EFFECT_KINDS)


@pytest.mark.parametrize(("name", "cls", "uses"), [
    ("inbox", Inbox, ("enqueue", "claim", "discard")),
    ("outbox", Outbox, ("stage", "take", "clear")),
])
def test_every_declared_trigger_is_stepped_by_the_machine_class(name: str, cls: type,
                                                                uses: tuple[str, ...]) -> None:
    module = MODULES[name]
    source = inspect.getsource(cls)
    for trigger in triggers(module):
        assert f'"{trigger}"' in source, f"{name}: trigger {trigger!r} is never stepped"
    stepped = " ".join(re.findall(r"step\(TABLE, NAME, self\.state, [^\n]*", source))
    literals = set(re.findall(r'"(\w+)"', stepped))
    assert literals <= set(triggers(module))
    for method in uses:  # and the core uses every operation of the class
        assert re.search(rf"(self|core)\.{name}\.{method}\(", CORE_SOURCE), \
            f"core never calls {name}.{method}"


def test_to_dot_is_deterministic_and_mentions_every_transition() -> None:
    for module in MODULES.values():
        dot = table.to_dot(module.NAME, module.STATES, module.INITIAL, module.TABLE)
        recompiled = compile_table(module.declared())
        assert dot == table.to_dot(module.NAME, module.STATES, module.INITIAL, recompiled)
        edges = sum(len(alternatives) for alternatives in module.TABLE.values())
        assert dot.count(" -> ") == edges + 1  # + the start arrow
        for row in module.ROWS:
            assert f'"{row.source}" -> "{row.dest}" [label="{row.trigger}' in dot


# --------------------------------------------------------------------------
# Inbox (R4.1, R5.7, R7.1, R7.2, R16.2)
# --------------------------------------------------------------------------


def msg(name: str) -> Message:
    return user_message(name, f"text of {name}")


def test_R4_1_inbox_is_a_fifo_with_its_wakeup_flags() -> None:
    box = Inbox()
    assert (box.state, len(box), box.has_waking) == ("empty", 0, False)
    box.enqueue(msg("q1"), False)
    assert (box.state, box.has_waking) == ("quiet", False)
    box.enqueue(msg("w1"), True)
    box.enqueue(msg("q2"), False)
    assert box.state == "waking"
    assert box.snapshot() == (("q1", False), ("w1", True), ("q2", False))
    assert len(box) == 3


def test_R5_7_R7_2_a_claim_shifts_a_quiet_head_ahead_of_a_waking_item() -> None:
    box = Inbox()
    box.enqueue(msg("q1"), False)
    box.enqueue(msg("w1"), True)
    box.enqueue(msg("q2"), False)
    message, wakeup = box.claim()
    assert (message.id, wakeup) == ("q1", False)         # the quiet head goes first
    assert (box.state, box.has_waking) == ("waking", True)   # w1 still waits
    message, wakeup = box.claim()
    assert (message.id, wakeup) == ("w1", True)
    assert (box.state, box.has_waking, box.snapshot()) == ("quiet", False, (("q2", False),))


def test_R7_1_a_claim_needs_a_waking_item() -> None:
    box = Inbox()
    with pytest.raises(TransitionError):
        box.claim()
    box.enqueue(msg("q1"), False)
    with pytest.raises(TransitionError):
        box.claim()
    assert box.snapshot() == (("q1", False),)             # a refused claim changes nothing


def test_R7_2_waking_counts_follow_claims() -> None:
    box = Inbox()
    box.enqueue(msg("w1"), True)
    box.enqueue(msg("w2"), True)
    assert box.claim()[0].id == "w1"
    assert (box.state, box.has_waking) == ("waking", True)
    assert box.claim()[0].id == "w2"
    assert (box.state, box.has_waking, len(box)) == ("empty", False, 0)


def test_R16_2_inbox_discard_returns_everything_in_fifo_order() -> None:
    box = Inbox()
    assert box.discard() == [] and box.state == "empty"
    for name, wakeup in (("a", False), ("b", True), ("c", False)):
        box.enqueue(msg(name), wakeup)
    assert [m.id for m in box.discard()] == ["a", "b", "c"]
    assert (box.state, len(box), box.has_waking) == ("empty", 0, False)


# --------------------------------------------------------------------------
# Outbox (R4.1, R11.1, R16.2)
# --------------------------------------------------------------------------


def test_R4_1_outbox_stages_steering_and_context_in_one_fifo() -> None:
    box = Outbox()
    box.stage(msg("c1"), False)
    assert (box.state, box.has_steering, box.steering_count) == ("contexts", False, 0)
    box.stage(msg("s1"), True)
    box.stage(msg("c2"), False)
    assert (box.state, box.steering_count, len(box)) == ("steering", 1, 3)
    assert box.snapshot() == (("c1", False), ("s1", True), ("c2", False))


def test_R11_1_take_removes_the_front_item() -> None:
    box = Outbox()
    for name, steering in (("c1", False), ("s1", True), ("c2", False), ("s2", True)):
        box.stage(msg(name), steering)
    taken = []
    states = []
    while len(box):
        message, steering = box.take()
        taken.append((message.id, steering))
        states.append(box.state)
    assert taken == [("c1", False), ("s1", True), ("c2", False), ("s2", True)]
    assert states == ["steering", "steering", "steering", "empty"]
    with pytest.raises(TransitionError):
        box.take()


def test_R11_1_taking_the_last_steering_leaves_contexts() -> None:
    box = Outbox()
    box.stage(msg("s1"), True)
    box.stage(msg("c1"), False)
    assert box.take()[0].id == "s1"
    assert (box.state, box.has_steering, box.steering_count) == ("contexts", False, 0)


def test_R16_2_clear_returns_steering_and_contexts_each_in_fifo_order() -> None:
    box = Outbox()
    assert box.clear() == ([], [])
    for name, steering in (("c1", False), ("s1", True), ("c2", False), ("s2", True), ("c3", False)):
        box.stage(msg(name), steering)
    steered, contexts = box.clear()
    assert [m.id for m in steered] == ["s1", "s2"]
    assert [m.id for m in contexts] == ["c1", "c2", "c3"]
    assert (box.state, len(box), box.steering_count) == ("empty", 0, 0)


# --------------------------------------------------------------------------
# Window and lifecycle
# --------------------------------------------------------------------------


def test_R4_3_the_window_opens_at_claim_and_closes_at_end_of_run_or_rejection() -> None:
    w = Window()

    def is_open() -> bool:  # a call: mypy would keep an asserted w.is_open narrowed across fire()
        return w.is_open
    assert not is_open()
    w.fire("claim")
    assert (w.state, w.is_open) == ("admission", True)
    w.fire("start_run")
    assert (w.state, w.is_open) == ("turn", True)
    w.fire("end_run")
    assert not is_open()
    w.fire("start_run")                                   # a retry run opens it from closed
    assert is_open()
    w.fire("end_run")
    w.fire("claim")
    w.fire("reject")
    assert not is_open()
    with pytest.raises(TransitionError):
        w.fire("reject")


def test_R4_2_lifecycle_busy_spans_the_running_interval() -> None:
    life = Lifecycle()
    path: list[lifecycle.Trigger] = [
        "request_wake", "claim", "admit", "begin_step", "assemble", "request", "stream",
        "run_tools", "end_step", "stop_turn", "close", "flush", "go_idle"]
    busy = []
    for trigger in path:
        life.fire(trigger)
        busy.append((life.state, life.busy, life.in_turn))
    assert busy[0] == ("wake_pending", False, False)
    assert all(b for _, b, _ in busy[1:-1])
    assert busy[-1] == ("idle", False, False)
    assert [s for s, _, t in busy if t] == ["run_start", "step_hook", "assembly", "requesting",
                                            "streaming", "tools", "end_of_step", "turn_stopping"]


# --------------------------------------------------------------------------
# Properties: the coarse state always describes the contents
# --------------------------------------------------------------------------


def inbox_state(items: list[tuple[str, bool]]) -> str:
    return "empty" if not items else "waking" if any(w for _, w in items) else "quiet"


def outbox_state(items: list[tuple[str, bool]]) -> str:
    return "empty" if not items else "steering" if any(s for _, s in items) else "contexts"


OPS = st.lists(st.sampled_from(["quiet", "waking", "take", "clear"]), max_size=40)


@FAST
@given(OPS)
def test_R4_1_inbox_state_and_order_match_a_plain_list(ops: list[str]) -> None:
    box, model = Inbox(), []
    for n, op in enumerate(ops):
        if op in ("quiet", "waking"):
            box.enqueue(msg(f"m{n}"), op == "waking")
            model.append((f"m{n}", op == "waking"))
        elif op == "take":
            if any(w for _, w in model):
                message, wakeup = box.claim()
                assert (message.id, wakeup) == model.pop(0)
            else:
                with pytest.raises(TransitionError):
                    box.claim()
        else:
            assert [m.id for m in box.discard()] == [i for i, _ in model]
            model.clear()
        assert box.snapshot() == tuple(model)
        assert box.state == inbox_state(model)
        assert box.has_waking == any(w for _, w in model)


@FAST
@given(OPS)
def test_R11_1_outbox_state_and_order_match_a_plain_list(ops: list[str]) -> None:
    box, model = Outbox(), []
    for n, op in enumerate(ops):
        if op in ("quiet", "waking"):
            box.stage(msg(f"m{n}"), op == "waking")
            model.append((f"m{n}", op == "waking"))
        elif op == "take":
            if model:
                message, steering = box.take()
                assert (message.id, steering) == model.pop(0)
            else:
                with pytest.raises(TransitionError):
                    box.take()
        else:
            steered, contexts = box.clear()
            assert [m.id for m in steered] == [i for i, s in model if s]
            assert [m.id for m in contexts] == [i for i, s in model if not s]
            model.clear()
        assert box.snapshot() == tuple(model)
        assert box.state == outbox_state(model)
        assert box.steering_count == sum(s for _, s in model)


# --------------------------------------------------------------------------
# Diagrams (machine/cli/diagrams.py, specs/machines/)
# --------------------------------------------------------------------------

SPEC_MACHINES = Path(__file__).resolve().parent.parent / "specs" / "machines"


def test_checked_in_dot_files_are_up_to_date_with_the_code() -> None:
    for name, dot in diagrams.dot_sources().items():
        path = SPEC_MACHINES / f"{name}.dot"
        assert path.exists(), f"{path} is missing: run `make diagrams`"
        assert path.read_text(encoding="utf-8") == dot, f"{path} is stale: run `make diagrams`"


def test_checked_in_machine_pages_and_svgs_are_present_and_current() -> None:
    assert diagrams.check(SPEC_MACHINES) == []
    for name in MODULES:
        assert (SPEC_MACHINES / f"{name}.svg").exists(), f"render {name}.svg with `make diagrams`"
        page = (SPEC_MACHINES / f"{name}.md").read_text(encoding="utf-8")
        assert f"({name}.dot)" in page and f"({name}.svg)" in page


def test_dot_sources_cover_every_machine_and_come_from_the_declarations() -> None:
    sources = diagrams.dot_sources()
    assert set(sources) == {*MODULES, "loop"}
    for name, module in MODULES.items():
        assert sources[name] == table.to_dot(module.NAME, module.STATES, module.INITIAL, module.TABLE)
        assert sources[name].startswith(f'digraph "{name}" {{')


def test_R4_13_the_loop_s_graph_is_drawn_and_tabled_beside_the_machines() -> None:
    """`turnstile diagrams` draws the loop's declared graph: every activity a cluster, every
    phase a node, every declared change and start an edge; its page has its table."""
    from machine.core import loop
    dot = diagrams.dot_sources()["loop"]
    assert dot == loop.to_dot() and dot.startswith('digraph "loop" {')
    for kind in loop.KINDS:
        assert f'"cluster_{kind.name.replace("-", "_")}"' in dot
        for p in kind.phases:
            assert f'"{kind.name}.{p.name}" [label="{p.name}"' in dot
            for to in p.goes:
                assert f'"{kind.name}.{p.name}" -> "{kind.name}.{to}";' in dot
            for started in p.starts:
                assert (f'"{kind.name}.{p.name}" -> "{started}.{loop.KIND_OF[started].entry}"'
                        in dot)
    page = (SPEC_MACHINES / "loop.md").read_text(encoding="utf-8")
    assert diagrams.markdown_table("loop") in page
    assert "(loop.dot)" in page and "(loop.svg)" in page and (SPEC_MACHINES / "loop.svg").exists()


def test_markdown_table_lists_every_alternative_in_dispatch_order() -> None:
    text = diagrams.markdown_table("inbox")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    assert len(rows) == sum(len(a) for a in inbox.TABLE.values())
    claims = [row for row in rows if "`claim`" in row]
    assert claims == ["| `waking` | `claim` | `rest_empty` | `empty` |",
                      "| `waking` | `claim` | `rest_has_waking` | `waking` |",
                      "| `waking` | `claim` | otherwise | `quiet` |"]


def diagrams_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    status = cli.main(["diagrams", *argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_diagrams_write_then_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = diagrams_cli(capsys, "--write", str(tmp_path))
    assert status == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{name}.{ext}" for name in (*MODULES, "loop") for ext in ("dot", "md"))
    assert out.count("wrote ") == 10
    assert diagrams_cli(capsys, "--check", str(tmp_path))[0] == 0
    status, out, _ = diagrams_cli(capsys, "--write", str(tmp_path))      # idempotent
    assert (status, out) == (0, "")


def test_diagrams_check_names_stale_missing_and_unknown_files(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    diagrams.write(tmp_path)
    (tmp_path / "window.dot").write_text("digraph window {}\n", encoding="utf-8")
    (tmp_path / "outbox.dot").unlink()
    (tmp_path / "legacy.dot").write_text("digraph legacy {}\n", encoding="utf-8")
    page = tmp_path / "inbox.md"
    page.write_text(page.read_text(encoding="utf-8").replace("`rest_empty`", "`rest_is_empty`"),
                    encoding="utf-8")
    status, _, err = diagrams_cli(capsys, "--check", str(tmp_path))
    assert status == 1
    assert f"{tmp_path / 'window.dot'}: out of date with machine/machines/window.py" in err
    assert f"{tmp_path / 'outbox.dot'}: missing" in err
    assert f"{tmp_path / 'legacy.dot'}: no machine or loop named 'legacy'" in err
    assert f"{tmp_path / 'inbox.md'}: transition table out of date" in err
    assert "lifecycle" not in err


def test_diagrams_write_keeps_the_prose_of_existing_pages(tmp_path: Path) -> None:
    diagrams.write(tmp_path)
    page = tmp_path / "window.md"
    text = page.read_text(encoding="utf-8").replace("## Transition table",
                                                    "Prose by hand.\n\n## Transition table")
    stale = text.replace("| `turn` | `end_run` |  | `closed` |\n", "")
    page.write_text(stale, encoding="utf-8")
    assert diagrams.write(tmp_path) == [page]
    assert page.read_text(encoding="utf-8") == text


def test_diagrams_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert diagrams_cli(capsys, "--check", str(tmp_path / "nope"))[0] == 2
    assert diagrams_cli(capsys, "--check", str(tmp_path), "--write", str(tmp_path))[0] == 2
    (tmp_path / "inbox.md").write_text("# no markers\n", encoding="utf-8")
    status, _, err = diagrams_cli(capsys, "--write", str(tmp_path))
    assert status == 2 and "has no generated-table markers" in err
    status, _, err = diagrams_cli(capsys, "--check", str(tmp_path))
    assert status == 1 and "inbox.md: has no generated transition table" in err


def test_diagrams_without_options_prints_every_dot_source(capsys: pytest.CaptureFixture[str]) -> None:
    status, out, _ = diagrams_cli(capsys)
    assert status == 0
    assert out == "".join(diagrams.dot_sources().values())


@pytest.mark.parametrize(("machine", "trigger", "message"), [
    (Window, "end_run", "window: trigger 'end_run' is not allowed in state 'closed'"),
    (Lifecycle, "close", "lifecycle: trigger 'close' is not allowed in state 'idle'"),
])
def test_R4_a_machine_that_refuses_a_trigger_names_itself_the_trigger_and_its_state(
        machine: Any, trigger: str, message: str) -> None:
    with pytest.raises(TransitionError) as info:
        machine().fire(trigger)
    assert str(info.value) == message
