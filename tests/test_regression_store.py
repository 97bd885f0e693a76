"""The benchmark store: schema, recognition of foreign files, concurrent writers; fingerprints."""

from __future__ import annotations

import multiprocessing
import socket
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.regression import fingerprint as fp
from pytest_gputrain.regression.store import (
    APPLICATION_ID,
    SCHEMA_VERSION,
    ResultRecord,
    Store,
    StoreError,
    inspect,
)

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


def test_new_store_has_schema_marker_and_wal(tmp_path: Path) -> None:
    path = tmp_path / "deep" / "benchmarks.sqlite"
    assert inspect(path) == "missing"
    with Store.open(path) as store:
        assert store.runs() == []
    assert inspect(path) == "ours"
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID
        assert connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        rows = connection.execute("SELECT application, version FROM gputrain_schema").fetchall()
        assert rows == [("pytest-gputrain", SCHEMA_VERSION)]
    finally:
        connection.close()


def test_save_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    with Store.open(path) as store:
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
        assert store.nodeids() == ["t.py::a", "t.py::b"]
        assert [r.name for r in store.runs(name="main")] == ["main", "main"]
        assert len(store.runs(limit=1)) == 1


def test_add_result_replaces_same_test(tmp_path: Path) -> None:
    with Store.open(tmp_path / "b.sqlite") as store:
        run = store.create_run("x", FINGERPRINT, "h", None)
        store.add_result(run, record("t::a", [1.0]))
        store.add_result(run, record("t::a", [2.0]))
        assert store.results(run)["t::a"].metrics["step_time"] == [2.0]


def test_reopen_keeps_data(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    with Store.open(path) as store:
        store.save_run("a", FINGERPRINT, "h", None, [record("t::a")])
    with Store.open(path, create=False) as store:
        assert [r.name for r in store.runs()] == ["a"]


def test_open_missing_without_create(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="no benchmark store"):
        Store.open(tmp_path / "none.sqlite", create=False)
    assert not (tmp_path / "none.sqlite").exists()


def test_empty_file_is_adopted(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    path.write_bytes(b"")
    assert inspect(path) == "empty"
    with Store.open(path) as store:
        store.save_run("a", FINGERPRINT, "h", None, [])
    assert inspect(path) == "ours"


def _assert_refused_untouched(path: Path, match: str) -> None:
    before = path.read_bytes()
    with pytest.raises(StoreError, match=match):
        Store.open(path)
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


def test_foreign_sqlite_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("CREATE TABLE customers (id INTEGER, name TEXT)")
    connection.execute("INSERT INTO customers VALUES (1, 'Ada')")
    connection.commit()
    connection.close()
    _assert_refused_untouched(path, "did not write.*customers")


def test_foreign_application_id_refused(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA application_id = 1234")
    connection.execute("CREATE TABLE gputrain_schema (application TEXT, version INTEGER, "
                       "created_at TEXT)")
    connection.commit()
    connection.close()
    _assert_refused_untouched(path, "did not write")


def test_newer_schema_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    with Store.open(path) as store:
        store.save_run("a", FINGERPRINT, "h", None, [record("t::a")])
    connection = sqlite3.connect(path)
    connection.execute("UPDATE gputrain_schema SET version = ?", (SCHEMA_VERSION + 1,))
    connection.commit()
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.close()
    before = path.read_bytes()
    with pytest.raises(StoreError, match="newer pytest-gputrain"):
        Store.open(path)
    assert path.read_bytes() == before


def test_directory_refused(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="directory"):
        Store.open(tmp_path)


def _writer(path: str, worker: int, shared_run: int, count: int) -> None:
    with Store.open(Path(path)) as store:
        own = store.create_run(f"writer-{worker}", FINGERPRINT, "h", None)
        for i in range(count):
            store.add_result(own, record(f"t.py::test_{i}"))
            store.add_result(shared_run, record(f"t.py::w{worker}_{i}"))


def test_concurrent_writers_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "b.sqlite"
    with Store.open(path) as store:
        shared_run = store.create_run("shared", FINGERPRINT, "h", None)
    context = multiprocessing.get_context("spawn")
    workers, count = 6, 25
    processes = [context.Process(target=_writer, args=(str(path), w, shared_run, count))
                 for w in range(workers)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    with Store.open(path, create=False) as store:
        runs = {run.name: run for run in store.runs()}
        assert len(runs) == workers + 1
        assert runs["shared"].result_count == workers * count
        for w in range(workers):
            assert runs[f"writer-{w}"].result_count == count
        assert len(store.results(shared_run)) == workers * count


def test_concurrent_first_open_of_a_new_file(tmp_path: Path) -> None:
    """Several processes creating the same new store at once: one schema, every run saved."""
    path = tmp_path / "new.sqlite"
    context = multiprocessing.get_context("spawn")
    processes = [context.Process(target=_first_open, args=(str(path), w)) for w in range(5)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
        assert process.exitcode == 0
    with Store.open(path, create=False) as store:
        assert sorted(r.name for r in store.runs()) == [f"p{w}" for w in range(5)]
    connection = sqlite3.connect(path)
    try:
        assert connection.execute("SELECT COUNT(*) FROM gputrain_schema").fetchone()[0] == 1
    finally:
        connection.close()


def _first_open(path: str, worker: int) -> None:
    with Store.open(Path(path)) as store:
        store.save_run(f"p{worker}", FINGERPRINT, "h", None, [record("t::a")])


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
