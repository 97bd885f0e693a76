"""A write to a store another writer has locked says, once, that it waits (store_wait.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from pytest_gputrain.regression import store_wait
from pytest_gputrain.regression.store_backends import open_store
from pytest_gputrain.regression.store_wait import WaitNotice, longest_wait

# Holds SQLite's write lock in another process until its stdin closes.
HOLD_SQLITE_LOCK = textwrap.dedent("""
    import sqlite3, sys
    connection = sqlite3.connect(sys.argv[1], isolation_level=None)
    connection.execute("BEGIN IMMEDIATE")
    print("locked", flush=True)
    sys.stdin.read()
    connection.execute("COMMIT")
""")


@pytest.fixture
def quick_notice(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_wait, "NOTICE_AFTER_S", 0.3)


def save(store: object, name: str) -> int:
    return store.create_run(name, {"gpu": "x"}, "hash", None)  # type: ignore[attr-defined, no-any-return]


@pytest.mark.usefixtures("quick_notice")
def test_a_sqlite_store_locked_by_another_process_says_it_waits_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "benchmarks.sqlite"
    with open_store(path) as store:
        save(store, "before")
        holder = subprocess.Popen([sys.executable, "-c", HOLD_SQLITE_LOCK, str(path)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        first_pid = holder.pid
        release = threading.Timer(1.5, holder.stdin.close)
        release.start()
        try:
            save(store, "waited")  # waits for the other process, then writes
        finally:
            release.join()
            holder.wait(timeout=30)
        holder = subprocess.Popen([sys.executable, "-c", HOLD_SQLITE_LOCK, str(path)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert holder.stdout is not None and holder.stdin is not None
        assert holder.stdout.readline().strip() == "locked"
        release = threading.Timer(1.0, holder.stdin.close)
        release.start()
        try:
            save(store, "waited again")
        finally:
            release.join()
            holder.wait(timeout=30)
        assert [run.name for run in store.runs()] == ["waited again", "waited", "before"]
    err = capsys.readouterr().err
    assert err.count("gputrain: waiting") == 1, err
    # The notice names the process that held the lock (the first holder: it is said once).
    assert (f"gputrain: waiting for the benchmark store {path}: another process, pid "
            f"{first_pid} (python") in err, err
    assert ("is writing to it; waiting at most about 6 min (12 attempts of 30 s) before giving "
            "up") in err


@pytest.mark.usefixtures("quick_notice")
def test_a_write_that_does_not_wait_says_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with open_store(tmp_path / "benchmarks.sqlite") as store:
        save(store, "main")
    assert capsys.readouterr().err == ""


@pytest.mark.usefixtures("quick_notice")
def test_a_postgres_store_locked_by_another_session_says_it_waits(
    postgres_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import psycopg

    with open_store(postgres_url) as store:
        where = store.where  # the URL without its password
        save(store, "before")
        with psycopg.connect(postgres_url) as other:
            other.execute("LOCK TABLE gputrain.runs IN ACCESS EXCLUSIVE MODE")
            release = threading.Timer(1.5, other.commit)
            release.start()
            try:
                save(store, "waited")
            finally:
                release.join()
        assert [run.name for run in store.runs()] == ["waited", "before"]
    err = capsys.readouterr().err
    assert err.count("gputrain: waiting") == 1, err
    assert (f"gputrain: waiting for the benchmark store {where}: another process is writing to "
            "it; waiting at most about 4 min (8 attempts of 30 s) before giving up") in err


def test_the_notice_names_the_store_as_given_and_is_said_once() -> None:
    class Stream:
        def __init__(self) -> None:
            self.text = ""

        def write(self, text: str) -> None:
            self.text += text

        def flush(self) -> None:
            pass

    stream = Stream()
    notice = WaitNotice("postgresql://ci:***@db/x", longest_wait(2, 5), after_s=0.05,
                        stream=stream)  # type: ignore[arg-type]
    for _ in range(2):
        with notice.waiting():
            threading.Event().wait(0.3)
    assert stream.text == ("gputrain: waiting for the benchmark store postgresql://ci:***@db/x: "
                           "another process is writing to it; waiting at most about 10 s (2 "
                           "attempts of 5 s) before giving up\n")
