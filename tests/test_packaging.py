"""The project's metadata: one version number, the license, the links, and ``--version``."""

from __future__ import annotations

import configparser
import importlib.metadata
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import pytest_gputrain

try:
    import tomllib
except ImportError:  # Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
REPOSITORY = "https://github.com/pytest-gputrain/pytest-gputrain"


def test_the_version_is_written_once_in_the_package() -> None:
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert PYPROJECT["tool"]["hatch"]["version"]["path"] == "pytest_gputrain/__init__.py"
    assert importlib.metadata.version("pytest-gputrain") == pytest_gputrain.__version__


def test_the_license_file_matches_the_metadata() -> None:
    assert PYPROJECT["project"]["license"] == "MIT"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 The pytest-gputrain authors" in text
    assert "LICENSE" in PYPROJECT["tool"]["hatch"]["build"]["targets"]["sdist"]["include"]


def test_the_project_links_point_at_the_repository() -> None:
    urls = PYPROJECT["project"]["urls"]
    assert urls["Repository"] == urls["Homepage"] == REPOSITORY
    assert urls["Issues"] == f"{REPOSITORY}/issues"


def test_the_cli_prints_the_version() -> None:
    expected = f"pytest-gputrain {pytest_gputrain.__version__}\n"
    module = subprocess.run([sys.executable, "-m", "pytest_gputrain", "--version"],
                            capture_output=True, text=True, check=False)
    assert (module.returncode, module.stdout, module.stderr) == (0, expected, "")
    script = shutil.which("pytest-gputrain", path=str(Path(sys.executable).parent))
    if script is None:
        pytest.skip("the pytest-gputrain console script is not installed in this environment")
    console = subprocess.run([script, "--version"], capture_output=True, text=True, check=False)
    assert (console.returncode, console.stdout, console.stderr) == (0, expected, "")


def test_tox_environments_that_run_pytest_install_torch_and_tox_has_an_extra() -> None:
    """A fresh tox environment has no torch: without it the GPU tests would skip, not run."""
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    running_pytest = [section for section in tox.sections()
                      if any(command.split()[:1] == ["pytest"]
                             or command.split()[:3] == ["python", "-m", "pytest"]
                             for command in
                             tox.get(section, "commands", fallback="").splitlines())]
    assert {"testenv:tests", "testenv:gpu"} <= set(running_pytest)
    for section in running_pytest:
        deps = tox.get(section, "deps", fallback="").split()
        assert any(dep.startswith("torch") for dep in deps), f"{section} installs no torch"
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert any(dep.startswith("tox") for deps in extras.values() for dep in deps)


def test_the_lint_and_type_tools_are_pinned_and_tox_installs_them_from_the_extra() -> None:
    """A new ruff or mypy may report what the last did not: a clean checkout must pass
    ``tox -e lint,types`` as it passed when the pins were set."""
    lint = PYPROJECT["project"]["optional-dependencies"]["lint"]
    assert {dep.split("==")[0] for dep in lint} >= {"ruff", "mypy", "types-tabulate",
                                                   "types-psutil"}
    assert all("==" in dep for dep in lint), lint
    tox = configparser.ConfigParser()
    tox.read(ROOT / "tox.ini", encoding="utf-8")
    for section in ("testenv:lint", "testenv:types"):
        assert "lint" in tox.get(section, "extras").split(), section
        assert not tox.get(section, "deps", fallback=""), f"{section}: tools come from the extra"
    assert not tox.has_option("tox", "isolated_build")  # tox 3's; tox 4 builds this way always


def test_the_wheel_ships_the_rules_the_html_report_s_and_the_history_site_s_files(
        tmp_path: Path) -> None:
    builders = pytest.importorskip("hatchling.builders.wheel",
                                   reason="hatchling (the build backend) is not installed")
    wheel, = builders.WheelBuilder(str(ROOT)).build(directory=str(tmp_path),
                                                    versions=["standard"])
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    report = "pytest_gputrain/report/"
    assert {report + "templates/report.html.j2", report + "static/uPlot.iife.min.js",
            report + "static/uPlot.min.css", report + "static/uPlot.LICENSE",
            report + "static/report.js", report + "static/report.css",
            report + "templates/macros.html.j2", report + "templates/regression.html.j2",
            report + "static/tablesort.min.js", report + "static/tablesort.number.min.js",
            report + "static/tablesort.LICENSE"} <= names
    history = "pytest_gputrain/regression/"
    assert {history + "templates/history_head.html.j2", history + "templates/history_index.html.j2",
            history + "templates/history_test.html.j2", history + "static/history.js"} <= names
    assert "pytest_gputrain/rules/GT001-no-nvidia-driver.toml" in names
