"""The SQLite backend of the benchmark store: one file, the standard library's sqlite3.

The file is recognised before anything is written to it: a file that is not SQLite, an SQLite
database without our marker (someone else's data), one written by a newer schema, or a corrupt
one is refused with ``StoreError`` and left byte-for-byte untouched. Only a missing file or an
empty one (no tables) is initialised; the header's ``application_id`` is set too. A store of an
older schema of ours is upgraded when it is opened, in one transaction
(``store_schema.migration_statements``): nothing saved changes, and a failed upgrade changes
nothing at all.

Several processes may write at once (parallel CI jobs on one host, ``multiprocessing`` writers):
WAL journal, a busy timeout, retries with backoff on "database is locked", and one transaction per
write. (WAL needs a local file system: put the store on local disk, not NFS; runners on several
hosts share a PostgreSQL store instead.)
"""

from __future__ import annotations

import os
import random
import sqlite3
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pytest_gputrain import folders
from pytest_gputrain.regression.store import (
    APPLICATION,
    Store,
    StoreError,
    Writer,
    classify_marker,
    now,
    upgrade_failed,
)
from pytest_gputrain.regression.store_schema import (
    MARKER_TABLE,
    SCHEMA_VERSION,
    Dialect,
    create_statements,
    insert_marker,
    migration_statements,
)
from pytest_gputrain.regression.store_wait import WaitNotice, longest_wait

APPLICATION_ID = 0x47505452  # "GPTR", in the SQLite header (PRAGMA application_id)
SQLITE_MAGIC = b"SQLite format 3\x00"
BUSY_TIMEOUT_S = 30.0
WRITE_ATTEMPTS = 12

_T = TypeVar("_T")

# How the tables of ``store_schema`` are written in SQLite.
DIALECT = Dialect(key="INTEGER PRIMARY KEY AUTOINCREMENT", reference="INTEGER")
_ELSEWHERE = "Set gpu_store / --gpu-store to a file in a folder you can write"
REFUSED = ("; it was left untouched. Move it away or set gpu_store / --gpu-store to another "
           "file")


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def inspect(path: Path) -> str:
    """"missing", "empty" (safe to initialise), "ours" or "older" (ours, of a schema ``open``
    upgrades); ``StoreError`` for anything else.

    Reads only: the header bytes, then a read-only SQLite connection. Never writes.
    """
    if not path.exists():
        return "missing"
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a benchmark store file")
    try:
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"{path} cannot be read: {exc}") from None
    wal = path.with_name(path.name + "-wal")
    if not header and not wal.exists():
        return "empty"
    if header and header != SQLITE_MAGIC:
        raise StoreError(f"{path} is not an SQLite database (not written by pytest-gputrain)"
                         + REFUSED)
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise StoreError(f"{path} cannot be opened: {exc}") from None
    try:
        return _classify(connection, path)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is corrupt or not an SQLite database ({exc})"
                         + REFUSED) from None
    finally:
        connection.close()


def _classify(connection: sqlite3.Connection, path: Path) -> str:
    tables = {row[0] for row in connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    application_id = int(connection.execute("PRAGMA application_id").fetchone()[0])
    if not tables and application_id in (0, APPLICATION_ID):
        return "empty"
    if application_id not in (0, APPLICATION_ID) or MARKER_TABLE not in tables:
        listed = ", ".join(sorted(tables)[:6]) or "none"
        raise StoreError(f"{path} is an SQLite database that pytest-gputrain did not write (no "
                         f"{MARKER_TABLE} marker; tables: {listed})" + REFUSED)
    rows = connection.execute(f"SELECT application, version FROM {MARKER_TABLE}").fetchall()
    return classify_marker(rows, tables, str(path))


def make_folder(folder: Path) -> None:
    """Create the store's folder (and its parents); ``StoreError`` saying why it cannot be."""
    try:
        folders.make_folder(folder)
    except OSError as exc:
        raise StoreError(f"cannot create the folder of the benchmark store {folder}: "
                         f"{exc.strerror or exc}. {_ELSEWHERE}") from None


def check_creatable(path: Path) -> None:
    """``StoreError`` unless a store can be created at ``path``: the nearest existing folder
    above it must take a new folder. Tried for real (a temporary folder, removed at once),
    since permissions alone do not tell (a read-only file system, a root user)."""
    existing = next((p for p in path.parents if p.exists()), None)
    if existing is None:
        return
    if not existing.is_dir():
        raise StoreError(f"cannot create the folder of the benchmark store {path.parent}: "
                         f"{existing} is a file, not a folder. {_ELSEWHERE}")
    try:
        probe = tempfile.mkdtemp(prefix=".gputrain-probe-", dir=existing)
    except OSError as exc:
        raise StoreError(f"cannot create the benchmark store {path}: {existing} is not "
                         f"writable ({exc.strerror or exc}). {_ELSEWHERE}") from None
    os.rmdir(probe)


class _SqliteWriter:
    def __init__(self, connection: sqlite3.Connection) -> None:
        self._connection = connection

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> None:
        self._connection.execute(sql, tuple(parameters))

    def insert(self, sql: str, parameters: Sequence[Any] = ()) -> int:
        return int(self._connection.execute(sql, tuple(parameters)).lastrowid or 0)


class SqliteStore(Store):
    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self.where = str(path)
        self._connection = connection
        self._wait = WaitNotice(self.where, longest_wait(WRITE_ATTEMPTS, BUSY_TIMEOUT_S))

    @classmethod
    def open(cls, path: Path, *, create: bool = True) -> SqliteStore:
        """Open ``path``, creating and initialising it when missing or empty (and ``create``)."""
        state = inspect(path)
        if state == "missing" and not create:
            raise StoreError(f"no benchmark store at {path} (save a run first: --gpu-save=NAME)")
        if state == "missing":
            make_folder(path.parent)
        try:
            connection = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S,
                                         isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"{path} cannot be opened: {exc}") from None
        store = cls(path, connection)
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            connection.execute("PRAGMA foreign_keys = ON")
            if state in ("missing", "empty"):
                store._retry(store._initialise)
            elif state == "older":
                store._retry(store._upgrade)
            store._retry(store._use_wal)
        except StoreError:
            connection.close()
            raise
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise StoreError(f"{path}: {exc}") from None
        return store

    def _initialise(self) -> None:
        with self._transaction() as connection:
            # Re-check under the write lock: another process may have initialised it meanwhile.
            state = _classify(connection, self.path)
            if state == "ours":
                return
            if state == "older":
                self._migrate(connection)
                return
            connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            for statement in create_statements(DIALECT):
                connection.execute(statement)
            connection.execute(insert_marker(DIALECT), (APPLICATION, SCHEMA_VERSION, now()))

    def _upgrade(self) -> None:
        """Bring a store of an older schema up to this one, in one transaction."""
        try:
            with self._transaction() as connection:
                if _classify(connection, self.path) == "older":  # not upgraded meanwhile
                    self._migrate(connection)
        except sqlite3.OperationalError as exc:
            if _is_locked(exc):
                raise  # another writer: _retry tries again
            raise upgrade_failed(str(self.path), self._version(), exc) from None

    def _migrate(self, connection: sqlite3.Connection) -> None:
        version = int(connection.execute(f"SELECT version FROM {MARKER_TABLE}").fetchone()[0])
        for statement in migration_statements(DIALECT, version):
            connection.execute(statement)

    def _version(self) -> int:
        try:
            return int(self._connection.execute(
                f"SELECT version FROM {MARKER_TABLE}").fetchone()[0])
        except (sqlite3.Error, TypeError):
            return 0

    def _use_wal(self) -> None:
        mode = self._connection.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            self._connection.execute("PRAGMA journal_mode = WAL")
        self._connection.execute("PRAGMA synchronous = NORMAL")

    def close(self) -> None:
        self._connection.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        connection = self._connection
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")

    def _retry(self, action: Callable[[], _T]) -> _T:
        """Run a write, retrying while another writer holds the lock past the busy timeout (and
        saying so on stderr when that takes more than a few seconds)."""
        delay = 0.05
        with self._wait.waiting():
            for attempt in range(WRITE_ATTEMPTS):
                try:
                    return action()
                except sqlite3.OperationalError as exc:
                    if not _is_locked(exc) or attempt == WRITE_ATTEMPTS - 1:
                        raise StoreError(f"{self.path}: could not write: {exc}") from None
                    time.sleep(delay * (1 + random.random()))
                    delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")  # pragma: no cover

    def _write(self, action: Callable[[Writer], _T]) -> _T:
        def attempt() -> _T:
            with self._transaction() as connection:
                return action(_SqliteWriter(connection))
        return self._retry(attempt)

    def _rows(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        try:
            return list(self._connection.execute(sql, tuple(parameters)))
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: could not read: {exc}") from None
