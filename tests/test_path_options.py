"""One rule for every path option: a command-line value is relative to the current directory, an
ini value to the ini file's folder (``options.read_with_base``), whichever feature reads it."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from pytest_gputrain import diagnosis_settings
from pytest_gputrain.plugin import read_rule_config
from pytest_gputrain.regression import settings as regression_settings

# Each path option: its flag, and a value of the form it expects.
PATH_OPTIONS = {
    "gpu_report": ("--gpu-report", "out/report.json"),
    "gpu_facts_out": ("--gpu-facts-out", "out/facts.json"),
    "gpu_rules_dir": ("--gpu-rules-dir", "out/rules"),
    "gpu_store": ("--gpu-store", "out/store.sqlite"),
    "gpu_benchmark_json": ("--gpu-benchmark-json", "out/bench.json"),
}


def resolved(config: pytest.Config) -> dict[str, Any]:
    """Every path option as the feature that reads it resolves it."""
    diagnosis = diagnosis_settings.read_settings(config)
    regression = regression_settings.read_settings(config)
    rules = read_rule_config(config)
    assert rules is not None
    return {"gpu_report": diagnosis.reports[0].path, "gpu_facts_out": diagnosis.facts_out,
            "gpu_rules_dir": rules.extra_dirs[0], "gpu_store": regression.store,
            "gpu_benchmark_json": regression.json_path}


@pytest.fixture
def subfolder(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """pytest is run from a folder below the project's root, where its ini file is."""
    folder = pytester.mkdir("sub")
    monkeypatch.chdir(folder)
    return folder


def ini_text(section: str = "[pytest]") -> str:
    return section + "\n" + "".join(f"{ini} = {value}\n"
                                    for ini, (_, value) in PATH_OPTIONS.items())


def test_ini_paths_are_relative_to_the_ini_files_folder(pytester: pytest.Pytester,
                                                        subfolder: Path) -> None:
    pytester.makeini(ini_text())
    paths = resolved(pytester.parseconfig())
    assert paths == {ini: pytester.path / value for ini, (_, value) in PATH_OPTIONS.items()}


def test_ini_paths_follow_the_ini_file_not_the_rootdir(pytester: pytest.Pytester,
                                                       subfolder: Path) -> None:
    """``-c ci/pytest.ini --rootdir .``: the ini file's folder, as pytest's own ``paths``
    settings."""
    ci = pytester.mkdir("ci")
    (ci / "pytest.ini").write_text(ini_text())
    config = pytester.parseconfig("-c", str(ci / "pytest.ini"), "--rootdir", str(pytester.path))
    assert Path(config.rootpath) == pytester.path
    paths = resolved(config)
    assert paths == {ini: ci / value for ini, (_, value) in PATH_OPTIONS.items()}


def test_command_line_paths_are_relative_to_the_current_directory(
        pytester: pytest.Pytester, subfolder: Path) -> None:
    pytester.makeini(ini_text())  # overridden, each by its command-line twin
    args = [f"{flag}=cli/{Path(value).name}" for flag, value in PATH_OPTIONS.values()]
    paths = resolved(pytester.parseconfig(*args))
    assert paths == {ini: subfolder / "cli" / Path(value).name
                     for ini, (_, value) in PATH_OPTIONS.items()}


def test_home_and_absolute_paths_stay_as_they_are(pytester: pytest.Pytester, subfolder: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(pytester.path / "home"))
    pytester.makeini("[pytest]\n" + "".join(
        f"{ini} = ~/{Path(value).name}\n" for ini, (_, value) in PATH_OPTIONS.items()))
    args = [f"{flag}={pytester.path / 'abs' / Path(value).name}"
            for flag, value in list(PATH_OPTIONS.values())[:2]]
    paths = resolved(pytester.parseconfig(*args))
    home, absolute = pytester.path / "home", pytester.path / "abs"
    assert paths == {"gpu_report": absolute / "report.json",
                     "gpu_facts_out": absolute / "facts.json", "gpu_rules_dir": home / "rules",
                     "gpu_store": home / "store.sqlite", "gpu_benchmark_json": home / "bench.json"}


def test_a_diagnosis_run_from_a_subfolder_writes_where_each_form_says(
        pytester: pytest.Pytester, subfolder: Path, use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    pytester.makeini("[pytest]\ngpu_report = reports/from-ini.json\n")
    pytester.makepyfile("def test_ok(): pass")
    assert pytester.runpytest(str(pytester.path)).ret == 0
    assert json.loads((pytester.path / "reports" / "from-ini.json").read_text())["findings"]
    assert pytester.runpytest(str(pytester.path), "--gpu-report=from-cli.json").ret == 0
    assert json.loads((subfolder / "from-cli.json").read_text())["findings"]
