"""The explorer's state key (`machine.checking.search`): a canonical text of everything the
future of a node depends on — the core's whole explicit state (R4), the other
implementation's ``state_parts()``, the invariant monitor's ledger — with message ids renamed
by first appearance (symmetry reduction), written piece by piece and digested.
"""

from __future__ import annotations

import dataclasses
import hashlib
import operator
import re
import types
from collections import deque
from collections.abc import Callable, Sequence
from itertools import count
from typing import TYPE_CHECKING, Any

from machine.core import AgentCore, state_of
from machine.core.snapshot import STATIC_ATTRIBUTES
from machine.jsonvalue import FrozenDict, FrozenList, compact_json
from machine.log import SessionLog

if TYPE_CHECKING:
    from machine.checking.search import Agentlike

_ID = re.compile(r"\b(m\d+|call-m\d+(?:-\d+)?)\b")
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def renamed(text: str, tokens: Sequence[str] = ()) -> str:
    """*text* with the message ids (and the call ids made from them) renamed in order of
    first appearance, after the *tokens* already named (in their order)."""
    return _renaming(text, {token: f"#{index}" for index, token in enumerate(tokens)})


def _renaming(text: str, names: dict[str, str]) -> str:
    """`renamed` with the names given so far in *names* (which it extends)."""
    pieces = _ID.split(text)         # text, id, text, id, ..., text
    for index in range(1, len(pieces), 2):
        token = pieces[index]
        name = names.get(token)
        if name is None:
            name = names[token] = f"#{len(names)}"
        pieces[index] = name
    return "".join(pieces)


def exact_text(value: object) -> str:
    """The text of an immutable value that tells apart exactly what its data tells apart:
    a record's class and fields, frozen JSON as compact JSON (so ``1``, ``1.0`` and ``true``
    differ, and so does key order), strings and numbers by ``repr``. Why not ``repr``: a
    value's repr thaws its JSON first, and every state makes new outputs."""
    kind = type(value)
    if kind is str or value is None or kind is int or kind is bool or kind is float:
        return repr(value)
    if kind is FrozenDict or kind is FrozenList:
        try:
            return compact_json(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):   # a value JSON cannot spell: its repr
            return _ADDRESS.sub("", repr(value))
    names = _EXACT_FIELDS.get(kind)
    if names is None:
        names = _EXACT_FIELDS[kind] = (
            tuple(f.name for f in dataclasses.fields(kind))
            if dataclasses.is_dataclass(kind) and kind.__module__ in _IMMUTABLE_MODULES else ())
    if names:
        return f"{kind.__name__}({', '.join([exact_text(getattr(value, n)) for n in names])})"
    if kind is tuple:
        return f"({', '.join([exact_text(item) for item in value])},)"  # type: ignore[attr-defined]
    return _ADDRESS.sub("", repr(value))


#: The fields `exact_text` writes of each class (empty: written by ``repr``).
_EXACT_FIELDS: dict[type, tuple[str, ...]] = {}


_EMPTY_CHAIN: tuple[bytes, bytes, tuple[str, ...]] = (b"", b"", ())


class Texts:
    """The canonical text of immutable values (frozen JSON, messages, outputs, a log's
    records), each made once per exploration: states share most of them (a copied state
    shares its parent's values, R4.12), so a key costs what changed. Each value is held
    while its text is cached, so an id is never reused for another value."""

    def __init__(self) -> None:
        self._texts: dict[int, tuple[object, str]] = {}
        self._chains: dict[int, tuple[object, tuple[bytes, bytes, tuple[str, ...]]]] = {}

    def text(self, value: object) -> str:
        hit = self._texts.get(id(value))
        if hit is not None and hit[0] is value:
            return hit[1]
        text = exact_text(value)
        self._texts[id(value)] = (value, text)
        return text

    def chain(self, log: SessionLog) -> tuple[bytes, bytes, tuple[str, ...]]:
        """Digests of the log's events as its future depends on them (`log`): one of their
        text as it is, one with message ids renamed in order of first appearance, and the
        ids met, in that order. Each event is digested once, after the events before it
        (a record is only ever shared by forks, so always after the same ones)."""
        records = log._records
        chains = self._chains
        start = len(records)
        state = _EMPTY_CHAIN
        while start > 0:
            hit = chains.get(id(records[start - 1]))
            if hit is not None and hit[0] is records[start - 1]:
                state = hit[1]
                break
            start -= 1
        for index in range(start, len(records)):
            record = records[index]
            raw_prev, renamed_prev, tokens = state
            text = f"{record[0]} {record[3]} {record[4]!r} {record[5]!r}"
            names = {token: f"#{n}" for n, token in enumerate(tokens)}
            renamed = _renaming(text, names)
            if len(names) != len(tokens):
                tokens = tuple(names)
            state = (hashlib.sha256(raw_prev + text.encode("utf-8", "surrogatepass")).digest(),
                     hashlib.sha256(renamed_prev + renamed.encode("utf-8",
                                                                  "surrogatepass")).digest(),
                     tokens)
            chains[id(record)] = (record, state)
        return state

    def log(self, log: SessionLog) -> str:
        """The log's events as its future depends on them: types, data, surface operations
        and sources (not times). Forks share their records, so each is written once."""
        texts = self._texts
        parts: list[str] = []
        for record in log._records:
            hit = texts.get(id(record))
            if hit is None or hit[0] is not record:
                text = f"{record[0]} {record[3]} {record[4]!r} {record[5]!r}"
                texts[id(record)] = hit = (record, text)
            parts.append(hit[1])
        return "\n".join(parts)


def core_parts(core: AgentCore, texts: Texts | None = None, *,
                with_log: bool = True) -> tuple[object, ...]:
    """Everything the core's future depends on (its whole explicit state, R4), canonical;
    the log first, unless *with_log* is false."""
    texts = texts if texts is not None else Texts()
    state = vars(state_of(core))
    return (texts.log(core.log) if with_log else None,
            *[(name, _canonical(state[name], 0, texts)) for name in _state_names(core)])


#: The state attributes of a core class, in order (R4: the same for every instance).
_STATE_NAMES: dict[type, tuple[str, ...]] = {}


def _state_names(core: AgentCore) -> tuple[str, ...]:
    state = vars(state_of(core))
    names = _STATE_NAMES.get(type(core))
    if names is None or len(names) != len(state) - len(STATIC_ATTRIBUTES):
        names = _STATE_NAMES[type(core)] = tuple(sorted(set(state) - STATIC_ATTRIBUTES))
    return names


def state_key(core: AgentCore) -> str:
    """A canonical key of everything the core's future depends on (see the module docstring)."""
    return renamed(repr(core_parts(core)))


def implementation_parts(agent: Agentlike, texts: Texts | None = None, *,
                         with_log: bool = True) -> tuple[object, ...]:
    """Everything an implementation's future may depend on: its log's events (unless
    *with_log* is false) and what its ``state_parts()`` gives, canonical."""
    texts = texts if texts is not None else Texts()
    log = getattr(agent, "log", None)
    return (texts.log(log) if with_log and isinstance(log, SessionLog) else None,
            _canonical(agent.state_parts(), 0, texts))


_IMMUTABLE_MODULES = frozenset({"machine.jsonvalue", "machine.vocabulary", "machine.io",
                                "machine.events"})


#: How `_canonical` reads a class: "text" (immutable: its text, once), "fields" (a
#: dataclass: its fields, by name), "slots" (a machine: its slots), or another way (None).
_READERS: dict[type, tuple[str, tuple[str, ...]] | None] = {}


def _reader(kind: type) -> tuple[str, tuple[str, ...]] | None:
    if kind not in _READERS:
        reader: tuple[str, tuple[str, ...]] | None = None
        if kind.__module__ in _IMMUTABLE_MODULES:
            reader = ("text", ())
        elif dataclasses.is_dataclass(kind):
            reader = ("fields", tuple(f.name for f in dataclasses.fields(kind)))
        elif (kind.__dict__.get("__slots__") and not issubclass(kind, BaseException)
              and "__dict__" not in dir(kind)):
            reader = ("slots", tuple(kind.__dict__["__slots__"]))
        _READERS[kind] = reader
    return _READERS[kind]


def _canonical(value: object, depth: int, texts: Texts) -> object:
    kind = type(value)
    if value is None or kind is int or kind is str or kind is bool or kind is float:
        return value
    if depth > 40:
        return _ADDRESS.sub("", repr(value))
    if kind is list or kind is tuple or kind is deque:
        return (kind.__name__, tuple([_canonical(v, depth + 1, texts)
                                      for v in value]))  # type: ignore[attr-defined]
    reader = _reader(kind)
    if reader is not None:
        how, names = reader
        if how == "text":                       # frozen values: their text, once
            return texts.text(value)
        return (kind.__name__, tuple([(name, _canonical(getattr(value, name), depth + 1, texts))
                                      for name in names]))
    if kind is set or kind is frozenset:
        return (kind.__name__, tuple(sorted(repr(_canonical(v, depth + 1, texts))
                                            for v in value)))  # type: ignore[attr-defined]
    if kind is dict:
        return ("dict", tuple([(repr(k), _canonical(v, depth + 1, texts))
                               for k, v in value.items()]))  # type: ignore[attr-defined]
    if kind is SessionLog:
        return texts.log(value)  # type: ignore[arg-type]
    if isinstance(value, BaseException):
        return (kind.__name__, repr(value.args),
                tuple((k, _canonical(v, depth + 1, texts)) for k, v in sorted(vars(value).items())))
    if isinstance(value, (types.FunctionType, types.MethodType, types.BuiltinFunctionType)):
        return getattr(value, "__qualname__", "function")
    return _ADDRESS.sub("", repr(value))


# --------------------------------------------------------------------------
# The key's text, written piece by piece
# --------------------------------------------------------------------------
#
# Why: a key is the text `repr((core parts, other parts, ledger))` would give, message ids
# renamed by first appearance (`renamed`). Building those nested tuples, writing them with
# `repr` (which quotes every cached text again) and scanning the whole text for ids cost
# two thirds of an exploration. `Emitter` writes the same text directly as a template
# (each id replaced by NUL, which no repr contains) and the ids in order; each immutable
# value's quoted text is split so once per exploration. The renamed text is the template
# with the ids' ranks of first appearance put back (`filled`), so the template and the
# ranks determine it and are determined by it: the key digests those two.
# `tests/test_explore.py` checks that `Explorer.key_text` is exactly the renamed text.

#: A value's text as a template (ids replaced by NUL) and its ids in order.
_Template = tuple[str, tuple[str, ...]]


def _template(text: str) -> _Template:
    pieces = _ID.split(text)
    return "\0".join(pieces[0::2]), tuple(pieces[1::2])


#: Writes one value: its template into its emitter's `out`, its ids into its ``ids``.
_Writer = Callable[[Any], None]


class Emitter:
    """Writes the template of ``repr(_canonical(value))`` into `out`, its ids into `ids`.

    Why it is shaped so: a key writes a few hundred values, most of them scalars, names
    and immutable values met before. Those are known by identity (`_known`: the text of
    each value, held so that no other value ever takes its id; a string or an int: the
    first one of its value met), so a record's fields and a sequence's items are written
    inline by one look-up; only containers, mutable records and values not known cost a
    call, to the writer of their class (made once: a record's labels are written once, its
    fields read by one `operator.attrgetter` call). Mutable values are never known: they
    are written each time. The writers append to the emitter's own two lists (`begin`
    empties them, `finish` reads them).
    """

    def __init__(self, texts: Texts) -> None:
        self.texts = texts
        self.out: list[str] = []
        self.ids: list[str] = []
        #: an immutable value (by identity) whose text has no id -> that text
        self._known: dict[int, str] = {}
        #: the same, each text after ``, `` (an item of a sequence but its first)
        self._known_after: dict[int, str] = {}
        #: an immutable value (by identity) whose text has ids -> its template
        self._known_templates: dict[int, _Template] = {}
        #: the values known by identity, held so that no other value ever takes their id
        self._held: list[object] = []
        #: a string -> the template of its repr (the first string of each value is known)
        self._strings: dict[str, _Template] = {}
        #: an int -> its repr (the first int of each value is known)
        self._integers: dict[int, str] = {}
        #: an immutable value's text (`Texts.text`) -> the template of its repr
        self._quoted: dict[str, _Template] = {}
        #: a monitor's ledger -> the template of its repr
        self._ledgers: dict[tuple[object, ...], _Template] = {}
        #: class -> how to write its instances
        self._writers: dict[type, _Writer] = {}
        #: core class -> its state names and the writer of a state (its attributes' dict)
        self._states: dict[type, tuple[tuple[str, ...], _Writer]] = {}

    def begin(self) -> None:
        """Start a text: nothing written yet."""
        self.out.clear()
        self.ids.clear()

    def finish(self) -> tuple[str, list[str]]:
        """The template written since `begin`, and its ids in order."""
        return "".join(self.out), self.ids.copy()

    def write(self, value: Any) -> None:
        """Write *value*'s template (and its ids)."""
        text = self._known.get(id(value))
        if text is None:
            kind = type(value)
            (self._writers.get(kind) or self._writer(kind))(value)
        else:
            self.out.append(text)

    def state(self, core: AgentCore) -> None:
        """Write ``(None, *((name, value) for each state attribute))`` of *core* (see
        `core_parts`), but its closing ``)``."""
        names = _state_names(core)
        known = self._states.get(type(core))
        if known is None or known[0] is not names:
            labels = [f"({name!r}, " for name in names]
            if not names or any(_ID.search(label) for label in labels):
                writer = self._named_values(names)
            else:
                writer = self._fields(
                    (f"((None, {labels[0]}", *(f"), {label}" for label in labels[1:])),
                    ")), ", _getter(operator.itemgetter, names))
            known = self._states[type(core)] = (names, writer)
        known[1](vars(state_of(core)))

    def _named_values(self, names: tuple[str, ...]) -> _Writer:
        """`state`'s writer when a name holds an id (or there is none): each name written as
        a value."""
        append, write = self.out.append, self.write

        def named_values(state: dict[str, Any]) -> None:
            append("((None")
            for name in names:
                append(", (")
                write(name)
                append(", ")
                write(state[name])
                append(")")
            append("), ")
        return named_values

    def ledger(self, ledger: tuple[object, ...]) -> None:
        """Write a monitor's ledger as ``repr`` writes it (ledgers recur: each once)."""
        found = self._ledgers.get(ledger)
        if found is None:
            found = self._ledgers[ledger] = _template(repr(ledger))
        self.out.append(found[0])
        self.ids.extend(found[1])

    def text(self, text: str) -> None:
        """Write *text* as it is (its ids found)."""
        template, found = _template(text)
        self.out.append(template)
        self.ids.extend(found)

    def _remember(self, value: object, template: _Template) -> None:
        """Know *value* (immutable) by identity from now on."""
        self._held.append(value)
        if template[1]:
            self._known_templates[id(value)] = template
        else:
            self._known[id(value)] = template[0]
            self._known_after[id(value)] = ", " + template[0]

    def _string(self, value: str) -> None:
        template = self._strings.get(value)
        if template is None:
            template = self._strings[value] = _template(repr(value))
            self._remember(value, template)     # the first string of its value met
        self.out.append(template[0])
        if template[1]:
            self.ids.extend(template[1])

    def _writer(self, kind: type) -> _Writer:
        writer = self._writers[kind] = self._writer_of(kind)
        return writer

    def _writer_of(self, kind: type) -> _Writer:
        write, texts = self.write, self.texts
        append, extend = self.out.append, self.ids.extend
        if kind is str:
            return self._string
        if kind is int:
            integers, remember = self._integers, self._remember

            def integer(value: int) -> None:
                text = integers.get(value)
                if text is None:
                    text = integers[value] = repr(value)
                    remember(value, (text, ()))     # the first int of its value met
                append(text)
            return integer
        if kind is type(None) or kind is bool:
            remember = self._remember

            def singleton(value: Any) -> None:
                remember(value, (repr(value), ()))
                append(repr(value))
            return singleton
        if kind is float:
            def real(value: float) -> None:
                append(repr(value))
            return real
        if kind is list or kind is tuple or kind is deque:
            return self._sequence(f"({kind.__name__!r}, (")
        if kind is dict:
            def mapping(value: Any) -> None:
                append("('dict', (")
                for index, (key, item) in enumerate(value.items()):
                    append(", (" if index else "(")
                    write(repr(key))
                    append(", ")
                    write(item)
                    append(")")
                append(",))" if len(value) == 1 else "))")
            return mapping
        if kind in (types.FunctionType, types.MethodType, types.BuiltinFunctionType):
            def function(value: Any) -> None:
                write(getattr(value, "__qualname__", "function"))  # a phase
            return function
        if kind is set or kind is frozenset:
            return self._collection(kind)
        reader = _reader(kind)
        if reader is not None and reader[0] == "text":
            known_templates, remember = self._known_templates, self._remember
            quoted = self._quoted

            def immutable(value: Any) -> None:
                template = known_templates.get(id(value))
                if template is None:
                    # Why by text too: the other implementation's parts are new values
                    # each time (frozen JSON made by its `state_parts`), of a few texts
                    text = texts.text(value)
                    template = quoted.get(text)
                    if template is None:
                        template = quoted[text] = _template(repr(text))
                    remember(value, template)
                append(template[0])
                extend(template[1])
            return immutable
        if reader is not None:
            names = reader[1]
            labels = [f"({name!r}, " for name in names]
            if any(_ID.search(label) for label in labels) or _ID.search(kind.__name__):
                return self._generic
            head = f"({kind.__name__!r}, ("
            if not names:
                def empty_record(value: Any) -> None:
                    append(head + "))")
                return empty_record
            return self._fields((head + labels[0], *(f"), {label}" for label in labels[1:])),
                                "),))" if len(names) == 1 else ")))",
                                _getter(operator.attrgetter, names))
        return self._generic

    # Why `_fields` and `_sequence` write their items inline (the same few lines in each):
    # most items are known by identity, and a call per item was most of a key's cost.

    def _fields(self, labels: tuple[str, ...], tail: str,
                get: Callable[[Any], tuple[Any, ...]]) -> _Writer:
        """A writer of the values *get* reads from a record, each after its label, then
        *tail*."""
        append, writer = self.out.append, self._writer
        known, writers = self._known, self._writers

        def record(value: Any) -> None:
            for label, item in zip(labels, get(value), strict=True):
                append(label)
                text = known.get(id(item))
                if text is None:
                    kind = type(item)
                    (writers.get(kind) or writer(kind))(item)
                else:
                    append(text)
            append(tail)
        return record

    def _sequence(self, head: str) -> _Writer:
        """A writer of a list, tuple or deque as ``(class name, (item, ...))``."""
        write, writer = self.write, self._writer
        append = self.out.append
        known_after, writers = self._known_after, self._writers
        empty = head + "))"

        def sequence(value: Any) -> None:
            if not value:
                append(empty)
                return
            append(head)
            items = iter(value)
            write(next(items))
            for item in items:
                text = known_after.get(id(item))
                if text is None:
                    append(", ")
                    kind = type(item)
                    (writers.get(kind) or writer(kind))(item)
                else:
                    append(text)
            append(",))" if len(value) == 1 else "))")
        return sequence

    def _collection(self, kind: type) -> _Writer:
        """A writer of a set or frozenset: its items' reprs, sorted (see `_canonical`)."""
        name = kind.__name__
        empty = f"({name!r}, ())"
        generic, text, append = self._generic, self.text, self.out.append

        def collection(value: Any) -> None:
            if not value:
                append(empty)
            elif _PLAIN_KINDS.issuperset(map(type, value)):
                # Why: a plain item is its own canonical value, so this is `_canonical`'s text
                items = ", ".join(map(repr, sorted(map(repr, value))))
                written = (f"({name!r}, ({items},))" if len(value) == 1
                           else f"({name!r}, ({items}))")
                if str in map(type, value):
                    text(written)           # a string may hold ids
                else:
                    append(written)
            else:
                generic(value)
        return collection

    def _generic(self, value: Any) -> None:
        self.text(repr(_canonical(value, 0, self.texts)))


#: The classes a value of which `_canonical` gives as it is.
_PLAIN_KINDS = frozenset({str, int, bool, float, type(None)})


def _getter(make: Callable[..., Callable[[Any], Any]], names: tuple[str, ...]
            ) -> Callable[[Any], tuple[Any, ...]]:
    """``make(*names)`` (`operator.attrgetter`, `operator.itemgetter`), giving a tuple for a
    single name too."""
    get = make(*names)
    if len(names) > 1:
        return get

    def single(value: Any) -> tuple[Any, ...]:
        return (get(value),)
    return single


def ranks(tokens: Sequence[str], ids: Sequence[str]) -> list[int]:
    """Each of *ids* as its rank of first appearance in *tokens* then *ids*."""
    order = dict(zip(dict.fromkeys([*tokens, *ids]), count()))
    return [*map(order.__getitem__, ids)]


def filled(template: str, ranks: Sequence[int]) -> str:
    """The renamed text: *template* with its NULs replaced by ``#rank`` in order."""
    pieces = template.split("\0")
    return pieces[0] + "".join(f"#{rank}{piece}" for rank, piece in zip(ranks, pieces[1:],
                                                                          strict=True))


