"""The vocabulary rules V1–V21 (specs/vocabulary.md), value by value.

Each test names the rule it checks. Scenario A3 (a)–(e) of the reference
scenarios is covered at the value level in the `test_a3_*` tests.
"""

from __future__ import annotations

import enum
import json
import math
import operator
import pickle
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any, get_args

import pytest
from hypothesis import given

from machine import vocabulary
from machine.checking.strategies import invalid_user_messages, user_messages
from machine.errors import (
    CodecError,
    DisposedError,
    InvariantError,
    NotJsonCompatibleError,
    NotPicklableError,
    ProtocolError,
    TurnstileError,
    ValidationError,
)
from machine.events import Event
from machine.jsonvalue import (
    Foreign,
    FrozenDict,
    FrozenList,
    Unreadable,
    canonical_json,
    compact_json,
    freeze,
    thaw,
)
from machine.jsonvalue import snapshot as take_snapshot
from machine.log import derive_history
from machine.vocabulary import (
    ALLOW,
    DISPOSED_CAUSE,
    END_ABORTED,
    END_COMPLETED,
    FOLLOWUP,
    INJECT,
    INVALID_CHUNK,
    INVALID_TOOL_RESULT,
    PARENT_CAUSE,
    RETRY_TRIGGER,
    SETTLE_ABORTED,
    SETTLE_COMPLETED,
    STEER,
    USER_CAUSE,
    AgentStatus,
    Allow,
    Block,
    CancelCause,
    ErrorInfo,
    InboxPlacement,
    LlmFailure,
    Message,
    SendOptions,
    SessionStartSource,
    SettleReason,
    ToolResult,
    TurnEndReason,
    TurnTrigger,
    assistant_message,
    block_problem,
    custom_source,
    decision_from_json,
    freeze_content,
    freeze_source,
    model_source,
    plugin_source,
    reasoning,
    register_block_type,
    register_source_kind,
    retry_action_from_json,
    source_problem,
    text,
    tool_call,
    tool_result_block,
    tool_result_message,
    tool_source,
    user_message,
    user_source,
    validate_assistant_message,
    validate_chunk,
    validate_tool_result_message,
    validate_user_message,
)


def _msg(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"id": "m1", "role": "user", "content": [text("hi")],
                            "source": {"kind": "user"}}
    base.update(overrides)
    return base


@pytest.fixture
def registries() -> Iterator[None]:
    """Restore the extension registries after a test that registers (V3, V4)."""
    blocks = dict(vocabulary._block_checks)
    sources = dict(vocabulary._source_checks)
    yield
    vocabulary._block_checks.clear()
    vocabulary._block_checks.update(blocks)
    vocabulary._source_checks.clear()
    vocabulary._source_checks.update(sources)


# --------------------------------------------------------------------------------------------
# V1 JSON-compatible values
# --------------------------------------------------------------------------------------------


class _Color(enum.IntEnum):
    RED = 1


class _Num(float):
    pass


def test_V1_json_values_are_accepted() -> None:
    value: dict[str, Any] = {"a": [None, True, 0, -1.5, "s", {"b": []}], "": {}}
    frozen = freeze(value)
    assert frozen == value
    assert thaw(frozen) == value
    assert json.loads(json.dumps(thaw(frozen))) == value


_cycle_list: list[Any] = []
_cycle_list.append(_cycle_list)
_cycle_dict: dict[str, Any] = {}
_cycle_dict["self"] = _cycle_dict


@pytest.mark.parametrize(("bad", "where"), [
    ({1, 2}, "value.x"),
    (frozenset({1}), "value.x"),
    ((1, 2), "value.x"),
    (b"raw", "value.x"),
    (bytearray(b"raw"), "value.x"),
    (math.nan, "value.x"),
    (math.inf, "value.x"),
    (-math.inf, "value.x"),
    ({1: "non-str key"}, "value.x"),
    (object(), "value.x"),
    (_Color.RED, "value.x"),
    (_Num(1.0), "value.x"),
    (_cycle_list, "value.x[0]"),
    (_cycle_dict, "value.x.self"),
    ([1, [2, math.nan]], "value.x[1][1]"),
    ({"deep": {"er": {3}}}, "value.x.deep.er"),
])
def test_V1_non_json_values_are_refused_with_their_path(bad: Any, where: str) -> None:
    with pytest.raises(NotJsonCompatibleError) as info:
        freeze({"x": bad})
    assert info.value.path == where
    assert isinstance(info.value, ValueError)
    assert info.value.problem in str(info.value)


def test_V1_str_subclass_is_stored_as_plain_str() -> None:
    class Name(str):
        pass

    frozen = freeze({"k": Name("v")})
    assert isinstance(frozen, FrozenDict)
    assert type(frozen["k"]) is str


def test_V1_shared_substructure_is_not_a_cycle() -> None:
    shared = [1]
    assert freeze({"a": shared, "b": shared}) == {"a": [1], "b": [1]}


def test_V1_canonical_json_refuses_nan_and_sorts_keys_without_spaces() -> None:
    with pytest.raises(ValueError):
        canonical_json(float("nan"))
    with pytest.raises(ValueError):
        canonical_json({"a": float("inf")})
    assert canonical_json(freeze({"b": [1, {"d": None, "c": True}], "a": "x"})) == (
        '{"a":"x","b":[1,{"c":true,"d":null}]}')


def test_V1_canonical_json_sorts_keys_and_keeps_non_ascii_text_unescaped() -> None:
    # canonical_json (machine/jsonvalue.py): sorted keys, no spaces, characters as they are.
    assert canonical_json({"é": "ü ☃", "a": [1, 2.5]}) == '{"a":[1,2.5],"é":"ü ☃"}'


class _Items(list):  # type: ignore[type-arg]
    """A list subclass: still a JSON array (V1)."""


class _Key(str):
    """A str subclass: accepted and stored as a plain str (V1)."""


class _ReadOnly(Mapping[str, Any]):
    """A mapping that is neither a dict nor copyable."""

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _frozen_mapping(value: Mapping[str, Any]) -> FrozenDict:
    frozen = freeze(value)
    assert isinstance(frozen, FrozenDict)
    return frozen


def test_V1_list_and_dict_subclasses_are_frozen_as_arrays_and_objects() -> None:
    frozen = _frozen_mapping({"items": _Items([1, {"a": 2}]), "map": OrderedDict(b=[3], a=None)})
    assert frozen == {"items": [1, {"a": 2}], "map": {"b": [3], "a": None}}
    assert type(frozen["items"]) is FrozenList
    assert type(frozen["map"]) is FrozenDict
    assert list(frozen["map"]) == ["b", "a"]


def test_V1_str_subclass_keys_are_stored_as_plain_str() -> None:
    frozen = _frozen_mapping({_Key("a"): _Key("x")})
    assert frozen == {"a": "x"}
    assert [type(key) for key in frozen] == [str]
    direct = FrozenDict({_Key("b"): 1})
    assert direct == {"b": 1}
    assert [type(key) for key in direct] == [str]


def test_V1_a_cycle_is_refused_and_named() -> None:
    cyclic: list[Any] = [{"a": 1}]
    cyclic.append(cyclic)
    with pytest.raises(ValidationError) as info:
        freeze({"x": cyclic}, "data")
    assert (info.value.path, info.value.problem) == ("data.x[1]", "the value contains a cycle")


def test_V1_a_list_shared_twice_is_not_a_cycle() -> None:
    shared = [{"a": 1}]
    assert freeze([shared, shared, {"k": shared}]) == [[{"a": 1}], [{"a": 1}], {"k": [{"a": 1}]}]


# --------------------------------------------------------------------------------------------
# V2 frozen snapshots
# --------------------------------------------------------------------------------------------


def test_V2_frozen_values_are_immutable_and_hashable() -> None:
    frozen = freeze({"a": [1, {"b": 2}]})
    assert isinstance(frozen, FrozenDict)
    inner = frozen["a"]
    assert isinstance(inner, FrozenList)
    with pytest.raises(TypeError):
        frozen["a"] = 1  # type: ignore[index]
    with pytest.raises(TypeError):
        inner[0] = 2  # type: ignore[index]
    assert not hasattr(frozen, "__setitem__")
    assert hash(frozen) == hash(freeze({"a": [1, {"b": 2}]}))


def test_V2_frozen_values_equal_plain_data() -> None:
    frozen = freeze({"a": [1, {"b": [2]}]})
    assert frozen == {"a": [1, {"b": [2]}]}
    assert operator.ne(frozen, {"a": [1, {"b": [2]}]}) is False
    assert FrozenList([1, 2]) == [1, 2]
    assert operator.ne(FrozenList([1, 2]), [1, 2]) is False
    assert FrozenList([1, 2]) != [2, 1]
    assert FrozenList([1]) == (1,)


def test_V2_freeze_copies_plain_data_and_keeps_frozen_containers() -> None:
    source = {"a": [1]}
    frozen = freeze(source)
    source["a"].append(2)
    assert frozen == {"a": [1]}
    assert freeze(frozen) is frozen


def test_V2_frozen_containers_freeze_their_children_whoever_builds_them() -> None:
    child = [1, {"b": 2}]
    direct = FrozenDict({"a": child})
    listed = FrozenList([child])
    child.append(3)
    assert isinstance(direct["a"], FrozenList)
    assert direct == {"a": [1, {"b": 2}]}
    assert listed == [[1, {"b": 2}]]
    with pytest.raises(NotJsonCompatibleError):
        FrozenDict({"a": math.nan})
    with pytest.raises(NotJsonCompatibleError):
        FrozenList([{1}])
    with pytest.raises(NotJsonCompatibleError):
        FrozenDict({1: "x"})  # type: ignore[dict-item]
    assert direct.set("c", [4]) == {"a": [1, {"b": 2}], "c": [4]}
    assert direct == {"a": [1, {"b": 2}]}


def test_V2_canonical_json_is_sorted_and_compact() -> None:
    assert canonical_json(freeze({"b": 1, "a": [True, None]})) == '{"a":[true,null],"b":1}'


def test_V2_frozen_list_inequality_with_other_types() -> None:
    frozen = freeze([1, 2])
    assert frozen != 5
    assert frozen != "12"
    assert frozen != (1, 3)
    assert (frozen != [1, 2]) is False
    assert frozen != [1, 3]


def test_V2_frozen_dict_is_built_from_any_mapping() -> None:
    frozen = FrozenDict(_ReadOnly({"a": 1, "b": "x"}))
    assert frozen == {"a": 1, "b": "x"}
    assert FrozenDict(_ReadOnly({"n": [1, {"m": 2}]})) == {"n": [1, {"m": 2}]}


# --------------------------------------------------------------------------------------------
# V3 content blocks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [
    text("hello"), text(""), reasoning("thinking"), tool_call("c1", "read", '{"p": 1}'),
    tool_result_block("c1", [text("ok")]), tool_result_block("c1", [], is_error=True),
    tool_result_block("c1", [tool_result_block("c0", [text("nested")])]),
    {"type": "x-image", "url": "u", "size": [1, 2]},
    {"type": "text", "text": "extra fields are kept", "cacheControl": {"type": "ephemeral"}},
])
def test_V3_valid_blocks(block: dict[str, Any]) -> None:
    frozen = freeze_content([block], "content")
    assert frozen == [block]


@pytest.mark.parametrize(("block", "problem"), [
    ("text", "must be a mapping"),
    ({"text": "no type"}, "'type'"),
    ({"type": ""}, "'type'"),
    ({"type": 3}, "'type'"),
    ({"type": "text"}, "'text' must be a string"),
    ({"type": "reasoning", "text": 1}, "'text' must be a string"),
    ({"type": "tool-call", "id": "", "name": "n", "arguments": "{}"}, "'id' must not be empty"),
    ({"type": "tool-call", "id": "c", "name": "n", "arguments": {}}, "'arguments'"),
    ({"type": "tool-call", "id": "c", "arguments": "{}"}, "'name'"),
    ({"type": "tool-result", "toolCallId": "c", "content": "x"}, "'content' must be a list"),
    ({"type": "tool-result", "content": []}, "'toolCallId'"),
    ({"type": "tool-result", "toolCallId": "c", "content": [], "isError": False},
     "'isError' may only be present as true"),
    ({"type": "tool-result", "toolCallId": "c", "content": [{"type": "text"}]},
     "content[0]: 'text' must be a string"),
])
def test_V3_invalid_blocks_name_the_problem(block: Any, problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        freeze_content([text("fine"), block], "message.content")
    assert info.value.path == "message.content[1]"
    assert problem in info.value.problem


def test_V3_content_must_be_a_list() -> None:
    for bad in ("text", {"type": "text", "text": "x"}, (text("x"),), None):
        with pytest.raises(ValidationError) as info:
            freeze_content(bad, "message.content")
        assert info.value.path == "message.content"


def test_V3_register_block_type_adds_a_checked_extension(registries: None) -> None:
    assert block_problem(freeze({"type": "x-chart"})) is None  # undeclared: open
    register_block_type("x-chart", lambda b: None if isinstance(b.get("points"), FrozenList)
                        else "'points' must be a list")
    assert block_problem(freeze({"type": "x-chart", "points": [1]})) is None
    assert block_problem(freeze({"type": "x-chart"})) == "'points' must be a list"
    with pytest.raises(ValidationError, match="points"):
        user_message("m", [{"type": "x-chart", "points": 3}])


@pytest.mark.parametrize("core", ["text", "reasoning", "tool-call", "tool-result"])
def test_V3_core_block_types_cannot_be_redeclared(core: str, registries: None) -> None:
    with pytest.raises(ValidationError, match="core block type"):
        register_block_type(core)
    assert block_problem(freeze({"type": core})) is not None


def test_V3_block_type_names_must_be_nonempty_strings(registries: None) -> None:
    for bad in ("", None, 3):
        with pytest.raises(ValidationError):
            register_block_type(bad)  # type: ignore[arg-type]


def test_V3_reasoning_constructor_builds_a_valid_reasoning_block() -> None:
    block = reasoning("thinking")
    assert block == {"type": "reasoning", "text": "thinking"}
    assert block_problem(freeze(block)) is None


def test_V3_tool_result_block_needs_a_non_empty_tool_call_id() -> None:
    block = {"type": "tool-result", "toolCallId": "", "content": []}
    assert block_problem(freeze(block)) == "'toolCallId' must not be empty"
    assert block_problem(freeze({**block, "toolCallId": "c1"})) is None


def test_V3_V8_content_that_is_not_a_list_is_named() -> None:
    error = _validation_error(lambda: freeze_content("hello", "message.content"))
    assert (error.path, error.problem) == ("message.content", "must be a list of content blocks")


@pytest.mark.usefixtures("registries")
def test_V3_block_type_declared_without_a_check_has_no_problem() -> None:
    register_block_type("x-open-block")
    assert block_problem(freeze({"type": "x-open-block", "any": [1]})) is None


@pytest.mark.parametrize("register", [register_block_type, register_source_kind])
def test_V3_V4_V8_registration_errors_name_the_argument(register: Any) -> None:
    argument = "type_name" if register is register_block_type else "kind"
    core_name = "text" if register is register_block_type else "user"
    for bad in ("", 5):
        with pytest.raises(ValidationError) as caught:
            register(bad)
        assert caught.value.path == argument
        assert caught.value.problem == "must be a non-empty string"
    with pytest.raises(ValidationError) as caught:
        register(core_name)
    assert caught.value.path == argument
    assert core_name in caught.value.problem and "core" in caught.value.problem


# --------------------------------------------------------------------------------------------
# V4 sources
# --------------------------------------------------------------------------------------------


def test_V4_core_sources() -> None:
    assert user_source() == {"kind": "user"}
    assert user_source(requestId="r1") == {"kind": "user", "requestId": "r1"}
    assert plugin_source("") == {"kind": "plugin", "plugin": ""}
    assert model_source("p", "m") == {"kind": "model", "provider": "p", "model": "m"}
    assert model_source("p", "m", {"s": 1})["replayState"] == {"s": 1}
    assert tool_source("c1") == {"kind": "tool", "callId": "c1"}
    assert custom_source("x-cron", job="nightly") == {"kind": "x-cron", "job": "nightly"}


@pytest.mark.parametrize(("source", "problem"), [
    ({}, "'kind'"),
    ({"kind": ""}, "'kind'"),
    ({"kind": None}, "'kind'"),
    ({"kind": ["user"]}, "'kind'"),
    ({"kind": {"user": 1}}, "'kind'"),
    ({"kind": "plugin"}, "'plugin' must be a string"),
    ({"kind": "plugin", "plugin": 1}, "'plugin' must be a string"),
    ({"kind": "model", "model": "m"}, "'provider'"),
    ({"kind": "model", "provider": "p"}, "'model'"),
    ({"kind": "tool", "callId": ""}, "'callId' must not be empty"),
    ({"kind": "tool"}, "'callId'"),
])
def test_V4_invalid_sources(source: dict[str, Any], problem: str) -> None:
    with pytest.raises(ValidationError) as info:
        freeze_source(source, "message.source")
    assert info.value.path == "message.source"
    assert problem in info.value.problem


def test_V4_source_must_be_a_mapping() -> None:
    for bad in ("user", None, ["user"]):
        with pytest.raises(ValidationError) as info:
            freeze_source(bad, "message.source")
        assert info.value.path == "message.source"


def test_V4_register_source_kind(registries: None) -> None:
    assert source_problem(freeze({"kind": "x-webhook"})) is None
    register_source_kind("x-webhook", lambda s: None if "hook" in s else "needs 'hook'")
    assert source_problem(freeze({"kind": "x-webhook", "hook": "h"})) is None
    with pytest.raises(ValidationError, match="needs 'hook'"):
        user_message("m", "hi", {"kind": "x-webhook"})
    with pytest.raises(ValidationError):
        register_source_kind("")


@pytest.mark.parametrize("core", ["user", "plugin", "model", "tool"])
def test_V4_core_source_kinds_cannot_be_redeclared(core: str, registries: None) -> None:
    with pytest.raises(ValidationError, match="core source kind"):
        register_source_kind(core, lambda _s: None)


@pytest.mark.parametrize(("build", "path"), [
    (lambda: user_source(x=float("nan")), "source.x"),
    (lambda: plugin_source(5), "source"),  # type: ignore[arg-type]
    (lambda: model_source(1, "m"), "source"),  # type: ignore[arg-type]
    (lambda: tool_source(""), "source"),
    (lambda: custom_source("ext", x={1: 2}), "source.x"),
])
def test_V4_V8_source_constructors_name_the_offending_field(build: Any, path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        build()
    assert caught.value.path == path
    assert str(caught.value) == f"{path}: {caught.value.problem}"


@pytest.mark.usefixtures("registries")
def test_V4_source_kind_declared_without_a_check_has_no_problem() -> None:
    register_source_kind("x-open-kind")
    assert source_problem(freeze({"kind": "x-open-kind", "any": {"a": 1}})) is None


def test_V4_equal_core_sources_are_one_shared_frozen_value() -> None:
    # Why it matters: a long session holds one source per message; equal sources shared
    # keep one object (memory, and objects the cyclic collector walks).
    first = freeze_source({"kind": "model", "provider": "p", "model": "m"}, "message.source")
    again = freeze_source({"kind": "model", "provider": "p", "model": "m"}, "message.source")
    assert again is first
    assert freeze_source(first, "message.source") is first
    assert user_message("a", "hi", {"kind": "user"}).source is (
        user_message("b", "hi", {"kind": "user"}).source)
    # Key order is part of the JSON, so differently ordered sources are not merged.
    ordered = freeze_source({"kind": "plugin", "plugin": "x"}, "message.source")
    reordered = freeze_source({"plugin": "x", "kind": "plugin"}, "message.source")
    assert ordered is not reordered
    assert compact_json(reordered) == '{"plugin":"x","kind":"plugin"}'
    # A field that is not an exact str (a number, JSON, a str subclass) is frozen afresh.
    assert freeze_source({"kind": "user", "n": 1}, "s") is not freeze_source(
        {"kind": "user", "n": 1}, "s")
    assert freeze_source({"kind": "user", "n": True}, "s") == {"kind": "user", "n": True}

    class Loud(str):
        def __hash__(self) -> int:
            raise AssertionError("a caller's str subclass was hashed")
    assert freeze_source({"kind": "user", "tag": Loud("t")}, "s") == {"kind": "user",
                                                                        "tag": "t"}
    # A mapping of the caller's own class is read by freezing it, as any value is.
    class Loose(dict[str, Any]):
        def get(self, *args: Any) -> Any:
            raise AssertionError("a caller's mapping method was called")
    assert freeze_source(Loose(kind="user"), "s") == {"kind": "user"}
    # An invalid source is never shared, and stays invalid when asked again.
    for _ in range(2):
        with pytest.raises(ValidationError, match="'callId' must not be empty"):
            freeze_source({"kind": "tool", "callId": ""}, "message.source")


@pytest.mark.parametrize("fields", [{"plugin": "fs"}, {"callId": "c9"},
                                    {"provider": "p", "model": "m"}],
                         ids=["plugin", "tool", "model"])
def test_V4_valid_sources_of_different_kinds_are_never_merged(fields: dict[str, str]) -> None:
    """A user source may carry any fields, so it can have exactly the other fields of a
    plugin, tool or model source: the two are different sources, whichever is frozen
    first, each time, and as a message's source."""
    kind = {"plugin": "plugin", "callId": "tool", "provider": "model"}[next(iter(fields))]
    for order, first_kind, second_kind in ((0, "user", kind), (1, kind, "user")):
        marked = {name: f"{value}-{order}" for name, value in fields.items()}
        first = freeze_source({"kind": first_kind, **marked}, "message.source")
        for _ in range(2):
            second = freeze_source({"kind": second_kind, **marked}, "message.source")
            assert second == {"kind": second_kind, **marked} and second is not first
            assert freeze_source({"kind": first_kind, **marked}, "s") == first
        message = Message.from_json({"id": "m", "role": "user", "content": [],
                                     "source": {"kind": second_kind, **marked}})
        assert message.source["kind"] == second_kind


def test_V4_sharing_is_bounded_and_skips_extension_kinds(registries: None) -> None:
    for index in range(vocabulary._SHARED_SOURCES_LIMIT + 5):
        freeze_source({"kind": "tool", "callId": f"c{index}"}, "message.source")
    assert 0 < len(vocabulary._SHARED_SOURCES) <= vocabulary._SHARED_SOURCES_LIMIT
    # An extension kind's check may be registered after a source of it was frozen: such a
    # source is checked each time, never taken from what was shared.
    accepted = freeze_source({"kind": "x-later", "v": "1"}, "message.source")
    assert accepted == {"kind": "x-later", "v": "1"}
    register_source_kind("x-later", lambda s: "refused now")
    with pytest.raises(ValidationError, match="refused now"):
        freeze_source({"kind": "x-later", "v": "1"}, "message.source")


# --------------------------------------------------------------------------------------------
# V5 messages
# --------------------------------------------------------------------------------------------


def test_V5_message_fields_and_roles() -> None:
    for role in ("user", "assistant", "system"):
        m = Message.from_json(_msg(role=role))
        assert (m.id, m.role) == ("m1", role)
    m = user_message("u1", "hello")
    assert m.content == [text("hello")] and m.source == {"kind": "user"}
    assert m.text == "hello"


@pytest.mark.parametrize(("value", "path"), [
    (_msg(role="bot"), "message.role"),
    (_msg(role=["user"]), "message.role"),
    (_msg(extra=1), "message"),
    ({"id": "m", "role": "user", "content": []}, "message.source"),
    ("not a mapping", "message"),
])
def test_V5_invalid_messages(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        Message.from_json(value)
    assert info.value.path == path


def test_V5_assistant_message_needs_a_model_source() -> None:
    m = assistant_message("a1", [text("hi"), tool_call("c1", "t")], model_source("p", "m"))
    assert m.role == "assistant"
    assert list(m.tool_calls) == [tool_call("c1", "t")]
    with pytest.raises(ValidationError) as info:
        assistant_message("a1", [], {"kind": "user"})
    assert info.value.path == "message.source.kind"
    with pytest.raises(ValidationError) as info:
        validate_assistant_message(_msg())
    assert info.value.path == "message.role"


def test_V5_tool_result_message_shape() -> None:
    m = tool_result_message("r1", "c1", [text("ok")], is_error=True)
    assert m.role == "user"
    assert m.source == {"kind": "tool", "callId": "c1"}
    assert m.content == [tool_result_block("c1", [text("ok")], is_error=True)]
    assert validate_tool_result_message(m.to_json()) == m
    cases = [
        (_msg(source={"kind": "tool", "callId": "c1"}), "message.content"),
        (_msg(content=[tool_result_block("c2", [])], source={"kind": "tool", "callId": "c1"}),
         "message.content[0].toolCallId"),
        (_msg(content=[tool_result_block("c1", [])]), "message.source.kind"),
        (_msg(content=[tool_result_block("c1", []), text("x")],
              source={"kind": "tool", "callId": "c1"}), "message.content"),
    ]
    for value, path in cases:
        with pytest.raises(ValidationError) as info:
            validate_tool_result_message(value)
        assert info.value.path == path


def test_V5_the_id_is_kept_as_given() -> None:
    m = validate_user_message(_msg(id="caller-minted-7"))
    assert m.id == "caller-minted-7"
    assert validate_user_message(m) is m


def test_V5_tool_result_message_is_not_an_error_by_default() -> None:
    message = tool_result_message("r1", "c1", [{"type": "text", "text": "x"}])
    (block,) = message.to_json()["content"]
    assert "isError" not in block
    flagged = tool_result_message("r2", "c1", [], is_error=True)
    assert flagged.to_json()["content"][0]["isError"] is True


# --------------------------------------------------------------------------------------------
# V6 snapshot on acceptance
# --------------------------------------------------------------------------------------------


def test_V6_mutating_the_callers_message_changes_nothing() -> None:
    content = [{"type": "text", "text": "before", "tags": ["a"]}]
    source = {"kind": "user", "meta": {"n": 1}}
    raw = {"id": "m1", "role": "user", "content": content, "source": source}
    m = validate_user_message(raw)
    snapshot = m.to_json()
    content[0]["text"] = "after"
    content[0]["tags"].append("b")  # type: ignore[attr-defined]
    content.append(text("more"))
    source["meta"]["n"] = 2  # type: ignore[index]
    raw["id"] = "m2"
    assert m.to_json() == snapshot
    assert m.text == "before"


def test_V6_values_built_from_callers_data_are_detached() -> None:
    ctx = _msg(id="c1")
    contexts = [ctx]
    result_content = [text("ok")]
    error = {"name": "E", "details": [1]}
    meta = {"k": [1]}
    result = ToolResult(content=result_content, error=error,  # type: ignore[arg-type]
                        additional_contexts=contexts, meta=meta)  # type: ignore[arg-type]
    allow = decision_from_json({"kind": "allow", "content": result_content,
                                "additionalContexts": contexts})
    source = {"kind": "plugin", "plugin": "p"}
    trigger = TurnTrigger.for_message(source)
    before = (result.to_json(), allow.to_json(), trigger.to_json())
    result_content.append(text("late"))
    error["details"].append(2)  # type: ignore[attr-defined]
    meta["k"].append(2)
    ctx["id"] = "changed"
    contexts.append(_msg(id="c2"))
    source["plugin"] = "q"
    assert (result.to_json(), allow.to_json(), trigger.to_json()) == before


def test_V6_values_are_frozen_dataclasses() -> None:
    m = user_message("m", "x")
    with pytest.raises(AttributeError):
        m.id = "other"  # type: ignore[misc]
    with pytest.raises(AttributeError):
        FOLLOWUP.wakeup = False  # type: ignore[misc]
    assert hash(m) == hash(user_message("m", "x"))


def test_V6_tool_result_error_is_a_frozen_snapshot() -> None:
    error: dict[str, Any] = {"name": "E", "detail": ["a"]}
    result = ToolResult.from_json({"content": [], "error": error})
    error["detail"].append("b")
    error["name"] = "changed"
    assert result.error == {"name": "E", "detail": ["a"]}
    assert isinstance(result.error, FrozenDict)


class _Name(str):
    """A str subclass: a snapshot keeps it as a plain str."""


class _Count(int):
    """An int subclass: not a JSON number (V1), so a snapshot keeps only its name and repr."""


def test_V6_the_snapshot_of_a_value_that_is_not_json_copies_its_structure_and_stands_in_the_rest(
        ) -> None:
    value: dict[Any, Any] = {"name": _Name("x"), _Name("key"): 1, (1, 2): "tuple key",
                             "things": [{3}, _Count(4)]}
    taken = take_snapshot(value)
    assert type(taken) is dict and taken is not value
    assert taken["name"] == "x" and type(taken["name"]) is str
    assert [(k, type(k)) for k in taken] == [("name", str), ("key", str), ((1, 2), tuple),
                                             ("things", str)]
    assert taken[(1, 2)] == "tuple key"
    a_set, a_count = taken["things"]
    assert isinstance(a_set, Foreign) and isinstance(a_count, Foreign)
    assert (repr(a_set), a_set.problem()) == ("{3}", "a set is not JSON-compatible")
    assert (repr(a_count), a_count.problem()) == ("4", "_Count is not a JSON number")


class _Unreadable(type):
    """A metaclass whose instances raise when their class is asked for an attribute."""

    def __getattr__(cls, name: str) -> Any:
        raise RuntimeError("unreadable")


class _Hostile(metaclass=_Unreadable):
    pass


def test_V6_a_value_that_raises_while_its_snapshot_copies_it_stands_as_unreadable_naming_why(
        ) -> None:
    taken = take_snapshot([{1}, _Hostile()])     # not JSON ({1}), then copying it raises
    assert isinstance(taken, Unreadable) and taken.problem == "RuntimeError: unreadable"


def test_V6_a_value_whose_class_raises_when_read_stands_as_unreadable_at_the_top_too() -> None:
    """Not only inside a container: a value whose class raises when asked for an attribute
    (the snapshot asks whether it is an immutable library value) is `Unreadable`, instead of
    the error escaping the call (a regression found by the mutation review, 2026-12-02)."""
    taken = take_snapshot(_Hostile())
    assert isinstance(taken, Unreadable) and taken.problem == "RuntimeError: unreadable"


# --------------------------------------------------------------------------------------------
# V7 well-formed user message (D5)
# --------------------------------------------------------------------------------------------


@given(user_messages())
def test_V7_generated_user_messages_are_well_formed(m: Message) -> None:
    assert validate_user_message(m.to_json()) == m


@given(invalid_user_messages())
def test_V7_malformed_user_messages_raise_naming_the_field(case: tuple[Any, str]) -> None:
    value, path = case
    with pytest.raises(ValidationError) as info:
        validate_user_message(value)
    assert path in info.value.path
    assert str(info.value).startswith(info.value.path)


# Scenario A3 at the value level: each call's validation raises a ValueError naming the problem.

def test_a3_a_non_json_value_in_a_text_block() -> None:
    for bad in ({"a", "b"}, math.nan):
        with pytest.raises(ValueError, match=r"message\.content\[0\]\.text") as info:
            validate_user_message(_msg(content=[{"type": "text", "text": bad}]))
        assert isinstance(info.value, NotJsonCompatibleError)


def test_a3_b_empty_id() -> None:
    with pytest.raises(ValueError, match=r"message\.id: must be a non-empty string"):
        validate_user_message(_msg(id=""))


def test_a3_c_role_assistant() -> None:
    with pytest.raises(ValueError, match=r"message\.role: must be 'user', not 'assistant'"):
        validate_user_message(_msg(role="assistant"))


def test_a3_d_missing_source_or_kind() -> None:
    no_source = _msg()
    del no_source["source"]
    with pytest.raises(ValueError, match=r"message\.source: is required"):
        validate_user_message(no_source)
    with pytest.raises(ValueError, match=r"message\.source: .*'kind'"):
        validate_user_message(_msg(source={"plugin": "p"}))


def test_a3_e_options_without_wakeup() -> None:
    with pytest.raises(ValueError, match=r"options\.wakeup: is required"):
        SendOptions.from_json({"target": "next-turn"})


# --------------------------------------------------------------------------------------------
# V8 validation at construction; errors name path and problem
# --------------------------------------------------------------------------------------------


def test_V8_validation_error_is_a_value_error_with_path_and_problem() -> None:
    error = ValidationError("a.b", "is wrong")
    assert isinstance(error, ValueError) and isinstance(error, TurnstileError)
    assert (error.path, error.problem, str(error)) == ("a.b", "is wrong", "a.b: is wrong")
    assert str(ValidationError("", "only a problem")) == "only a problem"


def test_V8_paths_are_rebased_onto_the_callers_path() -> None:
    with pytest.raises(ValidationError) as info:
        Message.from_json(_msg(id=""), "data.message")
    assert info.value.path == "data.message.id"
    with pytest.raises(NotJsonCompatibleError) as info:
        Message.from_json(_msg(content=[{"type": "text", "text": math.nan}]), "data")
    assert info.value.path == "data.content[0].text"
    bad_failure = {"message": "m", "failure": {"message": "x", "code": 1}}
    with pytest.raises(ValidationError) as info:
        ErrorInfo.from_json(bad_failure, "payload.reason.error")
    assert info.value.path == "payload.reason.error.failure.code"
    with pytest.raises(ValidationError) as info:
        ToolResult.from_json({"content": [], "additionalContexts": [_msg(id="")]}, "r")
    assert info.value.path == "r.additionalContexts[0].id"


def test_V7_V8_a_message_that_is_not_a_mapping_is_refused_stating_the_expected_shape() -> None:
    with pytest.raises(ValidationError) as info:
        Message.from_json(5, "data.message")
    assert str(info.value) == "data.message: must be a mapping {id, role, content, source}"


def test_V23_V8_a_string_with_a_lone_surrogate_is_refused_naming_its_path() -> None:
    with pytest.raises(NotJsonCompatibleError) as info:
        freeze("a\ud800", "name")
    assert str(info.value) == ("name: the string holds a lone surrogate (U+D800 at index 1), "
                               "which UTF-8 JSON cannot represent")


def test_V8_unexpected_fields_are_named_even_with_odd_keys() -> None:
    with pytest.raises(ValidationError, match="unexpected field"):
        Message.from_json({**_msg(), 1: "x", "zz": 2})


def test_V8_nothing_is_modified_on_failure() -> None:
    raw = _msg(content=[text("a"), {"text": "no type"}])
    copy = json.loads(json.dumps(raw))
    with pytest.raises(ValidationError):
        validate_user_message(raw)
    assert raw == copy


def _validation_error(build: Any) -> ValidationError:
    with pytest.raises(ValidationError) as info:
        build()
    return info.value


def _user_data(id_: str) -> dict[str, Any]:
    return {"id": id_, "role": "user", "content": [{"type": "text", "text": id_}],
            "source": {"kind": "user"}}


def test_V8_derive_history_of_a_malformed_user_message_names_the_data_field() -> None:
    """V8 with L13: the derived-history walk names the offending field of a bad event."""
    bad = Event("user/message", 0, 0, FrozenDict({**_user_data("u0"), "id": ""}), "append")
    with pytest.raises(ValidationError) as caught:
        derive_history([bad])
    assert caught.value.path == "data.id"
    assert caught.value.problem == "must be a non-empty string"


def test_V8_derive_history_of_a_malformed_enclosed_message_names_data_message() -> None:
    message = {**_user_data("u0"), "role": "robot"}
    bad = Event("steering/message", 0, 0, FrozenDict({"turn": 1, "message": message}), "append")
    with pytest.raises(ValidationError) as caught:
        derive_history([bad])
    assert caught.value.path == "data.message.role"


def test_V8_derive_history_of_a_well_formed_event_projects_it() -> None:
    good = Event("user/message", 0, 0, FrozenDict(_user_data("u0")), "append")
    assert derive_history([good]) == (user_message("u0", "u0"),)


# --------------------------------------------------------------------------------------------
# V9 errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("error", "code", "bases"), [
    (ValidationError("p", "x"), "INVALID_VALUE", (ValueError,)),
    (NotJsonCompatibleError("p", "x"), "NOT_JSON_COMPATIBLE", (ValidationError, ValueError)),
    (CodecError("p", "x"), "CODEC_ERROR", (ValidationError, ValueError)),
    (InvariantError("L1", "x"), "INVARIANT", ()),
    (ProtocolError("x"), "PROTOCOL_ERROR", ()),
    (DisposedError("x"), "AGENT_DISPOSED", ()),
    (NotPicklableError("x"), "NOT_PICKLABLE", (pickle.PicklingError,)),
])
def test_V9_one_coded_hierarchy(error: TurnstileError, code: str,
                                bases: tuple[type, ...]) -> None:
    assert isinstance(error, TurnstileError)
    assert isinstance(error.code, str) and error.code == code
    for base in bases:
        assert isinstance(error, base)
    assert ErrorInfo.from_exception(error).code == code


def test_V9_a_specific_code_can_be_given() -> None:
    assert TurnstileError("x", code="MINE").code == "MINE"
    assert ValidationError("p", "x", code="MINE").code == "MINE"
    assert TurnstileError("x").code == "TURNSTILE_ERROR"
    assert str(InvariantError("L3", "turn not open")) == "[L3] turn not open"


# --------------------------------------------------------------------------------------------
# V10 send options
# --------------------------------------------------------------------------------------------


def test_V10_presets() -> None:
    assert (FOLLOWUP.target, FOLLOWUP.wakeup) == ("next-turn", True)
    assert (STEER.target, STEER.wakeup) == ("next-step", True)
    assert (INJECT.target, INJECT.wakeup) == ("next-step", False)
    assert SendOptions.from_json({"target": "next-step", "wakeup": False}) == INJECT
    assert SendOptions.from_json(STEER) is STEER


@pytest.mark.parametrize(("value", "path"), [
    ({"target": "next-turn"}, "options.wakeup"),
    ({"wakeup": True}, "options.target"),
    ({"target": "later", "wakeup": True}, "options.target"),
    ({"target": "next-turn", "wakeup": 1}, "options.wakeup"),
    ({"target": "next-turn", "wakeup": True, "contexts": []}, "options"),
    (None, "options"),
    ("followup", "options"),
])
def test_V10_invalid_options(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        SendOptions.from_json(value)
    assert info.value.path == path


@pytest.mark.parametrize("wakeup", [1, "yes", None])
def test_V10_V8_send_options_wakeup_that_is_not_a_bool_is_named(wakeup: Any) -> None:
    error = _validation_error(lambda: SendOptions("next-turn", wakeup))
    assert (error.path, error.problem) == ("options.wakeup", "must be a bool")
    error = _validation_error(
        lambda: SendOptions.from_json({"target": "next-step", "wakeup": wakeup}, "send.options"))
    assert (error.path, error.problem) == ("send.options.wakeup", "must be a bool")


# --------------------------------------------------------------------------------------------
# V11 cancel causes
# --------------------------------------------------------------------------------------------


def test_V11_cancel_causes() -> None:
    assert CancelCause.from_json({"kind": "user"}) == USER_CAUSE
    assert CancelCause.from_json({"kind": "parent"}) == PARENT_CAUSE
    assert CancelCause.from_json({"kind": "disposed"}, allow_disposed=True) == DISPOSED_CAUSE
    assert USER_CAUSE.to_json() == {"kind": "user"}


@pytest.mark.parametrize("value", [
    {"kind": "disposed"}, {"kind": "nobody"}, {"kind": "user", "why": "x"}, {}, None, "user",
])
def test_V11_invalid_causes(value: Any) -> None:
    with pytest.raises(ValidationError):
        CancelCause.from_json(value)


@pytest.mark.parametrize("path", ["cause", "cancel.cause"])
def test_V11_V8_cancel_cause_decoder_states_the_shape_and_reserves_disposed(path: str) -> None:
    for value in ("user", {"kind": "user", "keep": True}, {}):
        error = _validation_error(lambda value=value: CancelCause.from_json(value, path))
        assert (error.path, error.problem) == (path, "must be {kind: 'user'} or {kind: 'parent'}")
    error = _validation_error(lambda: CancelCause.from_json({"kind": "disposed"}, path))
    assert (error.path, error.problem) == (f"{path}.kind", "'disposed' is reserved for dispose()")
    assert CancelCause.from_json({"kind": "disposed"}, path, allow_disposed=True).kind == "disposed"


def test_V11_V8_cancel_cause_kind_outside_the_three_is_named() -> None:
    error = _validation_error(lambda: CancelCause("bogus"))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("cause.kind",
                                           "'bogus' is not 'user', 'parent' or 'disposed'")


# --------------------------------------------------------------------------------------------
# V12 placements, status, session-start sources
# --------------------------------------------------------------------------------------------


def test_V12_enumerations() -> None:
    assert set(get_args(InboxPlacement)) == vocabulary.PLACEMENTS == {"queued", "steering"}
    assert set(get_args(AgentStatus)) == vocabulary.AGENT_STATUSES == {"idle", "running"}
    assert set(get_args(SessionStartSource)) == vocabulary.SESSION_START_SOURCES == {
        "startup", "resume", "clear", "compact"}


# --------------------------------------------------------------------------------------------
# V13 turn triggers
# --------------------------------------------------------------------------------------------


def test_V13_trigger_forms() -> None:
    msg = TurnTrigger.for_message({"kind": "plugin", "plugin": "test"})
    assert msg.to_json() == {"kind": "message", "source": {"kind": "plugin", "plugin": "test"}}
    assert RETRY_TRIGGER.to_json() == {"kind": "retry"}
    inj = TurnTrigger("injection", {"kind": "user"})  # type: ignore[arg-type]
    assert TurnTrigger.from_json(inj.to_json()) == inj


@pytest.mark.parametrize(("value", "path"), [
    ({"kind": "retry", "source": {"kind": "user"}}, "trigger"),
    ({"kind": "message"}, "trigger.source"),
    ({"kind": "message", "source": {"kind": ""}}, "trigger.source"),
    ({"kind": "injection", "source": None}, "trigger.source"),
    ({"kind": "wake", "source": {"kind": "user"}}, "trigger.kind"),
    ({"kind": "message", "source": {"kind": "user"}, "turn": 1}, "trigger"),
    ([], "trigger"),
])
def test_V13_invalid_triggers(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        TurnTrigger.from_json(value)
    assert info.value.path == path


def test_V13_constructor_checks_source_presence() -> None:
    with pytest.raises(ValidationError, match="no source"):
        TurnTrigger("retry", {"kind": "user"})  # type: ignore[arg-type]
    with pytest.raises(ValidationError, match="required"):
        TurnTrigger("message")


@pytest.mark.parametrize("path", ["trigger", "data.trigger"])
def test_V13_V8_turn_trigger_decoder_states_the_expected_shape(path: str) -> None:
    error = _validation_error(lambda: TurnTrigger.from_json("retry", path))
    assert (error.path, error.problem) == (path, "must be a mapping {kind, source}")


# --------------------------------------------------------------------------------------------
# V14 LLM failures
# --------------------------------------------------------------------------------------------


def test_V14_llm_failure_fields() -> None:
    full = LlmFailure("rate limited", "RATE_LIMIT", 429, 1500, "req-1")
    assert full.to_json() == {"message": "rate limited", "code": "RATE_LIMIT", "status": 429,
                              "providerRetryAfterMs": 1500, "requestId": "req-1"}
    assert LlmFailure("m", "C").to_json() == {"message": "m", "code": "C"}
    assert full.with_message("x") == LlmFailure("x", "RATE_LIMIT", 429, 1500, "req-1")
    assert LlmFailure.from_json({"message": "m", "code": "C", "status": None}) == LlmFailure(
        "m", "C")


@pytest.mark.parametrize(("value", "path"), [
    ({"code": "C"}, "failure.message"),
    ({"message": "m"}, "failure.code"),
    ({"message": "m", "code": 5}, "failure.code"),
    ({"message": "m", "code": "C", "status": True}, "failure.status"),
    ({"message": "m", "code": "C", "status": 4.5}, "failure.status"),
    ({"message": "m", "code": "C", "providerRetryAfterMs": math.nan},
     "failure.providerRetryAfterMs"),
    ({"message": "m", "code": "C", "providerRetryAfterMs": "1s"}, "failure.providerRetryAfterMs"),
    ({"message": "m", "code": "C", "requestId": 1}, "failure.requestId"),
    ({"message": "m", "code": "C", "retryable": True}, "failure"),
])
def test_V14_invalid_failures(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        LlmFailure.from_json(value)
    assert info.value.path == path


@pytest.mark.parametrize(("fields", "path", "problem"), [
    ({"message": 1}, "failure.message", "must be a string"),
    ({"code": None}, "failure.code", "must be a string"),
    ({"status": 429.0}, "failure.status", "must be an integer"),
    ({"provider_retry_after_ms": float("inf")}, "failure.providerRetryAfterMs",
     "must be a finite number"),
    ({"provider_retry_after_ms": "5"}, "failure.providerRetryAfterMs", "must be a finite number"),
    ({"request_id": 7}, "failure.requestId", "must be a string"),
])
def test_V14_V8_failure_field_of_the_wrong_type_is_named(fields: dict[str, Any], path: str,
                                                          problem: str) -> None:
    arguments = {"message": "m", "code": "E", **fields}
    error = _validation_error(lambda: LlmFailure(**arguments))
    assert (error.path, error.problem) == (path, problem)
    assert str(error) == f"{path}: {problem}"


@pytest.mark.parametrize("path", ["failure", "event.data.failure"])
def test_V14_V8_failure_decoder_states_the_expected_shape(path: str) -> None:
    error = _validation_error(lambda: LlmFailure.from_json("boom", path))
    assert (error.path, error.problem) == (path, "must be a mapping {message, code, ...}")


# --------------------------------------------------------------------------------------------
# V15 errors as data; rendered text
# --------------------------------------------------------------------------------------------


class _ModelFailure(Exception):
    def __init__(self, message: str, failure: LlmFailure) -> None:
        super().__init__(message)
        self.failure = failure


def test_V15_V8_an_error_info_is_checked_where_it_is_built_and_again_where_it_is_decoded() -> None:
    info = ErrorInfo("boom", "Oops", "E_X", ("a cause",))
    assert ErrorInfo.from_json(info) == info
    listed = ErrorInfo("boom", causes=["a cause"])  # type: ignore[arg-type]
    assert listed.causes == ("a cause",) and ErrorInfo.from_json(listed) == listed
    with pytest.raises(ValidationError) as refused:
        ErrorInfo("boom", causes=("a cause", 2))  # type: ignore[arg-type]
    assert str(refused.value) == "error.causes: must be a list of strings"
    broken = object.__new__(ErrorInfo)
    with pytest.raises(ValidationError):
        ErrorInfo.from_json(broken)
    altered = ErrorInfo("boom")
    object.__setattr__(altered, "message", 5)   # built, then changed behind its back
    with pytest.raises(ValidationError) as refused:
        ErrorInfo.from_json(altered, "result.error")
    assert (refused.value.path, refused.value.problem) == ("result.error.message",
                                                          "must be a string")


def test_V15_rendered_text_is_message_or_class_name() -> None:
    assert ErrorInfo.from_exception(RuntimeError("boom")).rendered() == "boom"
    assert ErrorInfo.from_exception(RuntimeError()).rendered() == "RuntimeError"
    assert ErrorInfo(message="", name="KeyError").rendered() == "KeyError"


def test_V15_rendered_text_appends_each_explicit_cause() -> None:
    try:
        try:
            try:
                raise OSError("disk full")
            except OSError as low:
                raise ValueError("cannot write") from low
        except ValueError as mid:
            raise RuntimeError("flush failed") from mid
    except RuntimeError as top:
        info = ErrorInfo.from_exception(top)
    assert info.causes == ("cannot write", "disk full")
    assert info.rendered() == "flush failed: cannot write: disk full"
    assert info.name == "RuntimeError" and info.code is None


def test_V15_empty_messages_in_the_chain() -> None:
    outer = RuntimeError()
    outer.__cause__ = ValueError()
    assert ErrorInfo.from_exception(outer).rendered() == "RuntimeError: "
    inner_empty = RuntimeError("top")
    inner_empty.__cause__ = KeyError()
    assert ErrorInfo.from_exception(inner_empty).rendered() == "top: "


def test_V15_only_explicit_causes_count_and_cycles_stop() -> None:
    try:
        try:
            raise ValueError("implicit")
        except ValueError:
            raise RuntimeError("outer")  # noqa: B904 - an implicit context, on purpose
    except RuntimeError as exc:
        assert ErrorInfo.from_exception(exc).rendered() == "outer"
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__cause__, b.__cause__ = b, a
    assert ErrorInfo.from_exception(a).rendered() == "a: b"


def test_V15_coded_errors_and_model_failures() -> None:
    coded = ErrorInfo.from_exception(ValidationError("x", "bad"))
    assert coded.code == "INVALID_VALUE" and coded.name == "ValidationError"
    assert coded.rendered() == "x: bad"
    odd = Exception("m")
    odd.code = 42  # type: ignore[attr-defined]
    assert ErrorInfo.from_exception(odd).code is None
    failure = LlmFailure("overloaded", "OVERLOADED", 529)
    model = ErrorInfo.from_exception(_ModelFailure("provider said no", failure))
    assert model.failure == failure
    assert ErrorInfo.from_json(model.to_json()) == model


def test_V15_a_broken_str_reads_as_empty() -> None:
    class Broken(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert ErrorInfo.from_exception(Broken()).rendered() == "Broken"


def test_V15_invalid_error_info() -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"message": 1}, "error.message"), ({"name": ""}, "error.name"),
        ({"code": 3}, "error.code"), ({"causes": ("a", 1)}, "error.causes"),
        ({"failure": {"message": "m"}}, "error.failure")]
    for kwargs, path in cases:
        with pytest.raises(ValidationError) as info:
            ErrorInfo(**kwargs)
        assert info.value.path == path
    with pytest.raises(ValidationError) as info:
        ErrorInfo.from_json({"message": "m", "causes": "not a list"})
    assert info.value.path == "error.causes"


def test_V15_from_exception_cuts_a_cause_cycle_that_does_not_reach_the_top() -> None:
    top, a, b = RuntimeError("top"), ValueError("a"), KeyError("b")
    top.__cause__ = a
    a.__cause__ = b
    b.__cause__ = a
    info = ErrorInfo.from_exception(top)
    assert info.causes == ("a", "'b'")
    assert info.rendered() == "top: a: 'b'"


def test_V15_from_exception_ignores_a_failure_attribute_that_is_not_an_LlmFailure() -> None:
    error = RuntimeError("boom")
    error.failure = {"message": "m", "code": "C"}  # type: ignore[attr-defined]
    assert ErrorInfo.from_exception(error).failure is None
    failure = LlmFailure("m", "C")
    error.failure = failure  # type: ignore[attr-defined]
    assert ErrorInfo.from_exception(error).failure == failure


def test_V15_V8_error_info_failure_that_is_not_an_llm_failure_is_named() -> None:
    error = _validation_error(
        lambda: ErrorInfo("m", failure={"message": "m", "code": "c"}))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("error.failure", "must be an LlmFailure")


def test_V15_error_info_decoder_defaults_agree_with_the_constructor() -> None:
    assert ErrorInfo.from_json({"name": "E"}) == ErrorInfo(name="E")
    assert ErrorInfo.from_json({"message": "m"}) == ErrorInfo("m")
    assert ErrorInfo.from_json({}) == ErrorInfo()
    assert ErrorInfo().name == "Error" and ErrorInfo().message == ""


@pytest.mark.parametrize("path", ["error", "payload.error"])
def test_V15_V8_error_info_decoder_states_the_expected_shape(path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ErrorInfo.from_json(5, path)
    assert (caught.value.path, caught.value.problem) == (
        path, "must be a mapping {name?, message, code?, causes?, failure?}")


# --------------------------------------------------------------------------------------------
# V16 tool results
# --------------------------------------------------------------------------------------------


def test_V16_tool_result_defaults_and_json() -> None:
    r = ToolResult.from_json({"content": [text("ok")]})
    assert (r.is_error, r.error, r.additional_contexts, r.concludes_turn, r.meta) == (
        False, None, (), False, None)
    assert r.to_json() == {"content": [text("ok")]}
    full = ToolResult.from_json({
        "content": [], "isError": True, "error": {"name": "E", "code": "C"},
        "additionalContexts": [_msg()], "concludesTurn": True, "meta": [1, "x"]})
    assert full.additional_contexts == (validate_user_message(_msg()),)
    assert ToolResult.from_json(full.to_json()) == full


@pytest.mark.parametrize(("value", "path"), [
    ({}, "result.content"),
    ({"content": "ok"}, "result.content"),
    ({"content": [{"text": "x"}]}, "result.content[0]"),
    ({"content": [], "isError": "yes"}, "result.isError"),
    ({"content": [], "error": {"code": "C"}}, "result.error"),
    ({"content": [], "error": "E"}, "result.error"),
    ({"content": [], "additionalContexts": [_msg(role="assistant")]},
     "result.additionalContexts[0].role"),
    ({"content": [], "additionalContexts": _msg()}, "result.additionalContexts"),
    ({"content": [], "concludesTurn": 1}, "result.concludesTurn"),
    ({"content": [], "meta": {"k": {1, 2}}}, "result.meta.k"),
    ({"content": [], "output": "x"}, "result"),
])
def test_V16_invalid_tool_results_are_coded(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        ToolResult.from_json(value)
    assert info.value.path == path
    assert info.value.code == INVALID_TOOL_RESULT


def test_V16_constructor_errors_are_coded_too() -> None:
    with pytest.raises(ValidationError) as info:
        ToolResult(content="nope")  # type: ignore[arg-type]
    assert info.value.code == INVALID_TOOL_RESULT and info.value.path == "result.content"


# The problem texts are pinned: they reach users through `turn/end` reasons, `agent/error`
# payloads and `turnstile log validate` verdicts.
TOOL_RESULT_PROBLEMS = [
    ({"content": [], "isError": "yes"}, ".isError", "must be a bool"),
    ({"content": [], "error": {"name": "E", "v": float("nan")}}, ".error.v", "nan is not a finite number"),
    ({"content": [], "error": {"nom": "E"}}, ".error", "must be a mapping with a string 'name'"),
    ({"content": [], "error": "E"}, ".error", "must be a mapping with a string 'name'"),
    ({"content": [], "additionalContexts": {}}, ".additionalContexts", "must be a list of user messages"),
    ({"content": [], "concludesTurn": 1}, ".concludesTurn", "must be a bool"),
    ({"content": [], "meta": {1: 2}}, ".meta", "key 1 is not a string"),
    (5, "", "must be a mapping {content, ...}"),
    ({"content": [], "extra": 1}, "", "unexpected field(s) 'extra'"),
    ({}, ".content", "is required"),
]


@pytest.mark.parametrize(("value", "suffix", "problem"), TOOL_RESULT_PROBLEMS)
@pytest.mark.parametrize("path", ["result", "call.result"])
def test_V16_V8_tool_result_decoder_names_path_problem_and_code(value: Any, suffix: str, problem: str,
                                                                  path: str) -> None:
    with pytest.raises(ValidationError) as caught:
        ToolResult.from_json(value, path)
    assert (caught.value.path, caught.value.problem) == (path + suffix, problem)
    assert caught.value.code == "INVALID_TOOL_RESULT"


# --------------------------------------------------------------------------------------------
# V17 prompt decisions
# --------------------------------------------------------------------------------------------


def test_V17_decisions() -> None:
    assert decision_from_json({"kind": "allow"}) == ALLOW == Allow()
    replaced = decision_from_json({"kind": "allow", "content": [text("rewritten")],
                                   "additionalContexts": [_msg(id="ctx")]})
    assert isinstance(replaced, Allow)
    assert replaced.content == [text("rewritten")]
    assert [c.id for c in replaced.additional_contexts] == ["ctx"]
    assert decision_from_json({"kind": "block", "reason": "no"}) == Block("no")
    assert decision_from_json(Block("x")) == Block("x")
    assert decision_from_json({"kind": "allow", "content": []}).to_json() == {
        "kind": "allow", "content": []}


@pytest.mark.parametrize(("value", "path"), [
    ({"kind": "deny"}, "decision.kind"),
    ({}, "decision.kind"),
    (None, "decision"),
    ({"kind": "block"}, "decision.reason"),
    ({"kind": "block", "reason": 3}, "decision.reason"),
    ({"kind": "block", "reason": "r", "content": []}, "decision"),
    ({"kind": "allow", "content": "x"}, "decision.content"),
    ({"kind": "allow", "content": [{"type": "text"}]}, "decision.content[0]"),
    ({"kind": "allow", "additionalContexts": [_msg(id="")]}, "decision.additionalContexts[0].id"),
    ({"kind": "allow", "additionalContexts": [_msg(content=[{"type": "text", "text": {1}}])]},
     "decision.additionalContexts[0].content[0].text"),
    ({"kind": "allow", "prefix": "x"}, "decision"),
])
def test_V17_invalid_decisions(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        decision_from_json(value)
    assert info.value.path == path


def test_V17_V8_block_decision_reason_that_is_not_a_string_is_named() -> None:
    error = _validation_error(lambda: Block(None))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("decision.reason", "must be a string")


def test_V17_V8_decision_errors_name_the_field_and_the_problem() -> None:
    error = _validation_error(lambda: decision_from_json("allow", "hook.decision"))
    assert (error.path, error.problem) == (
        "hook.decision", "must be {kind:'allow', ...} or {kind:'block', reason}")
    error = _validation_error(lambda: decision_from_json({"kind": "maybe"}, "hook.decision"))
    assert (error.path, error.problem) == ("hook.decision.kind", "'maybe' is not 'allow' or 'block'")
    error = _validation_error(lambda: Allow(additional_contexts="x"))  # type: ignore[arg-type]
    assert (error.path, error.problem) == ("decision.additionalContexts",
                                           "must be a list of user messages")


# --------------------------------------------------------------------------------------------
# V18 chunks
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [
    {"type": "text", "text": "hi"},
    {"type": ""},
    {"type": "x-provider-ping"},  # structurally valid (the log takes it); a stream refuses it (P12)
    {"type": "finish", "kind": "stop"},
    {"type": "usage", "usage": {"outputTokens": 9}},
    {"type": "finish", "kind": "max-tokens", "replayState": {"cursor": 3}},
    {"type": "finish", "kind": "error", "failure": {"message": "m", "code": "C"}},
    {"type": "finish", "kind": "aborted"},
    {"type": "finish", "kind": "aborted", "failure": {"message": "m", "code": "ABORTED"}},
])
def test_V18_valid_chunks(chunk: dict[str, Any]) -> None:
    assert validate_chunk(chunk) == chunk


@pytest.mark.parametrize(("chunk", "path"), [
    ("text", "chunk"),
    ({"text": "no type"}, "chunk"),
    ({"type": 1}, "chunk"),
    ({"type": "text", "text": math.inf}, "chunk.text"),
    ({"type": "usage"}, "chunk.usage"),
    ({"type": "finish"}, "chunk.kind"),
    ({"type": "finish", "kind": "done"}, "chunk.kind"),
    ({"type": "finish", "kind": "error"}, "chunk.failure"),
    ({"type": "finish", "kind": "error", "failure": {"message": "m"}}, "chunk.failure.code"),
    ({"type": "usage", "usage": 5}, "chunk.usage"),
    ({"type": "finish", "kind": "stop", "usage": 5}, "chunk.usage"),
])
def test_V18_invalid_chunks_are_coded(chunk: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_chunk(chunk)
    assert info.value.path == path
    assert info.value.code == INVALID_CHUNK


class _Text(str):
    """A str subclass: frozen as a plain str, so never the stream's usual text chunk as is."""


@pytest.mark.parametrize("chunk", [
    {"type": "text", "text": "hi"},                     # the usual chunk, taken at once
    {"text": "hi", "type": "text"},                     # key order kept
    {"type": "text", "text": ""},
    {"type": _Text("text"), "text": "hi"},              # the general path: a str subclass
    {"type": "text", "text": _Text("hi")},
    {"type": "text", "text": "hi", "extra": 1},         # the general path: another field
    {"type": "reasoning", "text": "hi"},
])
def test_V18_text_chunks_are_frozen_copies_of_their_fields(chunk: dict[str, Any]) -> None:
    chunk = dict(chunk)                                 # the parameter is shared by reruns
    frozen = validate_chunk(chunk)
    assert type(frozen) is FrozenDict and frozen == chunk and list(frozen) == list(chunk)
    assert all(type(value) is not _Text for value in frozen.values())
    assert all(type(key) is str for key in frozen)
    chunk["text"] = "changed later"                     # V6: a snapshot
    assert frozen["text"] != "changed later"


@pytest.mark.parametrize(("chunk", "path"), [
    ({"type": "text", "text": math.nan}, "chunk.text"),
    ({"type": "text", "text": [object()]}, "chunk.text[0]"),
])
def test_V18_text_chunks_with_bad_values_are_refused(chunk: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        validate_chunk(chunk)
    assert info.value.path == path and info.value.code == INVALID_CHUNK


# --------------------------------------------------------------------------------------------
# V19 turn-end reasons
# --------------------------------------------------------------------------------------------


def test_V19_reason_forms() -> None:
    for kind in ("completed", "aborted", "disposed", "max-tokens", "interrupted"):
        reason = TurnEndReason.from_json({"kind": kind})
        assert reason.to_json() == {"kind": kind}
    failure = LlmFailure("boom: cause", "SERVER")
    req = TurnEndReason.request_failure(2, failure)
    assert req.to_json() == {"kind": "error", "step": 2, "failure": failure.to_json()}
    assert TurnEndReason.failed(0, "tool exploded").to_json() == {
        "kind": "error", "step": 0, "message": "tool exploded"}
    coded = TurnEndReason.failed(1, "bad chunk", INVALID_CHUNK)
    assert coded.to_json() == {"kind": "error", "step": 1, "message": "bad chunk",
                               "code": INVALID_CHUNK}
    assert END_COMPLETED.kind == "completed" and END_ABORTED.to_json() == {"kind": "aborted"}


@pytest.mark.parametrize(("value", "path"), [
    ({"kind": "aborted", "step": 1}, "reason"),
    ({"kind": "completed", "message": "x"}, "reason"),
    ({"kind": "done"}, "reason.kind"),
    ({"kind": "error"}, "reason.step"),
    ({"kind": "error", "step": 1}, "reason.message"),
    ({"kind": "error", "step": -1, "message": "m"}, "reason.step"),
    ({"kind": "error", "step": True, "message": "m"}, "reason.step"),
    ({"kind": "error", "step": 1.0, "message": "m"}, "reason.step"),
    ({"kind": "error", "step": 1, "message": 3}, "reason.message"),
    ({"kind": "error", "step": 1, "message": "m", "code": None}, "reason.code"),
    ({"kind": "error", "step": 1, "message": "m", "code": 7}, "reason.code"),
    ({"kind": "error", "step": 1, "failure": {"message": "m", "code": "C"}, "message": "m"},
     "reason"),
    ({"kind": "error", "step": 1, "failure": {"message": "m", "code": "C"}, "code": "C"},
     "reason"),
    ({"kind": "error", "step": 1, "failure": {"message": "m"}}, "reason.failure.code"),
    ({"kind": "error", "step": 1, "failure": None}, "reason.failure"),
    ("aborted", "reason"),
])
def test_V19_invalid_reasons(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        TurnEndReason.from_json(value)
    assert info.value.path == path


def test_V19_constructor_rejects_impossible_combinations() -> None:
    failure = LlmFailure("m", "C")
    bad: list[dict[str, Any]] = [
        {"kind": "aborted", "step": 0},
        {"kind": "disposed", "failure": failure},
        {"kind": "error", "step": 1, "failure": failure, "message": "m"},
        {"kind": "error", "step": 1, "failure": failure, "code": "C"},
        {"kind": "error", "step": 1, "failure": {"message": "m", "code": "C"}},
        {"kind": "error", "step": None, "message": "m"},
    ]
    for kwargs in bad:
        with pytest.raises(ValidationError):
            TurnEndReason(**kwargs)


@pytest.mark.parametrize(("kind", "fields", "path", "problem"), [
    ("completed", {"message": "m"}, "reason.message", "is not allowed on a 'completed' reason"),
    ("aborted", {"code": "E"}, "reason.code", "is not allowed on a 'aborted' reason"),
    ("error", {"step": 1, "failure": "plain"}, "reason.failure", "must be an LlmFailure"),
    ("error", {"step": 1, "failure": "llm", "message": "m"}, "reason.message",
     "is not allowed beside a failure"),
    ("error", {"step": 1, "failure": "llm", "code": "E"}, "reason.code",
     "is not allowed beside a failure"),
    ("error", {"step": 1}, "reason.message", "an error reason needs a failure or a string message"),
])
def test_V19_V8_turn_end_reason_field_problems_are_named(kind: str, fields: dict[str, Any],
                                                         path: str, problem: str) -> None:
    if fields.get("failure") == "llm":
        fields = {**fields, "failure": LlmFailure("overloaded", "E_MODEL")}
    elif fields.get("failure") == "plain":
        fields = {**fields, "failure": {"message": "overloaded", "code": "E_MODEL"}}
    error = _validation_error(lambda: TurnEndReason(kind, **fields))  # type: ignore[arg-type]
    assert (error.path, error.problem) == (path, problem)


# --------------------------------------------------------------------------------------------
# V20 settle reasons
# --------------------------------------------------------------------------------------------


def test_V20_settle_forms() -> None:
    assert SETTLE_COMPLETED.to_json() == {"kind": "completed"}
    assert SETTLE_ABORTED.to_json() == {"kind": "aborted"}
    error = ErrorInfo("bad", "RuntimeError")
    failure = LlmFailure("bad", "C")
    settled = SettleReason("error", error, failure)
    assert settled.to_json() == {"kind": "error", "error": error.to_json(),
                                 "failure": failure.to_json()}
    assert SettleReason.from_json(settled.to_json()) == settled
    assert SettleReason.from_json({"kind": "error", "error": {"message": "m"}}).failure is None


@pytest.mark.parametrize(("value", "path"), [
    ({"kind": "max-tokens"}, "reason.kind"),
    ({"kind": "disposed"}, "reason.kind"),
    ({"kind": "completed", "error": {"message": "m"}}, "reason"),
    ({"kind": "error"}, "reason.error"),
    ({"kind": "error", "error": {"message": "m"}, "failure": None}, "reason.failure"),
    ({"kind": "error", "error": {"message": 1}}, "reason.error.message"),
    ({"kind": "error", "error": {"message": "m"}, "failure": {"code": "C"}},
     "reason.failure.message"),
])
def test_V20_invalid_settle_reasons(value: Any, path: str) -> None:
    with pytest.raises(ValidationError) as info:
        SettleReason.from_json(value)
    assert info.value.path == path


def test_V20_constructor_rejects_impossible_combinations() -> None:
    with pytest.raises(ValidationError):
        SettleReason("error")
    with pytest.raises(ValidationError):
        SettleReason("aborted", failure=LlmFailure("m", "C"))
    with pytest.raises(ValidationError):
        SettleReason("error", {"message": "m"})  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", ["completed", "aborted"])
def test_V20_V8_an_error_on_a_reason_that_is_not_error_is_named(kind: Any) -> None:
    with pytest.raises(ValidationError) as caught:
        SettleReason(kind, ErrorInfo("m"))
    assert str(caught.value) == f"reason.error: is not allowed on a {kind!r} reason"
    with pytest.raises(ValidationError) as caught:
        SettleReason(kind, failure=LlmFailure("m", "C"))
    assert str(caught.value) == f"reason.failure: is not allowed on a {kind!r} reason"


@pytest.mark.parametrize("bad", ["completed", None, 3, ["kind"]])
@pytest.mark.parametrize("path", [None, "reason", "payload.reason"])
def test_V20_V8_settle_reason_decoder_refuses_a_non_mapping_stating_the_expected_shape(
        bad: Any, path: str | None) -> None:
    with pytest.raises(ValidationError) as caught:
        if path is None:
            SettleReason.from_json(bad)
        else:
            SettleReason.from_json(bad, path)
    assert (caught.value.path, caught.value.problem) == (path or "reason", "must be a mapping {kind}")


def test_V20_V8_settle_reason_errors_are_rebased_onto_the_callers_path() -> None:
    with pytest.raises(ValidationError) as caught:
        SettleReason.from_json({"kind": "error", "error": {"name": "E", "message": 5}}, "payload.reason")
    assert caught.value.path.startswith("payload.reason.error")
    with pytest.raises(ValidationError) as caught:
        SettleReason.from_json({"kind": "nope"}, "payload.reason")
    assert caught.value.path.startswith("payload.reason")
    with pytest.raises(ValidationError) as caught:
        SettleReason.from_json({"kind": "error", "error": {"name": "E", "message": "m"}, "failure": None})
    assert caught.value.path == "reason.failure"
    assert caught.value.problem == "must be a mapping when present"


@pytest.mark.parametrize("kind", ["max-tokens", "disposed", ""])
def test_V20_V8_settle_reason_kind_outside_the_three_is_named(kind: str) -> None:
    error = _validation_error(lambda: SettleReason(kind))  # type: ignore[arg-type]
    assert (error.path, error.problem) == (
        "reason.kind", f"{kind!r} is not 'completed', 'aborted' or 'error'")


# --------------------------------------------------------------------------------------------
# V21 request-error action
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("value", "retry"), [
    ({"kind": "retry"}, True),
    (freeze({"kind": "retry"}), True),
    (None, False),
    ({"kind": "retry", "delayMs": 10}, False),
    ({"kind": "abort"}, False),
    ({}, False),
    ("retry", False),
    (True, False),
    ([{"kind": "retry"}], False),
])
def test_V21_only_exactly_retry_means_retry(value: Any, retry: bool) -> None:
    assert retry_action_from_json(value) is retry
