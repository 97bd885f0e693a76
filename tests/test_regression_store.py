"""The benchmark store, on both backends (SQLite and a real PostgreSQL server): schema,
versioning, recognition of foreign stores, concurrent writers; fingerprints."""

from __future__ import annotations

import multiprocessing
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.regression import fingerprint as fp
from pytest_gputrain.regression.store import ResultRecord, StoreError
from pytest_gputrain.regression.store_backends import inspect, open_for_reading, open_store
from pytest_gputrain.regression.store_location import (
    Location,
    describe,
    parse_location,
    resolve_store,
)
from pytest_gputrain.regression.store_schema import SCHEMA_VERSION
from pytest_gputrain.regression.store_sqlite import APPLICATION_ID

FINGERPRINT = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "driver_version": "580.159.04",
               "torch_version": "2.11.0+cu130", "torch_cuda": "13.0", "cudnn_version": "91200",
               "python": "CPython 3.12", "platform": "linux-x86_64", "host": "abc123def456",
               "gpu_count": 1}


def record(nodeid: str, times: list[float] | None = None, **extra: Any) -> ResultRecord:
    times = times or [0.010, 0.011, 0.0105]
    return ResultRecord(
        nodeid=nodeid, fingerprint=FINGERPRINT, fingerprint_hash=fp.fingerprint_hash(FINGERPRINT),
        rounds=len(times),
        metrics={"step_time": times, "peak_vram": [1000] * len(times),
                 "throttled": [False] * len(times)},
        summary={"step_time": {"median": sorted(times)[len(times) // 2]}, "throttled": 0},
        **extra,
    )


@pytest.fixture(params=["sqlite", "postgresql"])
def location(request: pytest.FixtureRequest, tmp_path: Path) -> Location:
    """A store that does not exist yet: an SQLite file, or an empty PostgreSQL database."""
    if request.param == "sqlite":
        return tmp_path / "deep" / "benchmarks.sqlite"
    return str(request.getfixturevalue("postgres_url"))


def raw_execute(location: Location, *statements: str) -> list[Any]:
    """Run SQL on the store behind our back (another program, a newer version); the last
    statement's rows."""
    rows: list[Any] = []
    if isinstance(location, Path):
        connection = sqlite3.connect(location)
        try:
            for statement in statements:
                rows = connection.execute(statement).fetchall()
            connection.commit()
            connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        finally:
            connection.close()
        return rows
    import psycopg

    with psycopg.connect(location, autocommit=True) as connection:
        for statement in statements:
            cursor = connection.execute(statement)  # type: ignore[arg-type]
            rows = cursor.fetchall() if cursor.description else []
    return rows


def snapshot(location: Location) -> Any:
    """Everything stored, to show that a refused store was left untouched."""
    if isinstance(location, Path):
        return location.read_bytes() if location.exists() else None
    return raw_execute(
        location,
        "SELECT table_schema, table_name FROM information_schema.tables WHERE table_schema "
        "NOT IN ('pg_catalog', 'information_schema') ORDER BY 1, 2")


def test_new_store_has_schema_marker(location: Location) -> None:
    assert inspect(location) == "missing"
    with open_store(location) as store:
        assert store.runs() == []
    assert inspect(location) == "ours"
    prefix = "" if isinstance(location, Path) else "gputrain."
    rows = raw_execute(location, f"SELECT application, version FROM {prefix}gputrain_schema")
    assert [tuple(row) for row in rows] == [("pytest-gputrain", SCHEMA_VERSION)]
    if isinstance(location, Path):
        connection = sqlite3.connect(location)
        try:
            assert connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
            assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        finally:
            connection.close()


# What stores already written hold: both backends render store_schema into these.
STORED_COLUMNS = {
    "gputrain_schema": ["application", "version", "created_at"],
    "runs": ["id", "name", "created_at", "fingerprint", "fingerprint_hash", "git_commit"],
    "results": ["id", "run_id", "nodeid", "created_at", "fingerprint", "fingerprint_hash",
                "rounds", "metrics", "summary", "counters"],
}


def test_both_backends_create_the_stored_tables_and_indexes(location: Location) -> None:
    open_store(location).close()
    if isinstance(location, Path):
        columns = {table: [row[1] for row in raw_execute(location, f"PRAGMA table_info({table})")]
                   for table in STORED_COLUMNS}
        indexes = raw_execute(location, "SELECT name FROM sqlite_master WHERE type = 'index' "
                                        "AND name NOT LIKE 'sqlite_%' ORDER BY name")
    else:
        columns = {table: [row[0] for row in raw_execute(
            location, "SELECT column_name FROM information_schema.columns WHERE table_schema = "
                      f"'gputrain' AND table_name = '{table}' ORDER BY ordinal_position")]
                   for table in STORED_COLUMNS}
        indexes = raw_execute(location, "SELECT indexname FROM pg_indexes WHERE schemaname = "
                                        "'gputrain' AND indexname NOT LIKE '%_pkey' AND "
                                        "indexname NOT LIKE '%_key' ORDER BY indexname")
    assert columns == STORED_COLUMNS
    assert [row[0] for row in indexes] == ["results_nodeid", "runs_name"]


def test_save_and_read_back(location: Location) -> None:
    with open_store(location) as store:
        first = store.save_run("main", FINGERPRINT, "hash-a", "c0ffee",
                               [record("t.py::a"), record("t.py::b")])
        second = store.save_run("pr-1", FINGERPRINT, "hash-b", None,
                                [record("t.py::a", [0.02, 0.021, 0.022])])
        third = store.save_run("main", FINGERPRINT, "hash-b", "beef", [record("t.py::a")])
        runs = store.runs()
        assert [r.id for r in runs] == [third, second, first]
        assert runs[-1].commit == "c0ffee" and runs[-1].result_count == 2
        assert runs[-1].fingerprint == FINGERPRINT
        assert store.find_run("main").id == third  # type: ignore[union-attr]
        assert store.find_run("main", prefer_hash="hash-a").id == first  # type: ignore[union-attr]
        assert store.find_run(f"#{first}").id == first  # type: ignore[union-attr]
        assert store.find_run("latest").id == third  # type: ignore[union-attr]
        assert store.find_run("latest", prefer_hash="hash-a").id == first  # type: ignore[union-attr]
        assert store.find_run("latest", prefer_hash="nope").id == third  # type: ignore[union-attr]
        assert store.find_run("nope") is None
        assert store.find_run("#999") is None
        results = store.results(first)
        assert set(results) == {"t.py::a", "t.py::b"}
        assert results["t.py::a"].metrics["step_time"] == [0.010, 0.011, 0.0105]
        assert results["t.py::a"].fingerprint_hash == fp.fingerprint_hash(FINGERPRINT)
        history = store.history("t.py::a")
        assert [run.id for run, _ in history] == [first, second, third]
        assert [run.id for run, _ in store.history("t.py::a", limit=2)] == [second, third]
        assert store.nodeids() == ["t.py::a", "t.py::b"]
        assert [r.name for r in store.runs(name="main")] == ["main", "main"]
        assert len(store.runs(limit=1)) == 1


def test_sessions_of_one_name_and_commit_form_a_side(location: Location) -> None:
    """A baseline is every session of a name at its newest commit, in one environment."""
    with open_store(location) as store:
        old = store.save_run("main", FINGERPRINT, "h", "old", [record("t::a")])
        a = store.save_run("main", FINGERPRINT, "h", "new", [record("t::a", [0.1] * 3)])
        other_env = store.save_run("main", FINGERPRINT, "h2", "new", [record("t::a")])
        b = store.save_run("main", FINGERPRINT, "h", "new", [record("t::a", [0.2] * 3)])
        store.save_run("pr", FINGERPRINT, "h", "new", [record("t::a")])
        side = store.select_runs("main", prefer_hash="h")
        assert [r.id for r in side] == [b, a]
        assert [r.id for r in store.select_runs("main", prefer_hash="h2")] == [other_env]
        assert [r.id for r in store.select_runs(f"#{old}")] == [old]
        grouped = store.results_of(side)
        assert [r.metrics["step_time"][0] for r in grouped["t::a"]] == [0.1, 0.2]
        assert store.select_runs("nope") == []


def test_counters_are_saved_with_their_result(location: Location) -> None:
    counters = {"version": 1, "per_step": {"kernels": 612, "syncs": 1}, "host_cpu": [0.0061],
                "sync_sites": [{"kind": "stream", "op": "aten::_local_scalar_dense",
                                "site": "train.py:42", "code": "loss.item()", "count": 1}]}
    with open_store(location) as store:
        run = store.save_run("a", FINGERPRINT, "h", None,
                             [record("t::a", counters=counters), record("t::b")])
        results = store.results(run)
    assert results["t::a"].counters == counters
    assert results["t::b"].counters is None  # not counted (or saved by an older version)


def test_add_result_replaces_same_test(location: Location) -> None:
    with open_store(location) as store:
        run = store.create_run("x", FINGERPRINT, "h", None)
        store.add_result(run, record("t::a", [1.0]))
        store.add_result(run, record("t::a", [2.0]))
        assert store.results(run)["t::a"].metrics["step_time"] == [2.0]


def test_reopen_keeps_data(location: Location) -> None:
    with open_store(location) as store:
        store.save_run("a", FINGERPRINT, "h", None, [record("t::a")])
    with open_store(location, create=False) as store:
        assert [r.name for r in store.runs()] == ["a"]


def test_open_missing_without_create(location: Location) -> None:
    before = snapshot(location)
    with pytest.raises(StoreError, match="no benchmark store"):
        open_store(location, create=False)
    assert snapshot(location) == before


def test_newer_schema_refused_untouched(location: Location) -> None:
    with open_store(location) as store:
        store.save_run("a", FINGERPRINT, "h", None, [record("t::a")])
    prefix = "" if isinstance(location, Path) else "gputrain."
    raw_execute(location, f"UPDATE {prefix}gputrain_schema SET version = {SCHEMA_VERSION + 1}")
    before = snapshot(location)
    with pytest.raises(StoreError, match="newer pytest-gputrain"):
        open_store(location)
    with pytest.raises(StoreError, match="newer pytest-gputrain"):
        inspect(location)
    assert snapshot(location) == before
    rows = raw_execute(location, f"SELECT COUNT(*) FROM {prefix}runs")
    assert rows[0][0] == 1  # the saved run is still there


@pytest.mark.parametrize("version", ["'one'", "1.5", "NULL"])
def test_schema_version_that_is_not_a_whole_number_is_refused(location: Location,
                                                                version: str) -> None:
    with open_store(location) as store:
        store.save_run("a", FINGERPRINT, "h", None, [record("t::a")])
    if isinstance(location, Path):
        if version == "NULL":  # the column is NOT NULL: rebuild the marker table without it
            raw_execute(location, "DROP TABLE gputrain_schema",
                        "CREATE TABLE gputrain_schema (application TEXT, version, created_at)",
                        "INSERT INTO gputrain_schema VALUES ('pytest-gputrain', NULL, 'now')")
        else:
            raw_execute(location, f"UPDATE gputrain_schema SET version = {version}")
    else:
        raw_execute(location,
                    "ALTER TABLE gputrain.gputrain_schema ALTER COLUMN version TYPE TEXT",
                    "ALTER TABLE gputrain.gputrain_schema ALTER COLUMN version DROP NOT NULL",
                    f"UPDATE gputrain.gputrain_schema SET version = {version}")
    before = snapshot(location)
    for attempt in (inspect, open_store):
        with pytest.raises(StoreError, match=r"damaged pytest-gputrain store \(its schema "
                                             r"version .* is not a whole number\).*untouched"):
            attempt(location)
    assert snapshot(location) == before


def test_a_store_that_cannot_be_created_is_a_store_error(tmp_path: Path) -> None:
    from pytest_gputrain.regression.store_backends import check_creatable

    (tmp_path / ".gputrain").write_text("a file where the store's folder goes\n")
    path = tmp_path / ".gputrain" / "benchmarks.sqlite"
    assert inspect(path) == "missing"
    for attempt in (check_creatable, open_store):
        with pytest.raises(StoreError, match=r"\.gputrain is a file, not a folder"):
            attempt(path)
    assert (tmp_path / ".gputrain").read_text() == "a file where the store's folder goes\n"
    check_creatable(tmp_path / "new" / "benchmarks.sqlite")
    assert sorted(tmp_path.iterdir()) == [tmp_path / ".gputrain"]  # the probe left nothing


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux's /sys")
def test_a_folder_that_refuses_writes_is_a_store_error() -> None:
    # /sys refuses new folders even to root, where a chmod 555 folder would not.
    from pytest_gputrain.regression.store_backends import check_creatable

    path = Path("/sys/gputrain-test/benchmarks.sqlite")
    for attempt in (check_creatable, open_store):
        with pytest.raises(StoreError, match=r"(not writable|cannot create).*/sys"):
            attempt(path)


def test_foreign_tables_refused_untouched(location: Location) -> None:
    if isinstance(location, Path):
        location.parent.mkdir(parents=True, exist_ok=True)
        raw_execute(location, "CREATE TABLE customers (id INTEGER, name TEXT)",
                    "INSERT INTO customers VALUES (1, 'Ada')")
    else:
        raw_execute(location, "CREATE SCHEMA gputrain",
                    "CREATE TABLE gputrain.customers (id INTEGER, name TEXT)",
                    "INSERT INTO gputrain.customers VALUES (1, 'Ada')")
    before = snapshot(location)
    with pytest.raises(StoreError, match=r"did not write.*customers"):
        open_store(location)
    with pytest.raises(StoreError, match=r"did not write.*customers"):
        inspect(location)
    assert snapshot(location) == before


def test_empty_store_is_adopted(location: Location) -> None:
    if isinstance(location, Path):
        location.parent.mkdir(parents=True, exist_ok=True)
        location.write_bytes(b"")
    else:
        raw_execute(location, "CREATE SCHEMA gputrain")
    assert inspect(location) == "empty"
    with open_store(location) as store:
        store.save_run("a", FINGERPRINT, "h", None, [])
    assert inspect(location) == "ours"


def _writer(location: Location, worker: int, shared_run: int, count: int) -> None:
    with open_store(location) as store:
        own = store.create_run(f"writer-{worker}", FINGERPRINT, "h", None)
        for i in range(count):
            store.add_result(own, record(f"t.py::test_{i}"))
            store.add_result(shared_run, record(f"t.py::w{worker}_{i}"))
        store.save_run(f"whole-{worker}", FINGERPRINT, "h", None,
                       [record(f"t.py::x{i}") for i in range(count)])


def test_concurrent_writers_lose_nothing(location: Location) -> None:
    with open_store(location) as store:
        shared_run = store.create_run("shared", FINGERPRINT, "h", None)
    context = multiprocessing.get_context("spawn")
    workers, count = 6, 25
    processes = [context.Process(target=_writer, args=(location, w, shared_run, count))
                 for w in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    with open_store(location, create=False) as store:
        runs = {run.name: run for run in store.runs()}
        assert len(runs) == 2 * workers + 1
        assert runs["shared"].result_count == workers * count
        for w in range(workers):
            assert runs[f"writer-{w}"].result_count == count
            assert runs[f"whole-{w}"].result_count == count
        assert len(store.results(shared_run)) == workers * count


def _first_open(location: Location, worker: int) -> None:
    with open_store(location) as store:
        store.save_run(f"p{worker}", FINGERPRINT, "h", None, [record("t::a")])


def test_concurrent_first_open_of_a_new_store(location: Location) -> None:
    """Several processes creating the same new store at once: one schema, every run saved."""
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_first_open, args=(location, w)) for w in range(5)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    with open_store(location, create=False) as store:
        assert sorted(r.name for r in store.runs()) == [f"p{w}" for w in range(5)]
    prefix = "" if isinstance(location, Path) else "gputrain."
    assert raw_execute(location, f"SELECT COUNT(*) FROM {prefix}gputrain_schema")[0][0] == 1


# -- stores of the schema before: upgraded in place, nothing lost ----------------------------

STORES = Path(__file__).resolve().parent / "stores"


def schema1_store(location: Location) -> None:
    """A store as the code of commit 58807ed (schema 1) wrote it (tests/stores/)."""
    if isinstance(location, Path):
        location.parent.mkdir(parents=True, exist_ok=True)
        location.write_bytes((STORES / "schema1.sqlite").read_bytes())
        return
    import psycopg

    with psycopg.connect(location, autocommit=True) as connection:
        connection.execute((STORES / "schema1_postgres.sql").read_text())  # type: ignore[arg-type]


def saved_rows(location: Location) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of the runs and results tables, in the columns schema 1 had."""
    prefix = "" if isinstance(location, Path) else "gputrain."
    columns = {table: ", ".join(names) for table, names in STORED_COLUMNS.items()
               if table != "gputrain_schema"}
    columns["results"] = columns["results"].removesuffix(", counters")
    return {table: [tuple(row) for row in raw_execute(
                location, f"SELECT {names} FROM {prefix}{table} ORDER BY id")]
            for table, names in columns.items()}


def test_a_store_of_schema_1_is_upgraded_and_loses_nothing(location: Location) -> None:
    """Opened by this version, a store written by the code of schema 1 gains the counters column
    in one transaction; every run and result reads back as that code read it, and every saved
    row is the same, byte for byte; new results carry their counters."""
    import json

    schema1_store(location)
    before = saved_rows(location)
    assert inspect(location) == "older"
    expected = json.loads((STORES / "schema1_expected.json").read_text())
    with open_store(location, create=False) as store:
        runs = sorted(store.runs(), key=lambda r: r.id)
        assert [run.to_json() for run in runs] == [entry["run"] for entry in expected]
        for run, entry in zip(runs, expected, strict=True):
            results = store.results(run.id)
            assert set(results) == set(entry["results"])
            for nodeid, saved in entry["results"].items():
                assert {**results[nodeid].__dict__, "counters": "gone"} == {
                    **saved, "counters": "gone"}
                assert results[nodeid].counters is None
        side = store.select_runs("pr-41")
        assert len(side) == 2 and {r.commit for r in side} == {"9f1c2e7a01bb"}
        new = store.save_run("after", FINGERPRINT, "h", "c0ffee",
                             [record("t::a", counters={"per_step": {"kernels": 3}})])
        assert store.results(new)["t::a"].counters == {"per_step": {"kernels": 3}}
    assert inspect(location) == "ours"
    prefix = "" if isinstance(location, Path) else "gputrain."
    assert raw_execute(location, f"SELECT version FROM {prefix}gputrain_schema")[0][0] == \
        SCHEMA_VERSION
    after = saved_rows(location)
    assert after["runs"][:len(before["runs"])] == before["runs"]
    assert after["results"][:len(before["results"])] == before["results"]
    with open_store(location, create=False) as store:  # a second open finds it current
        assert len(store.runs()) == len(expected) + 1


def test_a_store_of_schema_1_is_read_as_it_is_and_not_upgraded(location: Location) -> None:
    """``history`` and ``compare`` open a store for reading only: one of schema 1 (a CI cache
    saved by the version before) reads whole, its counters none, and stays schema 1 byte for
    byte (it answered "no such column: counters" when the reading merged with the upgrade)."""
    import json

    from pytest_gputrain.cli import main as cli_main

    schema1_store(location)
    prefix = "" if isinstance(location, Path) else "gputrain."
    if isinstance(location, Path):
        raw_execute(location, "PRAGMA journal_mode = DELETE")
    before = snapshot(location), saved_rows(location)
    expected = json.loads((STORES / "schema1_expected.json").read_text())
    with open_for_reading(location) as store:
        runs = sorted(store.runs(), key=lambda r: r.id)
        assert [run.to_json() for run in runs] == [entry["run"] for entry in expected]
        for run, entry in zip(runs, expected, strict=True):
            results = store.results(run.id)
            assert set(results) == set(entry["results"])
            assert all(result.counters is None for result in results.values())
            for nodeid in results:
                assert [r.nodeid for _, r in store.history(nodeid)] != []
    assert cli_main(["compare", "pr-41", "main", "--store", str(location), "--force"]) in (0, 1)
    assert (snapshot(location), saved_rows(location)) == before
    assert inspect(location) == "older"
    assert raw_execute(location, f"SELECT version FROM {prefix}gputrain_schema")[0][0] == 1


def test_a_failed_upgrade_changes_nothing(location: Location) -> None:
    """A schema-1 store whose results table already has a column of that name (someone's own
    addition): the upgrade fails in its transaction and the store stays as it was."""
    schema1_store(location)
    prefix = "" if isinstance(location, Path) else "gputrain."
    raw_execute(location, f"ALTER TABLE {prefix}results ADD COLUMN counters INTEGER")
    if isinstance(location, Path):
        raw_execute(location, "PRAGMA journal_mode = DELETE")
    before = snapshot(location), saved_rows(location)
    with pytest.raises(StoreError, match=r"upgrades stores of schema 1 to 2 .* the upgrade "
                                         r"failed: .*left as it was"):
        open_store(location)
    assert (snapshot(location), saved_rows(location)) == before
    assert raw_execute(location, f"SELECT version FROM {prefix}gputrain_schema")[0][0] == 1


def _upgrade(location: Location, worker: int) -> None:
    with open_store(location) as store:
        store.save_run(f"u{worker}", FINGERPRINT, "h", None, [record("t::a", counters={})])


def test_concurrent_first_opens_upgrade_once(location: Location) -> None:
    schema1_store(location)
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_upgrade, args=(location, w)) for w in range(4)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    with open_store(location, create=False) as store:
        assert sorted(r.name for r in store.runs())[-4:] == [f"u{w}" for w in range(4)]
    prefix = "" if isinstance(location, Path) else "gputrain."
    assert raw_execute(location, f"SELECT version FROM {prefix}gputrain_schema") == [(2,)]


# -- SQLite: a file that is not ours ---------------------------------------------------------


def _assert_refused_untouched(path: Path, match: str) -> None:
    before = path.read_bytes()
    with pytest.raises(StoreError, match=match):
        open_store(path)
    with pytest.raises(StoreError, match=match):
        inspect(path)
    assert path.read_bytes() == before
    assert not path.with_name(path.name + "-wal").exists()


def test_text_file_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    path.write_text("my precious notes\n" * 100)
    _assert_refused_untouched(path, "not an SQLite database")


def test_corrupt_sqlite_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 40)
    _assert_refused_untouched(path, "corrupt")


def test_foreign_application_id_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1234")
    connection.execute("CREATE TABLE gputrain_schema (application TEXT, version INTEGER, "
                       "created_at TEXT)")
    connection.commit()
    connection.close()
    _assert_refused_untouched(path, "did not write")


def test_directory_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="directory"):
        open_store(tmp_path)


# -- PostgreSQL: URLs, servers, passwords ------------------------------------------------------


def test_postgres_in_its_own_schema_beside_other_data(postgres_url: str) -> None:
    """A shared database may hold anything else: our tables live in the gputrain schema."""
    raw_execute(postgres_url, "CREATE TABLE public.runs (id INTEGER, secret TEXT)",
                "INSERT INTO public.runs VALUES (1, 'theirs')")
    with open_store(postgres_url) as store:
        store.save_run("main", FINGERPRINT, "h", "c", [record("t::a")])
        assert [r.name for r in store.runs()] == ["main"]
    assert raw_execute(postgres_url, "SELECT * FROM public.runs") == [(1, "theirs")]


def test_postgres_url_forms(postgres_server: Any) -> None:
    """postgres:// is accepted too, and libpq parameters ride in the query."""
    uri = str(postgres_server.get_uri())
    with open_store(uri.replace("postgresql://", "postgres://", 1)) as store:
        assert store.runs() == []
    with open_store(uri + "&connect_timeout=5&application_name=gputrain-test") as store:
        assert store.runs() == []


def test_postgres_unreachable_server_is_a_clear_error() -> None:
    url = "postgresql://ci:hunter2@127.0.0.1:1/benchmarks?connect_timeout=3"
    with pytest.raises(StoreError) as caught:
        open_store(url)
    text = str(caught.value)
    assert text.startswith("cannot connect to the PostgreSQL store "
                           "postgresql://ci:***@127.0.0.1:1/benchmarks")
    assert "hunter2" not in text


@pytest.mark.parametrize("url", ["postgresql://host:notaport/db",
                                 "postgresql://h/db?nonsense_option=1"])
def test_postgres_bad_url_is_a_clear_error(url: str) -> None:
    with pytest.raises(StoreError, match=r"not a valid PostgreSQL URL|cannot connect"):
        open_store(url)


def test_postgres_unknown_database(postgres_server: Any) -> None:
    with pytest.raises(StoreError, match=r"cannot connect.*does not exist"):
        open_store(str(postgres_server.get_uri("no_such_database")))


def test_postgres_without_psycopg(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)
    with pytest.raises(StoreError, match=r"pip install 'pytest-gputrain\[postgres\]'"):
        open_store("postgresql://localhost/db")


def test_describe_hides_passwords() -> None:
    assert describe("postgresql://u:pw@h:5/db?sslmode=require") == \
        "postgresql://u:***@h:5/db?sslmode=require"
    # Every parameter libpq itself hides, wherever it is written.
    assert describe("postgresql://h/db?password=pw&user=u&sslpassword=key") == \
        "postgresql://u:***@h/db?sslpassword=***"
    assert describe(Path("a/b.sqlite")) == "a/b.sqlite"
    # libpq reads a raw # into the password (issue 29): so does the redaction.
    assert describe("postgresql://leak:Sekr1t#PW-88@/db?host=/path/to/sock") == \
        "postgresql://leak:***@/db?host=/path/to/sock"
    # A URL libpq cannot read, or reads as what cannot have been meant (a raw / or @ in a
    # password ends the user part early), shows nothing after its scheme.
    for url in ("postgresql://u:pw@[::1/db?password=x", "postgresql://[::1",
                "postgresql://u:pa/ss@h/db", "postgresql://u:p@ss@h/db",
                "postgres://u:pw@h/db?nonsense=1"):
        assert describe(url) == url.split("://")[0] + "://***", url


def test_describe_without_psycopg_shows_no_credentials(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "psycopg", None)
    monkeypatch.setitem(sys.modules, "psycopg.conninfo", None)
    assert describe("postgresql://ci:s3cret@db.example.com/bench") == "postgresql://***"
    assert describe(Path("b.sqlite")) == "b.sqlite"


def test_store_locations(tmp_path: Path) -> None:
    url = "postgresql://ci@[::1]:5432/db?sslmode=require"
    assert parse_location(f"  {url} ", tmp_path) == url
    assert parse_location("perf/b.sqlite", tmp_path) == tmp_path / "perf" / "b.sqlite"
    assert parse_location("perf/", tmp_path) == tmp_path / "perf" / "benchmarks.sqlite"
    assert parse_location(".", tmp_path) == tmp_path / "." / "benchmarks.sqlite"  # a folder
    assert parse_location(str(tmp_path / "a.db"), Path("/elsewhere")) == tmp_path / "a.db"
    root = tmp_path / "root"
    assert resolve_store(None, tmp_path, root) == root / ".gputrain" / "benchmarks.sqlite"
    assert resolve_store("  ", tmp_path, root) == root / ".gputrain" / "benchmarks.sqlite"
    assert resolve_store("b.sqlite", tmp_path, root) == tmp_path / "b.sqlite"
    with pytest.raises(ValueError, match=r"^postgresql://\*\*\* is not a valid PostgreSQL URL: "
                                         r"libpq cannot read it as meant \(not shown"):
        parse_location("postgresql://u:pw@[::1", tmp_path)
    with pytest.raises(ValueError, match=r"^'mysql':// is not a store this version knows"):
        parse_location("mysql://db/x", tmp_path)


# -- fingerprints --------------------------------------------------------------------------


def test_fingerprint_hash_ignores_informational_fields() -> None:
    other_host = dict(FINGERPRINT, host="999999999999", gpu_count=8)
    assert fp.fingerprint_hash(other_host) == fp.fingerprint_hash(FINGERPRINT)
    other_gpu = dict(FINGERPRINT, gpu_name="NVIDIA A100-SXM4-80GB")
    assert fp.fingerprint_hash(other_gpu) != fp.fingerprint_hash(FINGERPRINT)


def test_fingerprint_differences() -> None:
    current = dict(FINGERPRINT, torch_version="2.12.0+cu130", host="ffffffffffff")
    found = fp.differences(FINGERPRINT, current)
    assert [(d.field, d.strict) for d in found] == [("torch_version", True), ("host", False)]
    assert found[0].describe() == "torch_version: '2.11.0+cu130' -> '2.12.0+cu130'"
    assert fp.differences(FINGERPRINT, dict(FINGERPRINT)) == []


def test_cpu_model_strict_only_for_cpu_benchmarks() -> None:
    cpu = {"device_type": "cpu", "cpu_model": "Xeon A"}
    assert fp.differences(cpu, dict(cpu, cpu_model="Xeon B"))[0].strict
    gpu = dict(FINGERPRINT, cpu_model="Xeon A")
    assert not fp.differences(gpu, dict(gpu, cpu_model="Xeon B"))[0].strict


def test_collected_fingerprint_leaks_no_host_name() -> None:
    collected = fp.collect("cpu")
    assert collected["device_type"] == "cpu"
    assert collected["python"].split()[-1].count(".") == 1
    text = repr(collected)
    assert socket.gethostname() not in text
    assert len(collected["host"]) == 12
    assert set(fp.STRICT_FIELDS) <= set(collected)


def test_git_commit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_SHA", raising=False)
    monkeypatch.delenv("CI_COMMIT_SHA", raising=False)
    monkeypatch.delenv("BUILDKITE_COMMIT", raising=False)
    monkeypatch.delenv("GIT_COMMIT", raising=False)
    monkeypatch.setenv("GIT_CEILING_DIRECTORIES", str(tmp_path))
    assert fp.git_commit(tmp_path) is None
    monkeypatch.setenv("GITHUB_SHA", "abc123")
    assert fp.git_commit(tmp_path) == "abc123"
