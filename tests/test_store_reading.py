"""Reading the benchmark store changes nothing (``store_backends.open_for_reading``): the
commands that only read (``history``, ``compare``, a ``--gpu-compare`` that saves nothing)
create no store, initialise no empty file, leave nothing beside it, read a store on a read-only
mount, and wait for a store another process holds locked, saying who holds it, rather than
calling it corrupt. A store path that is not a regular file (``/dev/null``) is refused before
anything is created beside it."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_gputrain.cli import main as cli_main
from pytest_gputrain.regression import store_sqlite, store_wait
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.regression.store_backends import open_store

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

NODE = "tests/test_step.py::test_train"
PRINT = {"device_type": "cpu", "cpu_model": "test"}


def record(value: float) -> ResultRecord:
    rounds = [value * (1 + 0.001 * k) for k in range(20)]
    return ResultRecord(NODE, PRINT, "hash", len(rounds),
                        {"step_time": rounds, "throttled": [False] * len(rounds)},
                        {"step_time": {"median": value}})


def saved_store(path: Path) -> Path:
    """A store with two names of three sessions each, closed (no -wal or -shm beside it)."""
    with open_store(path) as store:
        for index in range(3):
            store.save_run("base", PRINT, "hash", "a" * 40, [record(0.010)])
            store.save_run("head", PRINT, "hash", "b" * 40, [record(0.010 + index * 1e-6)])
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli_main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


READERS = {
    "history": ["history", "--store"],
    "compare": ["compare", "base", "head", "--regression", "step_time:50%", "--store"],
}


# -- a locked store is waited for, and never called corrupt --------------------------------

# Holds the store in another process until its stdin closes: an exclusive lock (no reader
# gets in, even in WAL mode), or a write in progress under a rollback journal.
HOLD = {
    "exclusive": textwrap.dedent("""
        import sqlite3, sys
        connection = sqlite3.connect(sys.argv[1], isolation_level=None)
        connection.execute("PRAGMA locking_mode = EXCLUSIVE")
        connection.execute("BEGIN EXCLUSIVE")
        connection.execute("SELECT COUNT(*) FROM runs").fetchone()
        print("locked", flush=True)
        sys.stdin.read()
        connection.execute("COMMIT")
    """),
    "rollback journal": textwrap.dedent("""
        import sqlite3, sys
        connection = sqlite3.connect(sys.argv[1], isolation_level=None)
        connection.execute("PRAGMA journal_mode = DELETE")
        connection.execute("BEGIN EXCLUSIVE")
        connection.execute("UPDATE runs SET name = name")
        print("locked", flush=True)
        sys.stdin.read()
        connection.execute("ROLLBACK")
    """),
}


@pytest.fixture
def short_waits(monkeypatch: pytest.MonkeyPatch) -> None:
    """Waits of a test's length: 3 attempts of 0.4 s, the notice after 0.2 s."""
    monkeypatch.setattr(store_sqlite, "BUSY_TIMEOUT_S", 0.4)
    monkeypatch.setattr(store_sqlite, "WRITE_ATTEMPTS", 3)
    monkeypatch.setattr(store_wait, "NOTICE_AFTER_S", 0.2)


@pytest.fixture(params=sorted(HOLD))
def holder(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[subprocess.Popen[str]]:
    path = saved_store(tmp_path / "benchmarks.sqlite")
    process = subprocess.Popen([sys.executable, "-c", HOLD[request.param], str(path)],
                               stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None and process.stdout.readline().strip() == "locked"
    yield process
    if process.stdin is not None and not process.stdin.closed:
        process.stdin.close()
    process.wait(timeout=30)


@pytest.mark.usefixtures("short_waits")
@pytest.mark.parametrize("command", sorted(READERS))
def test_a_store_locked_to_the_end_is_called_locked_naming_the_holder(
    holder: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    command: str
) -> None:
    path = tmp_path / "benchmarks.sqlite"
    before = path.read_bytes()
    code, out, err = cli(capsys, *READERS[command], str(path))
    assert code == 2 and out == ""
    assert f"{path} is locked: another process, pid {holder.pid} (python" in err, err
    assert "corrupt" not in err and "Move it away" not in err and "move it" not in err.lower()
    assert f"waiting for the benchmark store {path}: another process, pid {holder.pid}" in err
    assert path.read_bytes() == before


@pytest.mark.usefixtures("short_waits")
def test_a_store_released_while_waiting_is_read(
    holder: subprocess.Popen[str], tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(store_sqlite, "WRITE_ATTEMPTS", 12)  # about 5 s in all
    assert holder.stdin is not None
    release = threading.Timer(1.5, holder.stdin.close)
    release.start()
    try:
        code, out, err = cli(capsys, "history", "--store", str(tmp_path / "benchmarks.sqlite"))
    finally:
        release.join()
    assert code == 0, err
    assert len([line for line in out.splitlines() if " base " in line]) == 3
    assert err.count("gputrain: waiting for the benchmark store") == 1, err
    assert "is using it" in err


@pytest.mark.usefixtures("short_waits")
def test_gpu_save_on_a_store_locked_to_the_end_says_locked(
    pytester: pytest.Pytester, holder: subprocess.Popen[str], tmp_path: Path
) -> None:
    path = tmp_path / "benchmarks.sqlite"
    pytester.makepyfile("def test_ok(gpu_benchmark):\n    gpu_benchmark(lambda: None, "
                        "rounds=3, device='cpu')\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--gpu-store={path}",
                                "--gpu-save=main")
    text = result.stdout.str() + result.stderr.str()
    assert f"{path} is locked: another process, pid {holder.pid}" in text, text
    assert "corrupt" not in text and "Move it away" not in text


# -- a read-only mount ---------------------------------------------------------------------


def _mount_read_only(source: Path, target: Path) -> list[str] | None:
    """A command that runs another one with ``source`` mounted read-only at ``target``: a bind
    mount of its own namespace (``unshare``); None where mounts are not permitted here."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    probe = subprocess.run([unshare, "-rm", "sh", "-c",
                            f"mount --bind -o ro '{source}' '{target}' && "
                            f"! touch '{target}/probe' 2>/dev/null"],
                           capture_output=True, check=False)
    if probe.returncode != 0:
        return None
    return [unshare, "-rm", "sh", "-c",
            f"mount --bind -o ro '{source}' '{target}' && exec \"$0\" \"$@\""]


@pytest.fixture
def read_only(tmp_path: Path) -> tuple[Path, list[str]]:
    """A saved store seen through a read-only mount, and the prefix that runs a command
    there."""
    source, target = tmp_path / "cache", tmp_path / "mounted"
    source.mkdir()
    target.mkdir()
    saved_store(source / "benchmarks.sqlite")
    prefix = _mount_read_only(source, target)
    if prefix is None:
        pytest.skip("no read-only bind mount here (unshare -rm not permitted)")
    return target / "benchmarks.sqlite", prefix


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_store_on_a_read_only_mount_is_read(read_only: tuple[Path, list[str]],
                                             command: str) -> None:
    path, prefix = read_only
    result = subprocess.run([*prefix, sys.executable, "-m", "pytest_gputrain",
                             *READERS[command], str(path)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "corrupt" not in result.stderr
    assert ("base" in result.stdout) if command == "history" else ("head" in result.stdout)
    assert sorted(p.name for p in (path.parent.parent / "cache").iterdir()) == [
        "benchmarks.sqlite"]


def test_a_read_only_store_with_a_write_ahead_log_is_read_whole(tmp_path: Path) -> None:
    """A store copied while a writer had runs in its log (-wal, -shm beside it) is read with
    them: a read-only connection, not an immutable one, which would not see the log."""
    source, target = tmp_path / "cache", tmp_path / "mounted"
    source.mkdir()
    target.mkdir()
    path = saved_store(source / "benchmarks.sqlite")
    subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import os, sqlite3, sys
        connection = sqlite3.connect(sys.argv[1], isolation_level=None)
        connection.execute("PRAGMA wal_autocheckpoint = 0")
        connection.execute("UPDATE runs SET name = 'in-the-log' WHERE id = 1")
        os._exit(0)  # gone without a checkpoint: the change is in the -wal file only
    """), str(path)], check=True)
    assert (source / "benchmarks.sqlite-wal").stat().st_size > 0
    prefix = _mount_read_only(source, target)
    if prefix is None:
        pytest.skip("no read-only bind mount here (unshare -rm not permitted)")
    result = subprocess.run([*prefix, sys.executable, "-m", "pytest_gputrain", "history",
                             "--store", str(target / "benchmarks.sqlite")],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "in-the-log" in result.stdout


# -- reading creates and changes nothing ------------------------------------------------------


@pytest.mark.parametrize("command", sorted(READERS))
def test_reading_leaves_the_folder_as_it_was(tmp_path: Path, command: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    path = saved_store(tmp_path / "benchmarks.sqlite")
    before = path.read_bytes()
    code, _, err = cli(capsys, *READERS[command], str(path))
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["benchmarks.sqlite"]
    assert path.read_bytes() == before


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_reading_command_creates_no_store(tmp_path: Path, command: str,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "new" / "benchmarks.sqlite"
    code, _, err = cli(capsys, *READERS[command], str(missing))
    assert code == 2 and "no benchmark store at" in err
    assert not (tmp_path / "new").exists()
    empty = tmp_path / "empty.sqlite"
    empty.write_bytes(b"")
    code, _, err = cli(capsys, *READERS[command], str(empty))
    assert code == 2 and f"no saved runs in {empty}" in err, err
    assert empty.read_bytes() == b"" and sorted(p.name for p in tmp_path.iterdir()) == [
        "empty.sqlite"]


def test_a_compare_only_session_leaves_an_empty_store_empty(pytester: pytest.Pytester) -> None:
    empty = pytester.path / "empty.sqlite"
    empty.write_bytes(b"")
    pytester.makepyfile("def test_ok(gpu_benchmark):\n    gpu_benchmark(lambda: None, "
                        "rounds=3, device='cpu')\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--gpu-store={empty}",
                                "--gpu-compare=latest")
    assert result.ret == 0, result.stdout.str()
    assert empty.read_bytes() == b""


def test_open_for_reading_cannot_write(tmp_path: Path) -> None:
    from pytest_gputrain.regression.store_backends import open_for_reading

    path = saved_store(tmp_path / "benchmarks.sqlite")
    with open_for_reading(path) as store:
        assert len(store.runs()) == 6
        with pytest.raises(Exception, match=r"readonly|read-only"):
            store.save_run("x", PRINT, "hash", None, [record(0.01)])
    assert len(open_for_reading(path).runs()) == 6


# -- a store that is not a regular file --------------------------------------------------------


def null_device(path: Path) -> Path:
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError as exc:
        pytest.skip(f"mknod not permitted here: {exc}")
    return path


@pytest.mark.parametrize("command", sorted(READERS))
def test_a_device_store_is_refused_and_nothing_is_created_beside_it(
    tmp_path: Path, command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    null = null_device(tmp_path / "null")
    code, _, err = cli(capsys, *READERS[command], str(null))
    assert code == 2
    assert f"{null} is a character device, not a benchmark store" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


def test_gpu_save_to_a_device_is_a_usage_error_and_creates_nothing(
    pytester: pytest.Pytester
) -> None:
    null = null_device(pytester.path / "null")
    pytester.makepyfile("def test_ok(gpu_benchmark):\n    gpu_benchmark(lambda: None, "
                        "rounds=3, device='cpu')\n")
    result = pytester.runpytest("-p", "no:cacheprovider", f"--gpu-store={null}",
                                "--gpu-save=main")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"*gpu_store: {null} is a character device, not a benchmark "
                                 "store*"])
    assert not (pytester.path / "null-journal").exists()
    assert not (pytester.path / "null-wal").exists()
