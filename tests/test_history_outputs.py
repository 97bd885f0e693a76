"""What ``history`` writes (``--png``, ``--html``) goes through the outputs' one check
(``outputs.Claims``) and writer: never onto the store, never through a symbolic link out of the
folder named, exactly the file named and said; and no option of the commands, nor ini setting,
is silently empty (issue 29)."""

from __future__ import annotations

import argparse
import os
import random
import stat
from pathlib import Path

import pytest

from pytest_gputrain.cli import build_parser
from pytest_gputrain.cli import main as cli_main
from pytest_gputrain.regression import fingerprint
from pytest_gputrain.regression.store import ResultRecord
from pytest_gputrain.regression.store_backends import open_store

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

NODE = "tests/test_step.py::test_train"
PRINT = {"device_type": "cuda", "gpu_name": "NVIDIA H200"}
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def saved_store(path: Path, runs: int = 12) -> Path:
    rng = random.Random(1)
    with open_store(path) as store:
        for index in range(runs):
            value = 0.010 * (1.05 if index >= runs - 4 else 1.0) * (1 + rng.gauss(0, 0.001))
            rounds = [value * (1 + 0.001 * k) for k in range(10)]
            store.save_run("main", PRINT, fingerprint.fingerprint_hash(PRINT), f"{index:040d}",
                           [ResultRecord(NODE, PRINT, fingerprint.fingerprint_hash(PRINT), 10,
                                         {"step_time": rounds, "throttled": [False] * 10},
                                         {"step_time": {"median": value}})])
    return path


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = cli_main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return saved_store(tmp_path / "s.png")  # a store named like a picture, as in the issue


# -- --png ----------------------------------------------------------------------------------


def test_the_png_cannot_overwrite_the_store(store: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """``history --test T --png s.png --store s.png`` answered ``wrote s.png`` and the 12 runs
    were gone."""
    before = store.read_bytes()
    code, _, err = cli(capsys, "history", "--test", NODE, "--png", "s.png", "--store", "s.png")
    assert code == 2
    assert "--png would overwrite s.png, which --store names and this run reads" in err, err
    assert store.read_bytes() == before
    code, out, _ = cli(capsys, "history", "--store", "s.png")
    assert code == 0 and len([line for line in out.splitlines() if " main " in line]) == 12


def test_the_png_is_written_where_named_and_said(store: Path, tmp_path: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "history", "--test", NODE, "--png", "charts/step.png",
                         "--store", str(store))
    assert code == 0, err
    assert out.splitlines()[-1] == "wrote charts/step.png"
    assert (tmp_path / "charts" / "step.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("name", ["out.txt", "out.PNG.txt", "out.v2"])
def test_a_png_file_must_be_named_so(store: Path, tmp_path: Path, name: str,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``--png out.txt`` was a ValueError traceback."""
    code, out, err = cli(capsys, "history", "--test", NODE, "--png", name, "--store",
                         str(store))
    assert code == 2 and out == ""
    assert f"--png {name}: a PNG file's name ends in .png" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.png"]


def test_a_png_named_without_a_suffix_is_written_and_said_with_it(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--png out`` wrote out.png and said ``wrote out``."""
    code, out, err = cli(capsys, "history", "--test", NODE, "--png", "out", "--store",
                         str(store))
    assert code == 0, err
    assert out.splitlines()[-1] == "wrote out.png"
    assert (tmp_path / "out.png").read_bytes().startswith(PNG_MAGIC)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png", "s.png"]


def test_a_png_named_without_a_suffix_cannot_take_the_store_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    saved = saved_store(tmp_path / "runs.png")
    before = saved.read_bytes()
    code, _, err = cli(capsys, "history", "--test", NODE, "--png", "runs", "--store",
                       str(saved))
    assert code == 2 and "--png would overwrite runs.png" in err, err
    assert saved.read_bytes() == before


def test_a_device_takes_the_png_through_and_nothing_is_made_beside_it(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--png /dev/null`` created /dev/null.png."""
    null = tmp_path / "null"
    try:
        os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
    except PermissionError as exc:
        pytest.skip(f"mknod not permitted here: {exc}")
    code, out, err = cli(capsys, "history", "--test", NODE, "--png", str(null), "--store",
                         str(store))
    assert code == 0, err
    assert out.splitlines()[-1] == f"wrote {null}"
    assert stat.S_ISCHR(os.lstat(null).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null", "s.png"]


def test_a_png_in_the_kernel_interfaces_is_refused(store: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "history", "--test", NODE, "--png", "/proc/self/mem",
                       "--store", str(store))
    assert code == 2 and "/proc/self/mem is under /proc" in err


# -- --html: never through a link -------------------------------------------------------------


def site(capsys: pytest.CaptureFixture[str], store: Path, folder: Path) -> tuple[int, str]:
    code, _, err = cli(capsys, "history", "--html", str(folder), "--store", str(store))
    return code, err


def test_a_site_folder_that_is_a_link_is_refused_naming_it(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With ``DIR -> /etc`` it wrote /etc/index.html and /etc/tests/*.html."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "site").symlink_to(elsewhere)
    code, err = site(capsys, store, tmp_path / "site")
    assert code == 2
    assert f"{tmp_path / 'site'} is a symbolic link (to {elsewhere})" in err, err
    assert list(elsewhere.iterdir()) == []


@pytest.mark.parametrize("link", ["index.html", "tests"])
def test_a_link_inside_the_site_folder_is_refused_naming_it(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], link: str
) -> None:
    """With ``DIR/index.html -> victim`` it overwrote the victim."""
    folder = tmp_path / "site"
    folder.mkdir()
    victim = tmp_path / "victim"
    if link == "tests":
        victim.mkdir()
    else:
        victim.write_text("theirs\n")
    (folder / link).symlink_to(victim)
    code, err = site(capsys, store, folder)
    assert code == 2
    assert f"{folder / link} is a symbolic link" in err, err
    assert (list(victim.iterdir()) == [] if link == "tests"
            else victim.read_text() == "theirs\n")
    assert sorted(p.name for p in folder.iterdir()) == [link]  # nothing else written


def test_a_site_is_written_whole_as_a_new_folder_then_again_in_place(
    store: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "out" / "site"
    assert site(capsys, store, folder) == (0, "")
    written = sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))
    assert "index.html" in written and any(name.startswith("tests/") for name in written)
    assert not any(p.is_symlink() for p in folder.rglob("*"))
    mode = stat.S_IMODE(folder.stat().st_mode)
    assert mode & 0o055 == 0o055  # a folder others can read, as mkdir makes it (not mkdtemp's)
    (folder / "README.txt").write_text("ours\n")
    assert site(capsys, store, folder) == (0, "")
    assert (folder / "README.txt").read_text() == "ours\n"
    assert sorted(p.name for p in tmp_path.joinpath("out").iterdir()) == ["site"]  # no leftover


def test_the_site_cannot_take_the_store(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "site"
    folder.mkdir()
    store = saved_store(folder / "index.html")
    before = store.read_bytes()
    code, err = site(capsys, store, folder)
    assert code == 2 and "--html would overwrite" in err and "which --store names" in err, err
    assert store.read_bytes() == before


# -- no option is silently empty --------------------------------------------------------------


def _subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


REQUIRED = {"replay": ["facts.json"], "explain": ["GT001"], "compare": ["main", "pr"]}


def _valued() -> list[tuple[str, str]]:
    """Every option of every subcommand that takes a value (a flag, or a positional)."""
    found = []
    for name, parser in _subcommands().items():
        for action in parser._actions:
            if action.nargs == 0 or isinstance(action, argparse._HelpAction):
                continue
            found.append((name, action.option_strings[-1] if action.option_strings
                          else action.dest))
    return found


@pytest.mark.parametrize("command, option", _valued())
def test_an_empty_value_is_a_usage_error_naming_the_option(
    command: str, option: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``history --html ''`` listed the runs and exited 0."""
    positional = not option.startswith("-")
    args = list(REQUIRED.get(command, []))
    if positional:
        index = [a.dest for a in _subcommands()[command]._actions
                 if not a.option_strings and a.nargs != 0].index(option)
        args[index] = ""
    else:
        args += [option, ""]
    with pytest.raises(SystemExit) as exited:
        cli_main([command, *args])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    named = option.upper() if positional else option
    assert "error: argument " in err and (named in err or option in err), err


def test_history_html_empty_is_refused() -> None:
    with pytest.raises(SystemExit) as exited:
        cli_main(["history", "--html", ""])
    assert exited.value.code == 2


def test_an_empty_ini_setting_is_a_usage_error_naming_it(pytester: pytest.Pytester) -> None:
    """An empty ``gpu_cannot_tell =`` quietly meant ``warn``."""
    pytester.makeini("[pytest]\ngpu_cannot_tell =\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: gpu_cannot_tell is set to an empty value in the ini "
                                 "file (*tox.ini): give it a value, or leave it out for its "
                                 "default"])


@pytest.mark.parametrize("ini", ["gpu_fail_on", "gpu_store", "gpu_benchmark_warmup",
                                 "gpu_profile_steps", "gpu_facts_out"])
def test_every_single_value_setting_refuses_an_empty_value(pytester: pytest.Pytester,
                                                           ini: str) -> None:
    pytester.makeini(f"[pytest]\n{ini} =\n")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines([f"ERROR: {ini} is set to an empty value in the ini file*"])


def test_an_empty_value_given_with_o_is_named_so(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("-p", "no:cacheprovider", "-o", "gpu_cannot_tell=")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["ERROR: -o gpu_cannot_tell: an empty value is not a setting*"])


def test_an_empty_list_setting_is_an_empty_list(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\ngpu_select =\ngpu_report =\n")
    pytester.makepyfile("def test_ok(): pass")
    assert pytester.runpytest("-p", "no:cacheprovider").ret == 0


def test_compare_names_an_empty_ini_setting(pytester: pytest.Pytester,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makeini("[pytest]\ngpu_cannot_tell =\n")
    monkeypatch.chdir(pytester.path)
    store = saved_store(pytester.path / "b.sqlite")
    code, _, err = cli(capsys, "compare", "main", "latest", "--store", str(store))
    assert code == 2 and "gpu_cannot_tell is set to an empty value" in err, err
