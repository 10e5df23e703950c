"""Shared fixtures: one throwaway PostgreSQL server for the whole test session (S29).

The server is started from the installed PostgreSQL programs (``initdb``,
``postgres``; `machine.store.postgres_server`) the first time a test needs it,
listens only on a Unix socket in its temporary directory, and is stopped and
removed at the end of the session. When the programs or psycopg are missing,
every PostgreSQL test fails with a message saying what to install: they are
never skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from machine.store.errors import StoreError
from machine.store.postgres_server import TemporaryPostgres

_SCHEMAS = itertools.count(1)


@pytest.fixture(scope="session")
def postgres() -> Iterator[TemporaryPostgres]:
    """The session's PostgreSQL server (fsync off: a throwaway server)."""
    problem: str | None = None
    try:
        import psycopg  # noqa: F401
    except ImportError as error:
        problem = (f"the PostgreSQL store tests need psycopg 3 and libpq ({error}): "
                   "pip install -e '.[dev]' (or 'psycopg[binary]'), and the Debian package libpq5")
    server: TemporaryPostgres | None = None
    if problem is None:
        try:
            server = TemporaryPostgres(fsync=False).start()
        except StoreError as error:
            problem = f"the PostgreSQL store tests need a PostgreSQL server: {error}"
    if server is None:
        pytest.fail(problem or "no PostgreSQL server", pytrace=False)  # never a silent skip
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def pg_schema(postgres: TemporaryPostgres) -> str:
    """A schema name used by this test only (each test gets empty tables)."""
    if not postgres.running:  # a test that stopped the server and failed before restarting it
        postgres.start()
    return f"t{os.getpid()}_{next(_SCHEMAS)}"


@pytest.fixture
def postgres_store(postgres: TemporaryPostgres, pg_schema: str) -> Iterator[Callable[..., Any]]:
    """A factory of `PostgresStore` instances over this test's schema (a new instance = a
    new host); keyword arguments are passed on (``fsync`` defaults to false)."""
    from machine.store.postgres import PostgresStore

    opened: list[PostgresStore] = []

    def make(**options: Any) -> PostgresStore:
        store = PostgresStore(postgres.conninfo, schema=pg_schema, **{"fsync": False, **options})
        opened.append(store)
        return store

    yield make
    for store in opened:
        with contextlib.suppress(StoreError):  # a test may leave a store without its server
            store.close()
