"""The benchmark store: one interface, two backends.

- SQLite (``store_sqlite``, the standard library's sqlite3): one file, by default
  ``.gputrain/benchmarks.sqlite`` in the rootdir. Embedded, nothing to run.
- PostgreSQL (``store_postgres``, psycopg 3: ``pip install 'pytest-gputrain[postgres]'``): a
  ``postgresql://`` URL, so that CI runners share one store and see each other's baselines.

Both hold the same tables (``store_schema`` describes them once; PostgreSQL keeps them in its
own schema, ``gputrain``); ``store_location`` says where a store is.

One run is one pytest session; runs may repeat a name, so a baseline can be several sessions
(``select_runs``). A store is recognised before anything is written to it: one that someone else
wrote, one written by a newer schema, or a damaged one is refused with ``StoreError`` and left
untouched; only a missing or empty one is initialised. Every write is one transaction (a run
and all its results together), retried while another writer holds a lock, so concurrent writers
from several runners lose nothing and a reader never sees half a run.

Import is light: sqlite3 and psycopg are imported by the backend that needs them, and
``store_backends`` picks the backend for a location (``open_store``, ``inspect``).
"""

from __future__ import annotations

import datetime
import json
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from pytest_gputrain.regression.store_schema import DATA_TABLES, MARKER_TABLE, SCHEMA_VERSION

APPLICATION = "pytest-gputrain"
# A side of a comparison keeps at most this many sessions of one name and commit.
MAX_SIDE_RUNS = 20

_T = TypeVar("_T")


class StoreError(Exception):
    """The store cannot be used as it is (foreign, damaged, newer, unreachable, unreadable)."""


# A name or test id looked up that holds bytes the command line could not decode as UTF-8
# (Python keeps them as lone surrogates): nothing the store holds can match it.
NOT_TEXT = ("{where}: a name or test id looked up is not UTF-8 text (the command line held "
            "bytes that are not); nothing saved can match it")


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


def runs_label(runs: Sequence[RunInfo]) -> str:
    """``'main' runs #4, #5, #6 (commit abc1234567, 3 sessions)``."""
    if not runs:
        return "no saved run"
    if len(runs) == 1:
        return runs[0].label()
    names = sorted({run.name for run in runs})
    commits = sorted({run.commit[:10] for run in runs if run.commit})
    ids = ", ".join(f"#{run.id}" for run in sorted(runs, key=lambda r: r.id))
    commit = f"commit {', '.join(commits)}, " if commits else ""
    return f"{', '.join(repr(n) for n in names)} runs {ids} ({commit}{len(runs)} sessions)"


@dataclass(frozen=True)
class ResultRecord:
    """One test's benchmark in one session, as stored: per-round arrays and a summary."""

    nodeid: str
    fingerprint: dict[str, Any]
    fingerprint_hash: str
    rounds: int
    metrics: dict[str, Any]
    summary: dict[str, Any]
    created_at: str = ""
    run_id: int | None = None
    counters: dict[str, Any] | None = None  # the counting pass (collect.step_counters)


class Writer(Protocol):
    """What a write transaction can do (the backend supplies it)."""

    def execute(self, sql: str, parameters: Sequence[Any] = ()) -> None: ...

    def insert(self, sql: str, parameters: Sequence[Any] = ()) -> int:
        """Run an INSERT into a table with an ``id`` column; the new row's id."""
        ...


_RUN_COLUMNS = ("SELECT r.id, r.name, r.created_at, r.fingerprint, r.fingerprint_hash, "
                "r.git_commit, (SELECT COUNT(*) FROM results s WHERE s.run_id = r.id) "
                "FROM runs r")
_RESULT_COLUMNS = ("nodeid", "fingerprint", "fingerprint_hash", "rounds", "metrics", "summary",
                   "created_at", "run_id", "counters")
_UPSERT_RESULT = (
    "INSERT INTO results (run_id, nodeid, created_at, fingerprint, fingerprint_hash, rounds, "
    "metrics, summary, counters) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (run_id, nodeid) "
    "DO UPDATE SET created_at = excluded.created_at, fingerprint = excluded.fingerprint, "
    "fingerprint_hash = excluded.fingerprint_hash, rounds = excluded.rounds, "
    "metrics = excluded.metrics, summary = excluded.summary, counters = excluded.counters"
)


class Store(ABC):
    """An open, recognised store. Use ``open_store(location)``; close it (or use ``with``).

    Backends supply reading (``_rows``), writing (``_write``: one transaction, retried while
    another writer holds a lock) and closing; everything else is shared. SQL is written with
    ``?`` placeholders.
    """

    #: where the store is, for messages (a URL without its password)
    where: str
    #: columns of the results that this store's (older) schema lacks, read as NULL: a store
    #: opened for reading is never upgraded (``store_schema.added_after``)
    missing_columns: frozenset[str] = frozenset()

    @abstractmethod
    def _rows(self, sql: str, parameters: Sequence[Any] = ()) -> list[tuple[Any, ...]]: ...

    @abstractmethod
    def _write(self, action: Callable[[Writer], _T]) -> _T: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing ---------------------------------------------------------------------------

    def create_run(self, name: str, fingerprint: dict[str, Any], fingerprint_hash: str,
                   commit: str | None, created_at: str | None = None) -> int:
        return self._write(lambda w: _insert_run(w, name, fingerprint, fingerprint_hash,
                                                  commit, created_at))

    def add_result(self, run_id: int, record: ResultRecord) -> None:
        """Add (or replace) one test's result in one transaction."""
        self._write(lambda w: _insert_result(w, run_id, record))

    def save_run(self, name: str, fingerprint: dict[str, Any], fingerprint_hash: str,
                 commit: str | None, records: Iterable[ResultRecord],
                 created_at: str | None = None) -> int:
        """A run and all its results in one transaction: readers see all of it or none."""
        records = list(records)

        def write(writer: Writer) -> int:
            run_id = _insert_run(writer, name, fingerprint, fingerprint_hash, commit, created_at)
            for record in records:
                _insert_result(writer, run_id, record)
            return run_id
        return self._write(write)

    # -- reading ---------------------------------------------------------------------------

    def runs(self, *, name: str | None = None, run_id: int | None = None,
             limit: int | None = None) -> list[RunInfo]:
        """Saved runs, newest first."""
        query = _RUN_COLUMNS + " WHERE 1 = 1"
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
        return [_run(row) for row in self._rows(query, parameters)]

    def run(self, run_id: int) -> RunInfo | None:
        found = self.runs(run_id=run_id)
        return found[0] if found else None

    def find_run(self, spec: str, prefer_hash: str | None = None) -> RunInfo | None:
        """``latest`` (newest, preferring one whose fingerprint hash is ``prefer_hash``),
        ``#ID``, or a name (its newest run, preferring ``prefer_hash`` among that name's)."""
        if spec.startswith("#") and spec[1:].isdigit():
            return self.run(int(spec[1:]))
        candidates = self.runs(name=None if spec == "latest" else spec, limit=500)
        if prefer_hash is not None:
            for info in candidates:
                if info.fingerprint_hash == prefer_hash:
                    return info
        return candidates[0] if candidates else None

    def select_runs(self, spec: str, prefer_hash: str | None = None) -> list[RunInfo]:
        """The sessions a spec names, newest first: for ``#ID`` that run; for a name or
        ``latest``, the newest run and the other runs of its name, commit and environment
        (the repeated sessions of one code version), at most ``MAX_SIDE_RUNS``."""
        newest = self.find_run(spec, prefer_hash)
        if newest is None:
            return []
        if spec.startswith("#"):
            return [newest]
        return self.sessions_like(newest)

    def sessions_like(self, run: RunInfo) -> list[RunInfo]:
        """Runs with the name, commit and fingerprint hash of ``run``, newest first."""
        query = _RUN_COLUMNS + " WHERE r.name = ? AND r.fingerprint_hash = ? AND r.id <= ?"
        parameters: list[Any] = [run.name, run.fingerprint_hash, run.id]
        if run.commit is None:
            query += " AND r.git_commit IS NULL"
        else:
            query += " AND r.git_commit = ?"
            parameters.append(run.commit)
        query += " ORDER BY r.id DESC LIMIT ?"
        parameters.append(MAX_SIDE_RUNS)
        return [_run(row) for row in self._rows(query, parameters)]

    def _select_results(self) -> str:
        columns = (f"NULL AS {name}" if name in self.missing_columns else name
                   for name in _RESULT_COLUMNS)
        return f"SELECT {', '.join(columns)} FROM results"

    def results(self, run_id: int) -> dict[str, ResultRecord]:
        rows = self._rows(self._select_results() + " WHERE run_id = ? ORDER BY id", (run_id,))
        return {row[0]: _result(row) for row in rows}

    def results_of(self, runs: Iterable[RunInfo]) -> dict[str, list[ResultRecord]]:
        """Each test's results in these runs (one per session), oldest run first."""
        found: dict[str, list[ResultRecord]] = {}
        for run in sorted(runs, key=lambda r: r.id):
            for nodeid, record in self.results(run.id).items():
                found.setdefault(nodeid, []).append(record)
        return found

    def history(self, nodeid: str, *, fingerprint_hash: str | None = None,
                name: str | None = None, limit: int | None = None
                ) -> list[tuple[RunInfo, ResultRecord]]:
        """One test's results across runs (of one name, when given), oldest first (the newest
        ``limit`` of them)."""
        query = self._select_results() + " WHERE nodeid = ?"
        parameters: list[Any] = [nodeid]
        if fingerprint_hash is not None:
            query += " AND fingerprint_hash = ?"
            parameters.append(fingerprint_hash)
        if name is not None:
            query += " AND run_id IN (SELECT id FROM runs WHERE name = ?)"
            parameters.append(name)
        query += " ORDER BY run_id DESC"
        if limit is not None:
            query += " LIMIT ?"
            parameters.append(limit)
        rows = self._rows(query, parameters)
        ids = sorted({int(row[7]) for row in rows})
        runs: dict[int, RunInfo] = {}
        for start in range(0, len(ids), 500):
            chunk = ids[start:start + 500]
            marks = ", ".join("?" for _ in chunk)
            for row in self._rows(_RUN_COLUMNS + f" WHERE r.id IN ({marks})", chunk):
                info = _run(row)
                runs[info.id] = info
        return [(runs[int(row[7])], _result(row)) for row in reversed(rows)
                if int(row[7]) in runs]

    def nodeids(self) -> list[str]:
        return [str(row[0]) for row in self._rows(
            "SELECT DISTINCT nodeid FROM results ORDER BY nodeid")]


_LEFT_ALONE = "; it was left untouched. Set gpu_store / --gpu-store to another store"


def classify_marker(rows: Sequence[Sequence[Any]], tables: set[str], where: str) -> str:
    """"ours" (``SCHEMA_VERSION``), "older" (a schema this version upgrades when it opens the
    store), or ``StoreError`` for a marker of another program, a newer schema or missing tables:
    the same rules for every backend."""
    if len(rows) != 1 or rows[0][0] != APPLICATION:
        raise StoreError(f"{where}: unrecognised {MARKER_TABLE} marker {list(rows)!r}"
                         + _LEFT_ALONE)
    version = rows[0][1]
    if isinstance(version, bool) or not isinstance(version, int):
        raise StoreError(f"{where}: damaged pytest-gputrain store (its schema version "
                         f"{version!r} is not a whole number)" + _LEFT_ALONE)
    if version > SCHEMA_VERSION:
        raise StoreError(
            f"{where} was written by a newer pytest-gputrain (store schema {version}; this "
            f"version reads up to {SCHEMA_VERSION}); it was left untouched. Upgrade "
            "pytest-gputrain or set gpu_store / --gpu-store to another store")
    if version < 1 or not DATA_TABLES.issubset(tables):
        raise StoreError(f"{where}: damaged pytest-gputrain store (schema {version}, tables "
                         f"{sorted(tables)}); it was left untouched")
    return "ours" if version == SCHEMA_VERSION else "older"


def upgrade_failed(where: str, version: int, exc: BaseException) -> StoreError:
    """The store of an older schema could not be upgraded: nothing was changed."""
    return StoreError(f"{where}: this pytest-gputrain upgrades stores of schema {version} to "
                      f"{SCHEMA_VERSION} (a column for the per-step counters; nothing saved is "
                      f"changed), and the upgrade failed: {exc}. The store was left as it was; "
                      "open it where it can be written, or set gpu_store / --gpu-store to "
                      "another store")


def _insert_run(writer: Writer, name: str, fingerprint: dict[str, Any], fingerprint_hash: str,
                commit: str | None, created_at: str | None) -> int:
    return writer.insert(
        "INSERT INTO runs (name, created_at, fingerprint, fingerprint_hash, git_commit) "
        "VALUES (?, ?, ?, ?, ?)",
        (name, created_at or now(), json.dumps(fingerprint, sort_keys=True), fingerprint_hash,
         commit))


def _insert_result(writer: Writer, run_id: int, record: ResultRecord) -> None:
    writer.execute(_UPSERT_RESULT, (
        run_id, record.nodeid, record.created_at or now(),
        json.dumps(record.fingerprint, sort_keys=True), record.fingerprint_hash, record.rounds,
        json.dumps(record.metrics), json.dumps(record.summary),
        None if record.counters is None else json.dumps(record.counters)))


def _run(row: Sequence[Any]) -> RunInfo:
    return RunInfo(id=int(row[0]), name=str(row[1]), created_at=str(row[2]),
                   fingerprint=json.loads(row[3]), fingerprint_hash=str(row[4]),
                   commit=row[5], result_count=int(row[6]))


def _result(row: Sequence[Any]) -> ResultRecord:
    return ResultRecord(nodeid=str(row[0]), fingerprint=json.loads(row[1]),
                        fingerprint_hash=str(row[2]), rounds=int(row[3]),
                        metrics=json.loads(row[4]), summary=json.loads(row[5]),
                        created_at=str(row[6]), run_id=int(row[7]),
                        counters=None if row[8] is None else json.loads(row[8]))
