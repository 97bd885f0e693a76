"""How the schema-1 stores beside this file were made: by the store code of commit 58807ed (the
last commit with store schema 1), so that the migration tests open stores that code wrote.

    python tests/stores/make_schema1_stores.py     # at commit 58807ed only

- ``schema1.sqlite``: an SQLite store, checkpointed (no ``-wal`` file beside it);
- ``schema1_postgres.sql``: the same runs saved into a PostgreSQL store (pgserver's server),
  dumped with ``pg_dump --schema=gputrain --inserts``;
- ``schema1_expected.json``: every run and result as that code read them back
  (``Store.runs``, ``Store.results``), which a migrated store must still give.

Kept for the record: run at a later commit, it would write that commit's schema instead.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import tempfile
import uuid
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from pytest_gputrain.regression.benchmark import BenchmarkResult  # noqa: E402
from pytest_gputrain.regression.compare import as_record  # noqa: E402
from pytest_gputrain.regression.store import Store  # noqa: E402
from pytest_gputrain.regression.store_backends import open_store  # noqa: E402
from pytest_gputrain.regression.store_schema import SCHEMA_VERSION  # noqa: E402

CUDA = {"device_type": "cuda", "gpu_name": "NVIDIA H200", "driver_version": "580.159.04",
        "torch_version": "2.11.0+cu130", "torch_cuda": "13.0", "cudnn_version": "91200",
        "python": "CPython 3.12", "platform": "linux-x86_64", "host": "3f9a0c1d2e4b",
        "gpu_count": 1, "cuda_driver_version": "13.0", "cpu_count": 16, "torch_threads": 8}
CPU = {"device_type": "cpu", "cpu_model": "AMD EPYC 7B13", "torch_version": "2.11.0+cpu",
       "python": "CPython 3.11", "platform": "linux-x86_64", "host": "77aa00bb11cc",
       "cpu_count": 2}


def _cuda_result(nodeid: str, base: float, gpu: bool, throttled: int = 0) -> BenchmarkResult:
    times = [base * (1 + 0.001 * (i % 7)) for i in range(40)]
    flags = [i < throttled for i in range(40)]
    result = BenchmarkResult(
        nodeid=nodeid, device="cuda:0", timer="cuda_event", warmup=5, step_time=times,
        peak_vram=[1_234_567_890, 1_234_600_000], utilization=[97.0] * 39 + [None],
        sm_clock=[1980.0] * 40, clock_event_reasons=[0x4] * 40, throttled=flags,
        fingerprint=CUDA,
        conditions={"profiler_before": False, "teardown_cupti": None, "cudnn_benchmark": False,
                    "cudnn_deterministic": False, "tf32_matmul": False,
                    "float32_matmul_precision": "highest", "sm_clock_median": 1980.0})
    if gpu:
        result.gpu_time = [base * 0.98 if i % 5 else None for i in range(30)]
    return result


def _cpu_result(nodeid: str, base: float) -> BenchmarkResult:
    return BenchmarkResult(nodeid=nodeid, device="cpu", timer="perf_counter", warmup=2,
                           step_time=[base + 1e-5 * i for i in range(12)],
                           throttled=[False] * 12, fingerprint=CPU,
                           conditions={"profiler_before": None, "teardown_cupti": None})


def _runs(store: Store) -> None:
    """A mix of what stores hold: names repeated at one commit (a side), a run without a commit,
    CPU and CUDA results, GPU time with rounds not queued, throttled rounds, odd names."""
    step = "tests/perf/test_step.py::test_train_step"
    odd = "tests/perf/test_step.py::test_param[größe-\"quoted\"-'x']"
    for index, (name, commit) in enumerate([("main", "5b0e4d33c2aa"), ("main", "5b0e4d33c2aa"),
                                            ("pr-41", "9f1c2e7a01bb"), ("pr-41", "9f1c2e7a01bb"),
                                            ("nightly ünïcode", None)]):
        results = [_cuda_result(step, 0.0075 + 0.0001 * index, gpu=index % 2 == 0,
                                throttled=index),
                   _cuda_result(odd, 0.012, gpu=False)]
        records = [as_record(r) for r in results]
        records = [type(r)(**{**r.__dict__, "created_at": f"2026-11-3{index}T12:00:00+00:00"})
                   for r in records]
        store.save_run(name, CUDA, records[0].fingerprint_hash, commit, records,
                       created_at=f"2026-11-3{index}T12:00:00+00:00")
    cpu = [as_record(_cpu_result("tests/test_cpu.py::test_mlp", 0.02))]
    cpu = [type(r)(**{**r.__dict__, "created_at": "2026-12-01T08:00:00+00:00"}) for r in cpu]
    store.save_run("cpu-main", CPU, cpu[0].fingerprint_hash, "5b0e4d33c2aa", cpu,
                   created_at="2026-12-01T08:00:00+00:00")


def _expected(store: Store) -> list[dict[str, Any]]:
    runs = []
    for run in sorted(store.runs(), key=lambda r: r.id):
        results = store.results(run.id)
        runs.append({"run": run.to_json(),
                     "results": {nodeid: {**record.__dict__} for nodeid, record in
                                 results.items()}})
    return runs


def main() -> None:
    assert SCHEMA_VERSION == 1, "run this at the last commit of store schema 1 (58807ed)"
    sqlite_path = HERE / "schema1.sqlite"
    sqlite_path.unlink(missing_ok=True)
    with open_store(sqlite_path) as store:
        _runs(store)
        expected = _expected(store)
    connection = sqlite3.connect(sqlite_path)
    connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    connection.execute("PRAGMA journal_mode = DELETE")
    connection.close()
    (HERE / "schema1_expected.json").write_text(json.dumps(expected, indent=1,
                                                           ensure_ascii=False) + "\n")

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
    import psycopg

    folder = Path(tempfile.mkdtemp(prefix="gputrain-pg-"))
    server = pgserver.get_server(folder / "data", cleanup_mode="delete")
    try:
        name = f"gputrain_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(server.get_uri(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        url = str(server.get_uri(name))
        with open_store(url) as store:
            _runs(store)
            assert _expected(store) == expected
        dump = Path(pgserver.__file__).parent / "pginstall" / "bin" / "pg_dump"
        text = subprocess.run([str(dump), "--schema=gputrain", "--inserts", "--no-owner",
                               "--no-privileges", "--dbname", url], check=True,
                              capture_output=True, text=True).stdout
        (HERE / "schema1_postgres.sql").write_text(text)
    finally:
        server.cleanup()


if __name__ == "__main__":
    main()
