"""Tests added to kill surviving mutants in the value and log modules (specs/ASSURANCE.md,
"Mutation score"): machine/jsonvalue.py, log.py, events.py, vocabulary.py.

Each test asserts behaviour the specification states (specs/vocabulary.md, log.md)
and is named after the rule it checks. They cover outcomes that the other tests
exercised without asserting: a log snapshot's bounds and display, error paths of
the derived-history walk, a check's verdict not outliving a rule registration,
open extension declarations, and the problem texts of two decoders. The mutants
judged equivalent are listed with their reasons in
specs/mutation/equivalent-values.md; the ones these tests kill in
specs/mutation/killed-values.txt.
"""

from __future__ import annotations

from typing import Any

import pytest

from machine.errors import InvariantError, ValidationError
from machine.events import Event
from machine.jsonvalue import FrozenDict, FrozenList, canonical_json, freeze
from machine.log import SessionLog, derive_history
from machine.vocabulary import (
    ErrorInfo,
    SettleReason,
    block_problem,
    register_block_type,
    register_source_kind,
    source_problem,
    user_message,
)


def _clock() -> float:
    return 1000


def _user(id_: str) -> dict[str, Any]:
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": id_}],
            "source": {"kind": "user"}}


# --------------------------------------------------------------------------
# L1 / L13: snapshots and history views never change, whatever is appended later
# --------------------------------------------------------------------------


def test_L1_events_snapshot_index_past_its_end_raises_even_after_later_appends() -> None:
    log = SessionLog(clock=_clock)
    log.append("user/message", _user("u0"), surface_op="append")
    snapshot = log.events
    log.append("user/message", _user("u1"), surface_op="append")
    assert len(snapshot) == 1
    assert snapshot[0].seq == 0 and snapshot[-1].seq == 0
    with pytest.raises(IndexError):
        snapshot[1]  # the event appended after the snapshot is not part of it
    with pytest.raises(IndexError):
        snapshot[-2]
    assert list(snapshot) == [log[0]]


def test_L13_history_view_index_past_its_end_raises_even_after_later_appends() -> None:
    log = SessionLog(clock=_clock)
    log.append("user/message", _user("u0"), surface_op="append")
    view = log.history(len(log))
    log.append("user/message", _user("u1"), surface_op="append")
    assert [m.id for m in view] == ["u0"]
    with pytest.raises(IndexError):
        view[1]


def test_L13_history_view_repr_shows_its_messages_like_a_tuple() -> None:
    log = SessionLog(clock=_clock)
    for id_ in ("u0", "u1", "u2"):
        log.append("user/message", _user(id_), surface_op="append")
    view = log.history(len(log))
    assert repr(view) == repr(tuple(view))
    assert repr(log.events) == repr(tuple(log.events))
    assert repr(log.history(0)) == "()"


# --------------------------------------------------------------------------
# V8 (with L13): the derived-history walk names the offending field of a bad event
# --------------------------------------------------------------------------


def test_V8_derive_history_of_a_malformed_user_message_names_the_data_field() -> None:
    bad = Event("user/message", 0, 0, FrozenDict({**_user("u0"), "id": ""}), "append")
    with pytest.raises(ValidationError) as caught:
        derive_history([bad])
    assert caught.value.path == "data.id"
    assert caught.value.problem == "must be a non-empty string"


def test_V8_derive_history_of_a_malformed_enclosed_message_names_data_message() -> None:
    message = {**_user("u0"), "role": "robot"}
    bad = Event("steering/message", 0, 0, FrozenDict({"turn": 1, "message": message}), "append")
    with pytest.raises(ValidationError) as caught:
        derive_history([bad])
    assert caught.value.path == "data.message.role"


def test_V8_derive_history_of_a_well_formed_event_projects_it() -> None:
    good = Event("user/message", 0, 0, FrozenDict(_user("u0")), "append")
    assert derive_history([good]) == (user_message("u0", "u0"),)


# --------------------------------------------------------------------------
# L10 / L2: a check's verdict does not outlive a rule registration
# --------------------------------------------------------------------------


def test_L10_rule_registered_after_a_check_applies_to_the_next_commit() -> None:
    log = SessionLog(clock=_clock)
    data = FrozenDict({"k": 1})
    log.check("x/ext", data)  # no rule yet: anything goes
    log.register_rule("x/ext", lambda _log, _type, _data: "refused by the new rule")
    with pytest.raises(InvariantError) as caught:
        log.commit("x/ext", data)
    assert caught.value.rule == "L10"
    assert "refused by the new rule" in str(caught.value)
    assert len(log) == 0


def test_L10_extension_rule_is_consulted_again_at_commit_after_a_check() -> None:
    log = SessionLog(clock=_clock)
    answers = iter([None, "changed its mind"])
    log.register_rule("x/ext", lambda _log, _type, _data: next(answers))
    data = FrozenDict({"k": 1})
    log.check("x/ext", data)
    with pytest.raises(InvariantError) as caught:
        log.append("x/ext", data)
    assert caught.value.rule == "L10" and len(log) == 0


# --------------------------------------------------------------------------
# V3 / V4: a declaration without a check leaves the type (kind) open
# --------------------------------------------------------------------------


def test_V3_block_type_declared_without_a_check_has_no_problem() -> None:
    register_block_type("x-mutation-open-block")
    assert block_problem(freeze({"type": "x-mutation-open-block", "any": [1]})) is None


def test_V4_source_kind_declared_without_a_check_has_no_problem() -> None:
    register_source_kind("x-mutation-open-kind")
    assert source_problem(freeze({"kind": "x-mutation-open-kind", "any": {"a": 1}})) is None


# --------------------------------------------------------------------------
# V8 / V15 / V20: decoders say what shape they expected (problem texts pinned as in
# tests/test_mutation_gaps.py: they reach users through payloads and verdicts)
# --------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["error", "payload.error"])
def test_V15_V8_error_info_decoder_states_the_expected_shape(path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ErrorInfo.from_json(5, path)
    assert (caught.value.path, caught.value.problem) == (
        path, "must be a mapping {name?, message, code?, causes?, failure?}")


@pytest.mark.parametrize("path", ["reason", "payload.reason"])
def test_V20_V8_settle_reason_decoder_states_the_expected_shape(path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        SettleReason.from_json("completed", path)
    assert (caught.value.path, caught.value.problem) == (path, "must be a mapping {kind}")


def test_V1_canonical_json_sorts_keys_and_keeps_non_ascii_text_unescaped() -> None:
    # canonical_json (machine/jsonvalue.py): sorted keys, no spaces, characters as they are.
    assert canonical_json({"é": "ü ☃", "a": [1, 2.5]}) == '{"a":[1,2.5],"é":"ü ☃"}'


def test_L3_L14_a_seeded_event_whose_source_seqs_name_a_later_event_is_rejected() -> None:
    # L14: seeds are replayed through the same checks as appends, sourceEventSeqs included.
    message = {"id": "u1", "role": "user", "content": [{"type": "text", "text": "hi"}],
               "source": {"kind": "user"}}
    seed = Event("user/message", 0, 1, freeze(message), "append", FrozenList([3]))
    with pytest.raises(InvariantError, match=r"seed event at seq 0: .*sourceEventSeqs entry 3") \
            as caught:
        SessionLog([seed])
    assert caught.value.rule == "L3"
