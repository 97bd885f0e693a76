"""The benchmark store: one SQLite file (stdlib sqlite3), ``.gputrain/benchmarks.sqlite``.

Tables::

    gputrain_schema (application, version, created_at)   the marker: which program, which schema
    runs    (id, name, created_at, fingerprint, fingerprint_hash, git_commit)
    results (id, run_id, nodeid, created_at, fingerprint, fingerprint_hash, rounds,
             metrics  -- JSON: per-round arrays {"step_time": [...], "peak_vram": [...], ...}
             summary) -- JSON: medians, spreads, throttled count, device, timer

The file is recognised before anything is written to it: a file that is not SQLite, an SQLite
database without our marker (someone else's data), one written by a newer schema, or a corrupt
one is refused with ``StoreError`` and left byte-for-byte untouched. Only a missing file or an
empty one (no tables) is initialised.

Several processes may write at once (parallel CI jobs on one host, ``multiprocessing`` writers):
WAL journal, a busy timeout, retries with backoff on "database is locked", and one transaction per
write, so a reader never sees half a run and no writer loses rows. (WAL needs a local file system:
put the store on local disk, not NFS.)
"""

from __future__ import annotations

import datetime
import json
import random
import sqlite3
import time
import urllib.parse
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

SCHEMA_VERSION = 1
APPLICATION = "pytest-gputrain"
APPLICATION_ID = 0x47505452  # "GPTR", in the SQLite header (PRAGMA application_id)
SQLITE_MAGIC = b"SQLite format 3\x00"
DEFAULT_DIR = ".gputrain"
DEFAULT_NAME = "benchmarks.sqlite"
BUSY_TIMEOUT_S = 30.0
WRITE_ATTEMPTS = 12

_T = TypeVar("_T")

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS gputrain_schema (
        application TEXT NOT NULL,
        version INTEGER NOT NULL,
        created_at TEXT NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS runs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        created_at TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        fingerprint_hash TEXT NOT NULL,
        git_commit TEXT
    )""",
    """CREATE TABLE IF NOT EXISTS results (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id INTEGER NOT NULL REFERENCES runs(id) ON DELETE CASCADE,
        nodeid TEXT NOT NULL,
        created_at TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        fingerprint_hash TEXT NOT NULL,
        rounds INTEGER NOT NULL,
        metrics TEXT NOT NULL,
        summary TEXT NOT NULL,
        UNIQUE (run_id, nodeid)
    )""",
    "CREATE INDEX IF NOT EXISTS runs_name ON runs(name)",
    "CREATE INDEX IF NOT EXISTS results_nodeid ON results(nodeid)",
)
_OUR_TABLES = {"gputrain_schema", "runs", "results", "sqlite_sequence"}


class StoreError(Exception):
    """The store cannot be used as it is (foreign, corrupt, newer, unreadable)."""


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


@dataclass(frozen=True)
class RunInfo:
    id: int
    name: str
    created_at: str
    fingerprint: dict[str, Any]
    fingerprint_hash: str
    commit: str | None
    result_count: int = 0

    def label(self) -> str:
        commit = f", commit {self.commit[:10]}" if self.commit else ""
        return f"run #{self.id} {self.name!r} ({self.created_at}{commit})"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "created_at": self.created_at,
                "commit": self.commit, "fingerprint": self.fingerprint,
                "fingerprint_hash": self.fingerprint_hash, "result_count": self.result_count}


@dataclass(frozen=True)
class ResultRecord:
    """One test's benchmark as stored: per-round arrays and a summary."""

    nodeid: str
    fingerprint: dict[str, Any]
    fingerprint_hash: str
    rounds: int
    metrics: dict[str, Any]
    summary: dict[str, Any]
    created_at: str = ""
    run_id: int | None = None


def default_path(rootdir: Path) -> Path:
    return rootdir / DEFAULT_DIR / DEFAULT_NAME


def _is_locked(exc: sqlite3.OperationalError) -> bool:
    text = str(exc).lower()
    return "locked" in text or "busy" in text


def inspect(path: Path) -> str:
    """"missing", "empty" (safe to initialise) or "ours"; ``StoreError`` for anything else.

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
        raise StoreError(
            f"{path} is not an SQLite database (not written by pytest-gputrain); it was left "
            "untouched. Move it away or set gpu_store / --gpu-store to another file"
        )
    uri = f"file:{urllib.parse.quote(str(path.resolve()))}?mode=ro"
    try:
        connection = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    except sqlite3.Error as exc:
        raise StoreError(f"{path} cannot be opened: {exc}") from None
    try:
        return _classify(connection, path)
    except sqlite3.DatabaseError as exc:
        raise StoreError(
            f"{path} is corrupt or not an SQLite database ({exc}); it was left untouched. "
            "Move it away or set gpu_store / --gpu-store to another file"
        ) from None
    finally:
        connection.close()


def _classify(connection: sqlite3.Connection, path: Path) -> str:
    tables = {row[0] for row in connection.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    application_id = int(connection.execute("PRAGMA application_id").fetchone()[0])
    if not tables and application_id in (0, APPLICATION_ID):
        return "empty"
    if application_id not in (0, APPLICATION_ID) or "gputrain_schema" not in tables:
        listed = ", ".join(sorted(tables)[:6]) or "none"
        raise StoreError(
            f"{path} is an SQLite database that pytest-gputrain did not write (no "
            f"gputrain_schema marker; tables: {listed}); it was left untouched. Set gpu_store / "
            "--gpu-store to another file"
        )
    rows = connection.execute("SELECT application, version FROM gputrain_schema").fetchall()
    if len(rows) != 1 or rows[0][0] != APPLICATION:
        raise StoreError(f"{path}: unrecognised gputrain_schema marker {rows!r}; it was left "
                         "untouched. Set gpu_store / --gpu-store to another file")
    version = int(rows[0][1])
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{path} was written by a newer pytest-gputrain (store schema {version}; this "
            f"version reads up to {SCHEMA_VERSION}); it was left untouched. Upgrade "
            "pytest-gputrain or set gpu_store / --gpu-store to another file"
        )
    if version < 1 or not {"runs", "results"} <= tables:
        raise StoreError(f"{path}: damaged pytest-gputrain store (schema {version}, tables "
                         f"{sorted(tables)}); it was left untouched")
    return "ours"


class Store:
    """An open, recognised store. Use ``Store.open(path)``; close it (or use ``with``)."""

    def __init__(self, path: Path, connection: sqlite3.Connection) -> None:
        self.path = path
        self._connection = connection

    @classmethod
    def open(cls, path: Path, *, create: bool = True) -> Store:
        """Open ``path``, creating and initialising it when missing or empty (and ``create``)."""
        state = inspect(path)
        if state == "missing" and not create:
            raise StoreError(f"no benchmark store at {path} (save a run first: --gpu-save=NAME)")
        if state == "missing":
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            connection = sqlite3.connect(str(path), timeout=BUSY_TIMEOUT_S,
                                         isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            raise StoreError(f"{path} cannot be opened: {exc}") from None
        store = cls(path, connection)
        try:
            connection.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
            connection.execute("PRAGMA foreign_keys = ON")
            if state != "ours":
                store._retry(store._initialise)
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
            connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
            for statement in _SCHEMA:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO gputrain_schema (application, version, created_at) VALUES (?, ?, ?)",
                (APPLICATION, SCHEMA_VERSION, now()),
            )

    def _use_wal(self) -> None:
        mode = self._connection.execute("PRAGMA journal_mode").fetchone()[0]
        if str(mode).lower() != "wal":
            self._connection.execute("PRAGMA journal_mode = WAL")
        self._connection.execute("PRAGMA synchronous = NORMAL")

    def close(self) -> None:
        self._connection.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
        """Run a write, retrying while another writer holds the lock past the busy timeout."""
        delay = 0.05
        for attempt in range(WRITE_ATTEMPTS):
            try:
                return action()
            except sqlite3.OperationalError as exc:
                if not _is_locked(exc) or attempt == WRITE_ATTEMPTS - 1:
                    raise StoreError(f"{self.path}: could not write: {exc}") from None
                time.sleep(delay * (1 + random.random()))
                delay = min(delay * 2, 2.0)
        raise AssertionError("unreachable")  # pragma: no cover

    # -- writing ---------------------------------------------------------------------------

    def create_run(self, name: str, fingerprint: dict[str, Any], fingerprint_hash: str,
                   commit: str | None, created_at: str | None = None) -> int:
        def write() -> int:
            with self._transaction() as connection:
                return self._insert_run(connection, name, fingerprint, fingerprint_hash, commit,
                                        created_at)
        return self._retry(write)

    def add_result(self, run_id: int, record: ResultRecord) -> None:
        """Add (or replace) one test's result in one transaction."""
        def write() -> None:
            with self._transaction() as connection:
                self._insert_result(connection, run_id, record)
        self._retry(write)

    def save_run(self, name: str, fingerprint: dict[str, Any], fingerprint_hash: str,
                 commit: str | None, records: Iterable[ResultRecord],
                 created_at: str | None = None) -> int:
        """A run and all its results in one transaction: readers see all of it or none."""
        records = list(records)

        def write() -> int:
            with self._transaction() as connection:
                run_id = self._insert_run(connection, name, fingerprint, fingerprint_hash, commit,
                                          created_at)
                for record in records:
                    self._insert_result(connection, run_id, record)
                return run_id
        return self._retry(write)

    @staticmethod
    def _insert_run(connection: sqlite3.Connection, name: str, fingerprint: dict[str, Any],
                    fingerprint_hash: str, commit: str | None, created_at: str | None) -> int:
        cursor = connection.execute(
            "INSERT INTO runs (name, created_at, fingerprint, fingerprint_hash, git_commit) "
            "VALUES (?, ?, ?, ?, ?)",
            (name, created_at or now(), json.dumps(fingerprint, sort_keys=True),
             fingerprint_hash, commit),
        )
        return int(cursor.lastrowid or 0)

    @staticmethod
    def _insert_result(connection: sqlite3.Connection, run_id: int, record: ResultRecord) -> None:
        connection.execute(
            "INSERT OR REPLACE INTO results (run_id, nodeid, created_at, fingerprint, "
            "fingerprint_hash, rounds, metrics, summary) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (run_id, record.nodeid, record.created_at or now(),
             json.dumps(record.fingerprint, sort_keys=True), record.fingerprint_hash,
             record.rounds, json.dumps(record.metrics), json.dumps(record.summary)),
        )

    # -- reading ---------------------------------------------------------------------------

    def runs(self, *, name: str | None = None, run_id: int | None = None,
             limit: int | None = None) -> list[RunInfo]:
        """Saved runs, newest first."""
        query = (
            "SELECT r.id, r.name, r.created_at, r.fingerprint, r.fingerprint_hash, r.git_commit, "
            "(SELECT COUNT(*) FROM results s WHERE s.run_id = r.id) FROM runs r WHERE 1 = 1"
        )
        parameters: list[Any] = []
        if name is not None:
            query += " AND r.name = ?"
            parameters.append(name)
        if run_id is not None:
            query += " AND r.id = ?"
            parameters.append(run_id)
        query += " ORDER BY r.id DESC"
        if limit is not None:
            query += " LIMIT ?"
            parameters.append(limit)
        return [self._run(row) for row in self._connection.execute(query, parameters)]

    @staticmethod
    def _run(row: tuple[Any, ...]) -> RunInfo:
        return RunInfo(id=int(row[0]), name=str(row[1]), created_at=str(row[2]),
                       fingerprint=json.loads(row[3]), fingerprint_hash=str(row[4]),
                       commit=row[5], result_count=int(row[6]))

    def run(self, run_id: int) -> RunInfo | None:
        found = self.runs(run_id=run_id)
        return found[0] if found else None

    def find_run(self, spec: str, prefer_hash: str | None = None) -> RunInfo | None:
        """``latest`` (newest, preferring one whose fingerprint hash is ``prefer_hash``),
        ``#ID``, or a name (the newest run saved under it)."""
        if spec == "latest":
            runs = self.runs()
            if prefer_hash is not None:
                for info in runs:
                    if info.fingerprint_hash == prefer_hash:
                        return info
            return runs[0] if runs else None
        if spec.startswith("#") and spec[1:].isdigit():
            return self.run(int(spec[1:]))
        found = self.runs(name=spec, limit=1)
        return found[0] if found else None

    def results(self, run_id: int) -> dict[str, ResultRecord]:
        rows = self._connection.execute(
            "SELECT nodeid, fingerprint, fingerprint_hash, rounds, metrics, summary, created_at, "
            "run_id FROM results WHERE run_id = ? ORDER BY id", (run_id,))
        return {row[0]: self._result(row) for row in rows}

    def history(self, nodeid: str) -> list[tuple[RunInfo, ResultRecord]]:
        """One test's results across runs, oldest first."""
        runs = {info.id: info for info in self.runs()}
        rows = self._connection.execute(
            "SELECT nodeid, fingerprint, fingerprint_hash, rounds, metrics, summary, created_at, "
            "run_id FROM results WHERE nodeid = ? ORDER BY run_id", (nodeid,))
        return [(runs[int(row[7])], self._result(row)) for row in rows if int(row[7]) in runs]

    def nodeids(self) -> list[str]:
        return [row[0] for row in self._connection.execute(
            "SELECT DISTINCT nodeid FROM results ORDER BY nodeid")]

    @staticmethod
    def _result(row: tuple[Any, ...]) -> ResultRecord:
        return ResultRecord(nodeid=str(row[0]), fingerprint=json.loads(row[1]),
                            fingerprint_hash=str(row[2]), rounds=int(row[3]),
                            metrics=json.loads(row[4]), summary=json.loads(row[5]),
                            created_at=str(row[6]), run_id=int(row[7]))
