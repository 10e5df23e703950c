"""``turnstile log show|repair|fork`` over stored sessions (specs/persistence.md, S22).

A TARGET names a stored session:

* ``DIR/ID.jsonl``: the JSONL session ``ID`` of the store in ``DIR``;
* ``DIR --session ID``: the same;
* ``FILE.db --session ID`` (any SQLite file): session ``ID`` of a SQLite store;
* ``postgresql://… --session ID [--schema NAME]``: session ``ID`` of a PostgreSQL
  store (S23); a URL's password is never printed.

Exit status: 0 on success, 1 when the session is damaged or the operation is
refused, 2 for usage errors and unreadable targets.
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import urllib.parse
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, TextIO

from machine.cli import argtypes
from machine.cli.terminal import STDIN, read_bytes, shown
from machine.errors import TurnstileError
from machine.events import Event
from machine.jsonvalue import FrozenDict, FrozenList
from machine.store.base import BaseStore
from machine.store.errors import DamageError, SessionNotFoundError, StoreError
from machine.store.jsonl import SUFFIX, JsonlStore
from machine.store.postgres import DEFAULT_SCHEMA, PostgresStore
from machine.store.sqlite import SqliteStore
from machine.store.types import Damage, Inspection, SessionInfo

__all__ = ["LOG_SUBCOMMANDS", "configure", "describe"]

EXIT_OK: Final = 0
EXIT_INVALID: Final = 1
EXIT_USAGE: Final = 2
_SQLITE_MAGIC: Final = b"SQLite format 3\x00"
_POSTGRES_URL: Final = re.compile(r"postgres(?:ql)?://", re.IGNORECASE)


class _UsageError(Exception):
    pass


def configure(subcommands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add ``show``, ``repair`` and ``fork`` to the ``log`` sub-parsers."""
    show = subcommands.add_parser(
        "show", help="print a stored session and what loading it would repair",
        description="Print the header and events of a stored session (JSONL, SQLite or "
                    "PostgreSQL store), "
                    "any damage with its position, and the repair a load would make. "
                    "Read-only. Exit status 1 when the session is damaged.")
    _target(show)
    show.add_argument("--json", action="store_true",
                      help="print only the intact events, one JSON event per line (the "
                           "format `log validate` reads)")
    repair = subcommands.add_parser(
        "repair", help="load a stored session, repairing it durably",
        description="Load a stored session: cut a torn final record, close an interrupted "
                    "turn (crash repair, semantics §22). Damage is reported and nothing is "
                    "written, unless --salvage keeps the intact prefix (the damaged original "
                    "is kept aside).")
    _target(repair)
    repair.add_argument("--salvage", action="store_true",
                        help="keep the intact prefix of a damaged session instead of failing")
    fork = subcommands.add_parser(
        "fork", help="fork a stored session at a turn boundary",
        description="Load (and so repair) a stored session and copy its prefix up to seq "
                    "--at (default: the last event) into a new session of the same store.")
    _target(fork)
    fork.add_argument("--at", type=argtypes.count, metavar="SEQ",
                      help="the inclusive boundary seq")
    fork.add_argument("--child", metavar="ID", help="the child session id (default: fresh)")


def _target(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("target", metavar="TARGET",
                        help="DIR/ID.jsonl, or a store directory, SQLite file or postgresql:// "
                             "URL with --session ('-': a JSONL session file on standard "
                             "input, for show)")
    parser.add_argument("--session", metavar="ID", help="the session id inside TARGET")
    parser.add_argument("--schema", metavar="NAME",
                        help=f"the schema of a PostgreSQL store (default {DEFAULT_SCHEMA})")


def _shown(target: str) -> str:
    """TARGET as it may be printed: a URL without its password."""
    if not _POSTGRES_URL.match(target):
        return target
    parts = urllib.parse.urlsplit(target)
    if parts.password is None:
        return target
    netloc = parts.netloc.rsplit("@", 1)[-1]
    user = parts.username or ""
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{netloc}"))


def _from_stdin(args: argparse.Namespace, scratch: Path) -> tuple[BaseStore[Any], str, str]:
    """``log show -``: the JSONL store session file on standard input, copied into the
    store directory *scratch* under the id its header names."""
    if args.log_command != "show":
        raise _UsageError(f"{shown(STDIN)}: `log {args.log_command}` writes the session back "
                          "into its store: name the file")
    data = read_bytes(STDIN)
    first = data.split(b"\n", 1)[0]
    try:
        header = json.loads(first) if first.startswith(b'{"crc":') else None
    except ValueError:
        header = None
    if not isinstance(header, dict) or header.get("kind") != "header" \
            or not isinstance(header.get("session"), str):
        raise _UsageError(f"{shown(STDIN)}: not a JSONL store session file (a session log, one "
                          "event per line, is read by `turnstile log validate -`)")
    session: str = header["session"]
    if args.session is not None and args.session != session:
        raise _UsageError(f"{shown(STDIN)}: --session {args.session} does not match the "
                          f"session {session!r} of its header")
    try:
        (scratch / f"{session}{SUFFIX}").write_bytes(data)
    except (OSError, ValueError) as error:      # an id no file can be named after
        raise _UsageError(f"{shown(STDIN)}: session id {session!r}: {error}") from None
    return JsonlStore(scratch), session, shown(STDIN)


def _open(args: argparse.Namespace) -> tuple[BaseStore[Any], str, str]:
    """The store, session id and a display name for TARGET (read-only resolution)."""
    session: str | None = args.session
    if _POSTGRES_URL.match(args.target):
        if session is None:
            raise _UsageError(f"{_shown(args.target)}: a PostgreSQL store needs --session ID")
        store = PostgresStore(args.target, schema=args.schema or DEFAULT_SCHEMA, create=False)
        return store, session, f"{store.where}#{session}"
    if args.schema is not None:
        raise _UsageError(f"{args.target}: --schema applies to postgresql:// targets only")
    path = Path(args.target)
    if not path.exists():
        raise _UsageError(f"{path}: no such file or directory")
    if path.is_dir():
        if session is None:
            raise _UsageError(f"{path}: a store directory needs --session ID")
        return JsonlStore(path), session, f"{path}/{session}{SUFFIX}"
    with path.open("rb") as file:
        magic = file.read(len(_SQLITE_MAGIC))
    if magic == _SQLITE_MAGIC:
        if session is None:
            raise _UsageError(f"{path}: a SQLite store needs --session ID")
        return SqliteStore(path, create=False), session, f"{path}#{session}"
    if path.name.endswith(SUFFIX):
        stem = path.name[:-len(SUFFIX)]
        if session is not None and session != stem:
            raise _UsageError(f"{path}: --session {session} does not match the file name")
        return JsonlStore(path.parent), stem, str(path)
    raise _UsageError(f"{path}: not a JSONL session file (*{SUFFIX}) or a SQLite database")


_Body = Callable[[argparse.Namespace, "BaseStore[Any]", str, str, TextIO], int]


def _with_store(args: argparse.Namespace, out: TextIO, body: _Body) -> int:
    """Resolve TARGET, run *body*, map errors to verdict lines and exit statuses."""
    if args.target != STDIN:
        return _with_target(args, out, body, None)
    with tempfile.TemporaryDirectory(prefix="turnstile-stdin-") as scratch:
        return _with_target(args, out, body, Path(scratch))


def _with_target(args: argparse.Namespace, out: TextIO, body: _Body,
                 scratch: Path | None) -> int:
    try:
        store, session, name = _open(args) if scratch is None else _from_stdin(args, scratch)
    except _UsageError as error:
        print(error, file=out)
        return EXIT_USAGE
    except (StoreError, OSError, ValueError) as error:  # ValueError: a bad --schema or URL
        print(f"{_shown(args.target)}: {error}", file=out)
        return EXIT_USAGE
    try:
        status = body(args, store, session, name, out)
    except SessionNotFoundError as error:
        print(f"{name}: {error}", file=out)
        status = EXIT_USAGE
    except DamageError as error:
        _print_damage(name, error.damage, out)
        status = EXIT_INVALID
    except TurnstileError as error:
        print(f"{name}: {error} [{error.code}]", file=out)
        status = EXIT_INVALID
    except BrokenPipeError:
        raise                       # the reader went away: `turnstile` ends quietly (RT27)
    except OSError as error:
        print(f"{name}: {error}", file=out)
        status = EXIT_USAGE
    try:
        store.close()
    except (TurnstileError, OSError) as error:  # the final flush failed
        print(f"{name}: cannot close the store: {error}", file=out)
        status = max(status, EXIT_INVALID)
    return status


def _print_damage(name: str, damage: Sequence[Damage], out: TextIO) -> None:
    print(f"{name}: DAMAGED ({len(damage)} problem{'' if len(damage) == 1 else 's'})", file=out)
    for item in damage:
        print(f"  {item}", file=out)


# --------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------


def _preview(text: str, width: int = 60) -> str:
    flat = " ".join(text.split())
    return repr(flat if len(flat) <= width else flat[:width - 1] + "…")


def _message_text(message: object) -> str:
    if not isinstance(message, FrozenDict):
        return ""
    parts: list[str] = []
    content = message.get("content")
    for block in content if isinstance(content, FrozenList) else ():
        if not isinstance(block, FrozenDict):
            continue
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "tool-call":
            parts.append(f"<call {block.get('id')} {block.get('name')}>")
        elif kind == "tool-result":
            parts.append(f"<result {block.get('toolCallId')}>")
        else:
            parts.append(f"<{kind}>")
    return " ".join(parts)


def describe(event: Event) -> str:
    """A one-line summary of an event for ``log show``: seq, type and the gist of its data."""
    return f"{event.seq:>5} {event.type:<18} {_gist(event)}".rstrip()


def _gist(event: Event) -> str:
    data, kind = event.data, event.type
    turn, step = data.get("turn"), data.get("step")
    if kind == "turn/start":
        trigger = data.get("trigger")
        detail = f"turn {turn} ({trigger.get('kind') if isinstance(trigger, FrozenDict) else '?'})"
    elif kind == "turn/end":
        reason = data.get("reason")
        detail = f"turn {turn} {reason.get('kind') if isinstance(reason, FrozenDict) else '?'}"
    elif kind in ("step/start", "step/end"):
        detail = f"step {turn}.{step}"
    elif kind == "user/message":
        source = data.get("source")
        source_kind = source.get("kind") if isinstance(source, FrozenDict) else "?"
        detail = f"[{source_kind}] {_preview(_message_text(data))}"
    elif kind in ("assistant/message", "steering/message"):
        detail = f"{_preview(_message_text(data.get('message')))}"
    elif kind == "assistant/chunk":
        chunk = data.get("chunk")
        detail = f"{chunk.get('type') if isinstance(chunk, FrozenDict) else '?'}"
    elif kind == "tool/call":
        detail = f"{data.get('callId')} {data.get('name')}"
    elif kind == "tool/result":
        message = data.get("message")
        source = message.get("source") if isinstance(message, FrozenDict) else None
        call_id = source.get("callId") if isinstance(source, FrozenDict) else "?"
        error = data.get("error")
        detail = f"{call_id}" + (f" {error.get('code')}" if isinstance(error, FrozenDict) else "")
    elif kind == "request/header":
        detail = f"{data.get('reason')}"
    else:
        detail = ""
    op = event.surface_op
    if isinstance(op, FrozenDict):
        detail += f" (replaces {op.get('start')}..{op.get('end')})"
    return detail


def _header_line(name: str, info: SessionInfo) -> str:
    parts = [f"session {info.session_id}"]
    if info.parent is not None:
        parts.append(f"forked from {info.parent} after {info.seed_length} events")
    if info.cwd is not None:
        parts.append(f"cwd {info.cwd}")
    if info.version == 1:
        parts.append("format version 1 (its records carry no session identity, S30)")
    return f"{name}: " + ", ".join(parts)


def _repair_summary(truncated: int, closers: Sequence[Event], *, done: bool = False) -> list[str]:
    lines: list[str] = []
    if truncated:
        lines.append(f"cut off a torn final record ({truncated} bytes)")
    if closers:
        kinds = ", ".join(f"{event.type} {_gist(event)}" for event in closers)
        verb = "appended" if done else "append"
        lines.append(f"{verb} {len(closers)} closer{'' if len(closers) == 1 else 's'}: {kinds}")
    return lines


def _show(args: argparse.Namespace, store: BaseStore[Any], session: str, name: str,
          out: TextIO) -> int:
    seen: Inspection = store.inspect(session)
    if args.json:
        for event in seen.events:
            print(json.dumps(event.to_json(), ensure_ascii=False), file=out)
        return EXIT_INVALID if seen.report.damage else EXIT_OK
    print(_header_line(name, seen.info), file=out)
    for event in seen.events:
        print(describe(event), file=out)
    turns = sum(1 for event in seen.events if event.type == "turn/start")
    print(f"{len(seen.events)} intact event{'' if len(seen.events) == 1 else 's'} of "
          f"{seen.stored_records} stored, {turns} turn{'' if turns == 1 else 's'}", file=out)
    if seen.report.damage:
        _print_damage(name, seen.report.damage, out)
        print("a strict load fails; `turnstile log repair --salvage` keeps the intact prefix "
              "and would " + ("; ".join(_repair_summary(0, seen.closers))
                              or "append nothing"), file=out)
        return EXIT_INVALID
    repairs = _repair_summary(seen.report.truncated_bytes, seen.closers)
    print("a load would " + "; ".join(repairs) if repairs else "nothing to repair", file=out)
    return EXIT_OK


# --------------------------------------------------------------------------
# repair and fork
# --------------------------------------------------------------------------


def _repair(args: argparse.Namespace, store: BaseStore[Any], session: str, name: str,
            out: TextIO) -> int:
    result = store.load(session, "salvage" if args.salvage else "strict")
    report = result.report
    closers = result.events[len(result.events) - report.closers_appended:] \
        if report.closers_appended else []
    if report.damage:
        _print_damage(name, report.damage, out)
        print(f"{name}: SALVAGED: kept {len(result.events) - report.closers_appended} events; "
              f"the damaged original is kept at {report.quarantine}", file=out)
    done = _repair_summary(report.truncated_bytes, closers, done=True)
    if done:
        print(f"{name}: REPAIRED: " + "; ".join(done), file=out)
    elif not report.damage:
        print(f"{name}: OK (nothing to repair, {len(result.events)} events)", file=out)
    return EXIT_OK


def _fork(args: argparse.Namespace, store: BaseStore[Any], session: str, name: str,
          out: TextIO) -> int:
    result = store.load(session)
    if result.report.closers_appended or result.report.truncated_bytes:
        print(f"{name}: repaired before forking "
              f"({result.report.closers_appended} closers appended)", file=out)
    child = store.fork(session, args.at, args.child)
    length = store.info(child).seed_length
    where = str(store.path(child)) if isinstance(store, JsonlStore) else f"{child}"
    print(f"{name}: forked {length} event{'' if length == 1 else 's'} into session {child} "
          f"({where})", file=out)
    return EXIT_OK


LOG_SUBCOMMANDS: Final[dict[str, Callable[[argparse.Namespace, TextIO], int]]] = {
    "show": lambda args, out: _with_store(args, out, _show),
    "repair": lambda args, out: _with_store(args, out, _repair),
    "fork": lambda args, out: _with_store(args, out, _fork),
}
