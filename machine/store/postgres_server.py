"""A throwaway PostgreSQL server for tests and benchmarks (specs/persistence.md, S29).

`TemporaryPostgres` runs the server programs of an installed PostgreSQL
(``initdb`` and ``postgres``) in a new temporary directory: the data
directory and the Unix socket both live there, nothing listens on TCP, and
`close` stops the server and removes the directory. PostgreSQL refuses to
run as root, so under euid 0 the server runs as the ``postgres`` account
(which the Debian package creates), or ``nobody`` when there is none.

Not used by the store itself; it needs no Python package beyond the
standard library::

    with TemporaryPostgres() as server:
        store = PostgresStore(server.conninfo)
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Final, Literal

from machine.store.errors import StoreError

__all__ = ["PostgresNotFoundError", "ServerStartError", "TemporaryPostgres", "find_server_binaries"]

#: The environment variable naming a directory holding ``initdb`` and ``postgres``.
BIN_ENV: Final = "TURNSTILE_PG_BIN"
SUPERUSER: Final = "turnstile"
PORT: Final = 5432  # only names the socket file: nothing listens on TCP
_SOCKET_PATH_MAX: Final = 100  # sun_path holds 108 bytes; leave room for "/.s.PGSQL.5432"

INSTALL_HINT: Final = ("install the PostgreSQL server (Debian/Ubuntu: `apt-get install postgresql`; "
                       "Fedora: `dnf install postgresql-server`; macOS: `brew install postgresql`) "
                       f"or point {BIN_ENV} at the directory holding initdb and postgres")

ShutdownMode = Literal["smart", "fast", "immediate"]
_SIGNALS: Final = {"smart": signal.SIGTERM, "fast": signal.SIGINT, "immediate": signal.SIGQUIT}

#: Settings for a disposable server: small, quiet, Unix socket only.
DEFAULT_SETTINGS: Final[Mapping[str, str]] = {
    "listen_addresses": "",
    "max_connections": "60",
    "shared_buffers": "32MB",
    "log_min_messages": "warning",
    "log_min_error_statement": "panic",
    "logging_collector": "off",
}


class PostgresNotFoundError(StoreError):
    """The PostgreSQL server programs are not installed where they are looked for."""

    code = "POSTGRES_NOT_FOUND"


class ServerStartError(StoreError):
    """The temporary server could not be initialised or started (its log is quoted)."""

    code = "POSTGRES_START_FAILED"


def _version_key(path: str) -> tuple[int, ...]:
    version = Path(path).parent.name
    return tuple(int(part) for part in version.split(".") if part.isdigit())


def find_server_binaries(bin_dir: str | os.PathLike[str] | None = None) -> Path:
    """The directory holding ``initdb`` and ``postgres``.

    Looked for in *bin_dir*, then ``$TURNSTILE_PG_BIN``, then beside ``initdb`` on ``PATH``,
    then in ``/usr/lib/postgresql/<version>/bin`` (the newest version; where Debian puts
    them) and ``/usr/pgsql-<version>/bin``. Raises `PostgresNotFoundError` saying what to
    install."""
    candidates: list[Path] = []
    if bin_dir is not None:
        candidates.append(Path(bin_dir))
    elif os.environ.get(BIN_ENV):
        candidates.append(Path(os.environ[BIN_ENV]))
    else:
        on_path = shutil.which("initdb")
        if on_path is not None:
            candidates.append(Path(on_path).resolve().parent)
        for pattern in ("/usr/lib/postgresql/*/bin/initdb", "/usr/pgsql-*/bin/initdb"):
            found = sorted(glob.glob(pattern), key=_version_key, reverse=True)
            candidates.extend(Path(path).parent for path in found)
    for directory in candidates:
        if all(os.access(directory / name, os.X_OK) for name in ("initdb", "postgres")):
            return directory
    looked = ", ".join(str(c) for c in candidates) or "PATH, /usr/lib/postgresql/*/bin"
    raise PostgresNotFoundError(f"PostgreSQL server programs (initdb, postgres) not found "
                                f"(looked in {looked}): {INSTALL_HINT}")


def _server_account() -> tuple[int, int] | None:
    """The (uid, gid) to run the server as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            entry = pwd.getpwnam(name)
        except KeyError:
            continue
        return entry.pw_uid, entry.pw_gid
    raise ServerStartError("running as root, and there is neither a 'postgres' nor a 'nobody' "
                           "account to run the PostgreSQL server as (it refuses to run as root)")


def _reachable_by_others(path: Path) -> bool:
    """Whether every directory above *path* lets other users through (for a server running
    as another account than root's)."""
    return all(os.stat(parent).st_mode & stat.S_IXOTH for parent in path.resolve().parents)


def _base_directory(account: tuple[int, int] | None) -> str:
    base = tempfile.gettempdir()
    too_long = len(base) > _SOCKET_PATH_MAX - 30
    if too_long or (account is not None and not _reachable_by_others(Path(base) / "x")):
        base = "/tmp"
    return base


class TemporaryPostgres:
    """A PostgreSQL server of its own in a temporary directory (S29).

    *settings* are added to (and override) `DEFAULT_SETTINGS` as ``-c`` options; *fsync*
    false turns the server's fsync off (for tests: a crash of the server process keeps
    everything, a crash of the machine does not). ``conninfo`` is the libpq connection string
    of the ``postgres`` database, ``url`` the same as a URL.
    """

    def __init__(self, *, bin_dir: str | os.PathLike[str] | None = None,
                 settings: Mapping[str, str] | None = None, fsync: bool = True,
                 start_timeout: float = 60.0) -> None:
        self.bin_dir = find_server_binaries(bin_dir)
        self.settings = {**DEFAULT_SETTINGS, "fsync": "on" if fsync else "off",
                         "full_page_writes": "on" if fsync else "off", **(settings or {})}
        self.start_timeout = start_timeout
        self._account = _server_account()
        self.directory: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None

    # -- where --------------------------------------------------------------------

    @property
    def socket_dir(self) -> Path:
        if self.directory is None:
            raise ServerStartError("the temporary server has not been started")
        return self.directory

    @property
    def data_dir(self) -> Path:
        return self.socket_dir / "data"

    @property
    def log_path(self) -> Path:
        return self.socket_dir / "server.log"

    def dsn(self, dbname: str = "postgres") -> str:
        """The libpq connection string of database *dbname* on this server."""
        return f"host={self.socket_dir} port={PORT} user={SUPERUSER} dbname={dbname}"

    @property
    def conninfo(self) -> str:
        return self.dsn()

    @property
    def url(self) -> str:
        quoted = str(self.socket_dir).replace("/", "%2F")
        return f"postgresql://{SUPERUSER}@/postgres?host={quoted}&port={PORT}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        """The postmaster's process id while it runs."""
        return self._process.pid if self.running and self._process is not None else None

    # -- life cycle ---------------------------------------------------------------

    def start(self) -> TemporaryPostgres:
        """Initialise the data directory (the first time) and start the server; returns once
        it accepts connections."""
        if self.running:
            return self
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="turnstile-pg-",
                                                   dir=_base_directory(self._account)))
            if self._account is not None:
                os.chown(self.directory, *self._account)
            self._initdb()
        self._spawn()
        return self

    def stop(self, mode: ShutdownMode = "fast", timeout: float = 60.0) -> None:
        """Stop the server: ``smart`` waits for clients, ``fast`` disconnects them and shuts
        down cleanly, ``immediate`` kills it like a crash (recovery runs at the next start)."""
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(_SIGNALS[mode])
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def restart(self, mode: ShutdownMode = "fast") -> None:
        """Stop the server (see `stop`) and start it again on the same data directory."""
        self.stop(mode)
        self._spawn()

    def close(self) -> None:
        """Stop the server and remove its directory. Idempotent."""
        self.stop("immediate")
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
            self.directory = None

    def __enter__(self) -> TemporaryPostgres:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------

    def _run_as(self) -> dict[str, object]:
        if self._account is None:
            return {}
        uid, gid = self._account
        return {"user": uid, "group": gid, "extra_groups": []}

    def _initdb(self) -> None:
        command = [str(self.bin_dir / "initdb"), "--pgdata", str(self.data_dir), "--username",
                   SUPERUSER, "--auth", "trust", "--encoding", "UTF8", "--locale", "C",
                   "--no-sync", "--no-instructions"]
        try:
            done = subprocess.run(command, cwd=self.socket_dir, capture_output=True, text=True,
                                  timeout=self.start_timeout, check=False,
                                  **self._run_as())  # type: ignore[call-overload]
        except (OSError, subprocess.SubprocessError) as error:
            raise ServerStartError(f"initdb failed to run: {error}") from error
        if done.returncode != 0:
            raise ServerStartError(f"initdb exited with status {done.returncode}: "
                                   f"{(done.stderr or done.stdout).strip()[-2000:]}")

    def _spawn(self) -> None:
        options: list[str] = []
        for name, value in self.settings.items():
            options += ["-c", f"{name}={value}"]
        command = [str(self.bin_dir / "postgres"), "-D", str(self.data_dir), "-k",
                   str(self.socket_dir), "-p", str(PORT), *options]
        log = open(self.log_path, "ab")  # noqa: SIM115 - handed to the child, closed below
        try:
            self._process = subprocess.Popen(  # type: ignore[call-overload]
                command, cwd=self.socket_dir, stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, **self._run_as())
        except OSError as error:
            raise ServerStartError(f"cannot start postgres: {error}") from error
        finally:
            log.close()
        self._wait_ready()

    def _wait_ready(self) -> None:
        """Until postmaster.pid says ``ready`` (what pg_ctl waits for), or the server exits."""
        pid_file = self.data_dir / "postmaster.pid"
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise ServerStartError(f"postgres exited at start: {self._log_tail()}")
            try:
                lines = pid_file.read_text().splitlines()
            except OSError:
                lines = []
            if self._process is not None and len(lines) >= 8 \
                    and lines[0].strip() == str(self._process.pid) and lines[7].strip() == "ready":
                return
            time.sleep(0.02)
        self.stop("immediate")
        raise ServerStartError(f"postgres did not become ready within {self.start_timeout} s: "
                               f"{self._log_tail()}")

    def _log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace").strip()[-2000:] or "(empty log)"
        except OSError as error:
            return f"(no log: {error})"
