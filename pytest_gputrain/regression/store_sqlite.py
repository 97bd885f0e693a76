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

Reading (``SqliteStore.open_for_reading``, and ``inspect``) changes nothing: a connection that
cannot write (``_read_connection``), a store that is not a regular file refused before it is
opened, a missing or empty one left as it is. A store another process holds locked is waited
for, reads as writes (``_retrying``), and is called locked, never damaged.
"""

from __future__ import annotations

import os
import random
import sqlite3
import stat
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pytest_gputrain import folders
from pytest_gputrain.outputs import what_it_is
from pytest_gputrain.regression.store import (
    APPLICATION,
    NOT_TEXT,
    Store,
    StoreError,
    Writer,
    classify_marker,
    now,
    upgrade_failed,
)
from pytest_gputrain.regression.store_location import describe
from pytest_gputrain.regression.store_schema import (
    MARKER_TABLE,
    SCHEMA_VERSION,
    Dialect,
    added_after,
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


# SQLite's primary result codes (an extended code's low byte) that tell "locked" from
# "damaged" (Python 3.11+ gives them; before, the message is read).
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_CANTOPEN = 5, 6, 14
SQLITE_CORRUPT, SQLITE_NOTADB = 11, 26


def _result_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    return code & 0xFF if isinstance(code, int) else None


def _is_locked(exc: sqlite3.Error) -> bool:
    code = _result_code(exc)
    if code is not None:
        return code in (SQLITE_BUSY, SQLITE_LOCKED)
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def _is_corrupt(exc: sqlite3.Error) -> bool:
    code = _result_code(exc)
    if code is not None:
        return code in (SQLITE_CORRUPT, SQLITE_NOTADB)
    return not isinstance(exc, sqlite3.OperationalError)


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


def holders(path: Path) -> str:
    """The other processes that hold a lock on the store (its file, or the -shm, -wal or
    -journal file beside it), in words; "" where none is known."""
    from pytest_gputrain.collect.file_locks import lock_holders

    found = lock_holders([path, *(_beside(path, s) for s in ("-shm", "-wal", "-journal"))])
    return " and ".join(str(holder) for holder in found[:3])


def _notice(path: Path) -> WaitNotice:
    return WaitNotice(describe(path), longest_wait(WRITE_ATTEMPTS, BUSY_TIMEOUT_S),
                      holders=lambda: holders(path))


def _retrying(path: Path, notice: WaitNotice, action: Callable[[], _T], doing: str) -> _T:
    """Run ``action`` (a read or a write), retrying while another process holds the lock past
    the busy timeout, and saying so on stderr when that takes more than a few seconds. Locked
    to the end, a ``StoreError`` that says so (the store is healthy: it is never called
    damaged, nor is moving it away advised); other SQLite errors pass."""
    delay = 0.05
    with notice.waiting(doing):
        for attempt in range(WRITE_ATTEMPTS):
            try:
                return action()
            except sqlite3.DatabaseError as exc:
                if not _is_locked(exc):
                    raise
                if attempt == WRITE_ATTEMPTS - 1:
                    raise StoreError(
                        f"{describe(path)} is locked: another process{notice.who()} held it "
                        f"for all of {notice.longest}; it was left untouched. Run again when "
                        "that process has finished") from None
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
    raise AssertionError("unreachable")  # pragma: no cover


def _status(path: Path) -> os.stat_result | None:
    """The store file's status (a link followed), None where there is none; ``StoreError``
    for anything but a regular file: SQLite would make a journal beside a device
    (``/dev/null-journal``), so nothing is opened."""
    try:
        status = os.stat(path)
    except (FileNotFoundError, NotADirectoryError):  # a file in the way: check_creatable says
        return None
    except OSError as exc:
        raise StoreError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if stat.S_ISDIR(status.st_mode):
        raise StoreError(f"{path} is a directory, not a benchmark store file")
    if not stat.S_ISREG(status.st_mode):
        raise StoreError(f"{path} is {what_it_is(status.st_mode)}, not a benchmark store: a "
                         "store is a regular file; nothing was opened or created beside it. "
                         f"{_ELSEWHERE}")
    return status


def inspect(path: Path) -> str:
    """"missing", "empty" (safe to initialise), "ours" or "older" (ours, of a schema ``open``
    upgrades); ``StoreError`` for anything else.

    Reads only: the header bytes, then a connection that cannot write (``_read_connection``).
    A store another process holds locked is waited for, and never called damaged.
    """
    if _status(path) is None:
        return "missing"
    try:
        with path.open("rb") as handle:
            header = handle.read(len(SQLITE_MAGIC))
    except OSError as exc:
        raise StoreError(f"{path} cannot be read: {exc.strerror or exc}") from None
    if not header and not _beside(path, "-wal").exists():
        return "empty"
    if header and header != SQLITE_MAGIC:
        raise StoreError(f"{path} is not an SQLite database (not written by pytest-gputrain)"
                         + REFUSED)

    def classify() -> str:
        connection = _read_connection(path)
        try:
            return _classify(connection, path)
        finally:
            connection.close()

    try:
        return _retrying(path, _notice(path), classify, "using it")
    except sqlite3.DatabaseError as exc:
        raise _unreadable(path, exc) from None


def _unreadable(path: Path, exc: sqlite3.DatabaseError) -> StoreError:
    if _is_corrupt(exc):
        return StoreError(f"{path} is corrupt or not an SQLite database ({exc})" + REFUSED)
    return StoreError(f"{path} cannot be read: {exc}; it was left untouched")


def _read_connection(path: Path) -> sqlite3.Connection:
    """A connection that reads the store and can change nothing in it (``query_only``).

    Where the store and its folder can be written, it is a read-write connection: while it
    reads, SQLite keeps the WAL's ``-shm`` and ``-wal`` files beside the store (as for any
    write), and removes them when the last connection closes, so the folder is left as it
    was. Where they cannot (a read-only mount, such as a CI cache), it is a read-only one, and
    where SQLite cannot make its ``-shm`` file there either, an immutable one: where nothing
    can be created, no other process can write to the store. Raises ``sqlite3`` errors (a
    locked store among them) for the caller to wait on or report."""
    uri = "file:" + urllib.parse.quote(str(path.resolve()))
    writable = os.access(path, os.W_OK) and os.access(path.parent, os.W_OK | os.X_OK)
    modes = ["mode=rw"] if writable else ["mode=ro", "mode=ro&immutable=1"]
    for index, mode in enumerate(modes):
        try:
            connection = sqlite3.connect(f"{uri}?{mode}", uri=True, timeout=BUSY_TIMEOUT_S,
                                         isolation_level=None, check_same_thread=False)
        except sqlite3.OperationalError as exc:
            if index + 1 < len(modes):
                continue
            raise StoreError(f"{path} cannot be opened: {exc}") from None
        try:
            connection.execute("PRAGMA query_only = ON")
            connection.execute("PRAGMA schema_version").fetchone()  # opens the file (and WAL)
            return connection
        except sqlite3.OperationalError as exc:
            connection.close()
            if _result_code(exc) != SQLITE_CANTOPEN and "unable to open" not in str(exc):
                raise
            if index + 1 == len(modes):
                raise
            wal = _beside(path, "-wal")
            if wal.exists() and wal.stat().st_size > 0:
                # An immutable connection would not see what the log holds.
                raise StoreError(
                    f"{path} cannot be read here: its write-ahead log {wal} holds saved runs "
                    "that SQLite reads only with the -shm file it cannot create in this "
                    "read-only folder; it was left untouched. Copy the store with its -wal "
                    "file to a folder that can be written, or open it once where it was "
                    "written") from None
    raise AssertionError("unreachable")  # pragma: no cover


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
        self.where = describe(path)
        self._connection = connection
        self._wait = _notice(path)

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

    @classmethod
    def open_for_reading(cls, path: Path) -> SqliteStore:
        """Open an existing store to read it, creating, initialising and changing nothing
        (``_read_connection``); ``StoreError`` for a missing or empty one, or anything that
        ``inspect`` refuses."""
        state = inspect(path)
        if state == "missing":
            raise StoreError(f"no benchmark store at {path} (save a run first: "
                             "--gpu-save=NAME)")
        if state == "empty":
            raise StoreError(f"no saved runs in {path}: the file is empty (save a run first: "
                             "--gpu-save=NAME)")
        try:
            connection = _retrying(path, _notice(path), lambda: _read_connection(path),
                                   "using it")
        except sqlite3.DatabaseError as exc:
            raise _unreadable(path, exc) from None
        store = cls(path, connection)
        if state == "older":  # read as it is: the columns it lacks read as NULL
            store.missing_columns = added_after(store._version(), "results")
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
        """Run a write, retrying while another process holds the lock past the busy timeout
        (and saying so on stderr when that takes more than a few seconds)."""
        try:
            return _retrying(self.path, self._wait, action, "writing to it")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: could not write: {exc}") from None

    def _write(self, action: Callable[[Writer], _T]) -> _T:
        def attempt() -> _T:
            with self._transaction() as connection:
                return action(_SqliteWriter(connection))
        return self._retry(attempt)

    def _rows(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        def read() -> list[tuple[Any, ...]]:
            return list(self._connection.execute(sql, tuple(parameters)))
        try:
            return _retrying(self.path, self._wait, read, "using it")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: could not read: {exc}") from None
        except UnicodeEncodeError:
            raise StoreError(NOT_TEXT.format(where=self.where)) from None
