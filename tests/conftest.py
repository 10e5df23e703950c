"""Suite-wide settings: tests independent of machine speed, and a gate that points at the rule.

Hypothesis. Nothing in the suite may depend on how fast the machine is (CI is a
loaded 2-core machine; ASSURANCE §6): the one health check that measures speed
(``too_slow``) and the per-example ``deadline`` are off in every profile loaded
here. ``turnstile`` is the default; with ``CI`` set, ``turnstile-ci`` also
derandomizes and drops the example database (Hypothesis's own ``ci`` profile),
so a run's verdict does not depend on earlier runs. Test-specific settings
(``@settings(...)``, the differential profiles) inherit from the loaded one.

Order. Specific tests run first and the broad ones last (`BROAD`): the whole
corpus, the benchmark harness, the differential and exhaustive checks, the
runtime equivalence and CrossHair. A bug then first shows up as the rule-named
test that pins it, not as a corpus-wide failure. Broad tests carry the
``broad`` marker: ``pytest -m "not broad"`` is the quick loop.

The loop's graph (R4.13). Every phase change of every core in the test session is
checked against the declared graph (`machine.core.loop.check_phase_changes`), whether
or not an invariant monitor watches that core, and a test that leaves a change off the
graph behind fails (`_the_loop_kept_to_its_graph`).

PostgreSQL. One throwaway server for the whole test session (S29), started from
the installed PostgreSQL programs (``initdb``, ``postgres``;
`machine.store.postgres_server`) the first time a test needs it, listening only
on a Unix socket in its temporary directory, and stopped and removed at the end
of the session. When the programs or psycopg are missing, every PostgreSQL test
fails with a message saying what to install: they are never skipped.
"""

from __future__ import annotations

import contextlib
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any, TypedDict

import pytest
from hypothesis import HealthCheck, settings

from machine.core import loop
from machine.store.errors import StoreError
from machine.store.postgres_server import TemporaryPostgres


class _SpeedIndependent(TypedDict):
    """The settings every profile loaded here shares (typed, so that ``**`` unpacking cannot
    be taken for ``register_profile``'s ``parent``)."""

    deadline: None
    suppress_health_check: list[HealthCheck]


SPEED_INDEPENDENT: _SpeedIndependent = {"deadline": None,
                                        "suppress_health_check": [HealthCheck.too_slow]}

settings.register_profile("turnstile", **SPEED_INDEPENDENT)
settings.register_profile("turnstile-ci", parent=settings.get_profile("ci"),
                          **SPEED_INDEPENDENT)
settings.load_profile("turnstile-ci" if os.environ.get("CI") else "turnstile")

#: Broad tests, run last in this order (cheapest first): (module file, test name prefix or "").
BROAD: tuple[tuple[str, str], ...] = (
    ("test_conformance_vectors.py", ""),
    ("test_conformance_port.py", "test_turnstile_adapter_passes_the_whole_corpus"),
    ("test_bench_smoke.py", ""),
    ("test_runtime_equivalence.py", ""),
    ("test_decisions.py", "test_crosshair"),
    ("test_differential.py", "test_R19_differential"),
    ("test_explore.py", "test_R20_1_exhaustive"),
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "broad: a corpus-wide or exhaustive check, run last "
                            "(tests/conftest.py BROAD)")


def _broad_rank(item: pytest.Item) -> int | None:
    module = item.path.name
    for rank, (file, prefix) in enumerate(BROAD):
        if module == file and item.name.startswith(prefix):
            return rank
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    specific: list[pytest.Item] = []
    broad: list[tuple[int, int, pytest.Item]] = []
    for index, item in enumerate(items):
        rank = _broad_rank(item)
        if rank is None:
            specific.append(item)
        else:
            item.add_marker(pytest.mark.broad)
            broad.append((rank, index, item))
    items[:] = specific + [item for _, _, item in sorted(broad, key=lambda b: (b[0], b[1]))]


_SCHEMAS = itertools.count(1)


loop.check_phase_changes()


@pytest.fixture(autouse=True)
def _the_loop_kept_to_its_graph() -> Iterator[None]:
    """R4.13: no phase change of the test went off the loop's declared graph."""
    loop.take_violations()
    yield
    left = loop.take_violations()
    assert not left, f"R4.13: the loop went off its declared graph: {left}"


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


@pytest.fixture
def restored_registries() -> Iterator[None]:
    """Restore the extension registries after a test that registers (V3, V4)."""
    from machine import vocabulary
    blocks, sources = dict(vocabulary._block_checks), dict(vocabulary._source_checks)
    yield
    vocabulary._block_checks.clear()
    vocabulary._block_checks.update(blocks)
    vocabulary._source_checks.clear()
    vocabulary._source_checks.update(sources)
    vocabulary._MAPPED.clear()
