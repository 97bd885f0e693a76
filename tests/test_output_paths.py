"""Output paths never replace what is not theirs (``outputs.py``).

A device or a FIFO is written through (``/dev/null`` stays a device, ``/dev/full`` is a clear
error), the process's stdout is written to, a directory or a socket is a usage error naming the
option, and two outputs naming one file are a usage error naming both options.
"""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain.outputs import OutputPathError, output_kind, write_output

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

NULL, FULL = os.makedev(1, 3), os.makedev(1, 7)


def make_device(path: Path, device: int) -> Path:
    """A character device node (tests run as root); skip where mknod is not permitted."""
    try:
        os.mknod(path, 0o666 | stat.S_IFCHR, device)
    except PermissionError as exc:
        pytest.skip(f"mknod not permitted here: {exc}")
    return path


def is_char_device(path: Path) -> bool:
    return stat.S_ISCHR(os.lstat(path).st_mode)


@pytest.fixture
def diagnosed(pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> pytest.Pytester:
    use_facts("cpu_laptop")
    pytester.makepyfile("def test_ok(): pass")
    return pytester


@pytest.mark.parametrize("option", ["--gpu-facts-out={}", "--gpu-report=json:{}",
                                    "--gpu-report=md:{}", "--gpu-benchmark-json={}"])
def test_a_null_device_is_written_through_and_stays_a_device(
    diagnosed: pytest.Pytester, option: str
) -> None:
    null = make_device(diagnosed.path / "null", NULL)
    result = diagnosed.runpytest("--gpu-diagnose", option.format("null"))
    assert result.ret == 0, result.stdout.str()
    assert is_char_device(null)
    assert [p.name for p in diagnosed.path.iterdir() if p.name.startswith(".null")] == []


@pytest.mark.parametrize("option, what", [("--gpu-facts-out={}", "facts"),
                                          ("--gpu-report=json:{}", "report")])
def test_a_full_device_is_an_error_naming_the_path(
    diagnosed: pytest.Pytester, option: str, what: str
) -> None:
    full = make_device(diagnosed.path / "full", FULL)
    result = diagnosed.runpytest(option.format("full"))
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines([f"gputrain: could not write the {what} */full: No space left "
                                 "on device"])
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    assert is_char_device(full)


def test_the_benchmark_json_on_a_full_device_is_a_note_not_a_traceback(
    pytester: pytest.Pytester,
) -> None:
    full = make_device(pytester.path / "full", FULL)
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-benchmark-json=full")
    assert "Traceback" not in result.stdout.str() + result.stderr.str()
    result.stdout.fnmatch_lines(["*could not write */full: *No space left on device*"])
    assert is_char_device(full)


def test_a_fifo_is_written_through_to_its_reader(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # a reader, as `cat pipe &` would be
    try:
        write_output(fifo, '{"kind": "facts"}\n')
        assert os.read(reader, 100) == b'{"kind": "facts"}\n'
    finally:
        os.close(reader)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_fifo_nobody_reads_is_an_error_not_a_hang(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(OSError, match="no process is reading"):
        write_output(fifo, "text\n")
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


def test_a_symbolic_link_stays_and_its_file_gets_the_output(tmp_path: Path) -> None:
    target = tmp_path / "shared" / "report.json"
    target.parent.mkdir()
    target.write_text("old\n")
    link = tmp_path / "report.json"
    link.symlink_to(target)
    write_output(link, "new\n")
    assert link.is_symlink() and target.read_text() == "new\n"


@pytest.mark.parametrize("option, ini", [
    ("--gpu-facts-out={}", "--gpu-facts-out"),
    ("--gpu-report=json:{}", "--gpu-report"),
    ("--gpu-benchmark-json={}", "--gpu-benchmark-json"),
])
@pytest.mark.parametrize("kind", ["directory", "socket"])
def test_a_directory_or_a_socket_is_a_usage_error_naming_it(
    diagnosed: pytest.Pytester, option: str, ini: str, kind: str
) -> None:
    path = diagnosed.path / "taken"
    if kind == "directory":
        path.mkdir()
    else:
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        diagnosed._request.addfinalizer(server.close)
    result = diagnosed.runpytest(option.format("taken"))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {ini}: */taken is a {kind}: an output goes to a new "
                                 "or regular file*"])
    assert (path.is_dir() if kind == "directory" else stat.S_ISSOCK(os.lstat(path).st_mode))


def test_output_kinds(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    assert output_kind(tmp_path / "file") == "file"
    assert output_kind(tmp_path / "new") == "new"
    assert output_kind(tmp_path / "file" / "below") == "new"  # its folder's error comes later
    assert output_kind(Path("/dev/null")) == "stream"
    with pytest.raises(OutputPathError, match="is a directory"):
        output_kind(tmp_path)


def test_dev_stdout_is_written_to_the_stream_and_stays_a_link(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok(): pass")
    was_link = os.path.islink("/dev/stdout")
    result = pytester.runpytest_subprocess("--gpu-fail-on=never", "--gpu-report=json:/dev/stdout",
                                           "-p", "no:cacheprovider")
    assert result.ret == 0, result.stderr.str()
    assert '"schema_version": 1' in result.stdout.str()
    result.stdout.fnmatch_lines(["gputrain: report written to /dev/stdout"])
    assert os.path.islink("/dev/stdout") == was_link


@pytest.mark.parametrize("args, first, second", [
    (["--gpu-report=x.json", "--gpu-facts-out=x.json"], "--gpu-report",
     "--gpu-facts-out"),
    (["--gpu-report=x.json", "--gpu-benchmark-json=x.json"], "--gpu-report",
     "--gpu-benchmark-json"),
    (["--gpu-facts-out=x.json", "--gpu-benchmark-json=./sub/../x.json"],
     "--gpu-facts-out", "--gpu-benchmark-json"),
    (["--gpu-save=main", "--gpu-store=x.json", "--gpu-facts-out=x.json"],
     "--gpu-facts-out", "--gpu-store"),
])
def test_two_outputs_on_one_file_are_a_usage_error_naming_both(
    diagnosed: pytest.Pytester, args: list[str], first: str, second: str
) -> None:
    result = diagnosed.runpytest(*args)
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {first} and {second} both write */x.json: one would "
                                 "overwrite the other; give each its own file"])
    assert not (diagnosed.path / "x.json").exists()


def test_the_same_report_twice_is_a_usage_error(diagnosed: pytest.Pytester) -> None:
    (diagnosed.path / "real.json").write_text("{}")
    (diagnosed.path / "alias.json").symlink_to(diagnosed.path / "real.json")
    result = diagnosed.runpytest("--gpu-report=real.json", "--gpu-report=alias.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpu-report names the same file twice "
                                 "(*/real.json and */alias.json)*"])


def test_devices_may_take_several_outputs(diagnosed: pytest.Pytester) -> None:
    make_device(diagnosed.path / "null", NULL)
    result = diagnosed.runpytest("--gpu-report=json:null", "--gpu-report=md:null",
                                 "--gpu-facts-out=null")
    assert result.ret == 0, result.stderr.str()
    assert is_char_device(diagnosed.path / "null")


def test_a_regular_file_is_still_replaced_whole(diagnosed: pytest.Pytester) -> None:
    (diagnosed.path / "facts.json").write_text("x" * 10_000_000)
    result = diagnosed.runpytest("--gpu-facts-out=facts.json")
    assert result.ret == 0
    assert json.loads((diagnosed.path / "facts.json").read_text())["kind"] == (
        "pytest-gputrain-facts")


# -- the start-up check refuses what it cannot create or replace (issue 29) --------------------


@pytest.mark.parametrize("option, ini, path", [
    ("--gpu-report=json:{}", "--gpu-report", "/proc/self/mem"),
    ("--gpu-facts-out={}", "--gpu-facts-out", "/proc/sys/kernel/hostname.json"),
    ("--gpu-benchmark-json={}", "--gpu-benchmark-json",
     "/sys/kernel/gputrain.json"),
])
def test_kernel_interfaces_are_refused_before_the_tests_run(
    diagnosed: pytest.Pytester, option: str, ini: str, path: str
) -> None:
    result = diagnosed.runpytest(option.format(path))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {ini}: {path} is under /*, the kernel's interface, "
                                 "not a file an output can be written to"])
    assert "passed" not in result.stdout.str()


def test_a_path_below_a_file_is_refused_before_the_tests_run(diagnosed: pytest.Pytester
                                                             ) -> None:
    (diagnosed.path / "afile").write_text("in the way\n")
    result = diagnosed.runpytest("--gpu-facts-out=afile/facts.json")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpu-facts-out: */afile/facts.json "
                                 "cannot be created: */afile is a file, not a folder"])


def test_an_output_on_the_store_of_a_compare_is_refused(diagnosed: pytest.Pytester) -> None:
    (diagnosed.path / "bench.sqlite").write_bytes(b"")
    result = diagnosed.runpytest("--gpu-compare=latest", "--gpu-store=bench.sqlite",
                                 "--gpu-report=json:bench.sqlite")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: --gpu-report would overwrite "
                                 "*/bench.sqlite, which --gpu-store names and this "
                                 "run reads; give --gpu-report its own file"])


# -- replay --report: the same claims and writer as --gpu-report (issue 30, item 6) ------------


def test_replay_reports_are_checked_as_gpu_report_and_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from pytest_gputrain.cli import main

    monkeypatch.chdir(tmp_path)
    facts = str(Path(__file__).parent / "facts" / "cpu_laptop.json")
    code = main(["replay", facts, "--format", "json", "--report", "html:new/deeper/r.html",
                 "--report", "md:r.md"])
    out, err = capsys.readouterr()
    assert code == 0, err  # no finding reaches the default fail-on on the laptop
    assert json.loads(out)["schema_version"] == 1  # stdout keeps the replay's own report
    assert err.splitlines() == [f"gputrain: report written to {tmp_path}/new/deeper/r.html",
                                f"gputrain: report written to {tmp_path}/r.md"]
    assert (tmp_path / "new" / "deeper" / "r.html").read_text().startswith("<!DOCTYPE html>")
    for args, message in [
        (["--report", "json:/proc/self/mem"], "--report: /proc/self/mem is under /proc"),
        (["--report", "json:x.json", "--report", "md:x.json"], "--report names the same file "
                                                               "twice"),
        (["--report", f"json:{tmp_path}"], "is a directory: an output goes to a new or regular"),
        (["--report", "json:r.md/below.json"], "cannot be created: "),
    ]:
        assert main(["replay", facts, *args]) == 2
        out, err = capsys.readouterr()
        assert message in err, (args, err)
        assert out == ""  # refused before anything is replayed
