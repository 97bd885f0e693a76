"""`python -m pytest_gputrain`: replay recorded facts, list and explain rules, clear errors."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_gputrain.cli import main

FACTS = Path(__file__).parent / "facts"


def replay(path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_gputrain", "replay", str(path), *args],
                          capture_output=True, text=True, check=False)


def test_recorded_healthy_2xh200_replays_to_no_findings() -> None:
    """Recorded with --gpu-facts-out on the lent 2x H200 (driver 580.159.04, torch 2.11)."""
    result = replay(FACTS / "h200x2_recorded.json", "--format", "json")
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["findings"] == []
    assert [d["name"] for d in report["environment"]["devices"]] == ["NVIDIA H200"] * 2


def test_recorded_hidden_gpus_replay_to_gt003() -> None:
    """Recorded there with CUDA_VISIBLE_DEVICES="": the same finding as on the device."""
    result = replay(FACTS / "h200x2_hidden_recorded.json")
    assert result.returncode == 1  # an error-level finding fails, as --gpu-fail-on=error does
    assert "GT003 gpus-hidden-by-cuda-visible-devices [error] session" in result.stdout
    assert 'CUDA_VISIBLE_DEVICES="" hides every GPU: NVML lists 2 GPU(s)' in result.stdout
    assert replay(FACTS / "h200x2_hidden_recorded.json", "--fail-on", "never").returncode == 0
    assert replay(FACTS / "h200x2_hidden_recorded.json", "--ignore", "GT003").returncode == 0


def test_markdown_replay() -> None:
    result = replay(FACTS / "h200x2_hidden_recorded.json", "--format", "md")
    assert result.stdout.startswith("## GPU diagnosis (pytest-gputrain)")
    assert "| `GT003`" in result.stdout.replace("🔴 error ", "")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "no such file"),
        ("{not json", "not valid JSON"),
        ('{"kind": "something-else"}', "not a pytest-gputrain facts file"),
        ('{"kind": "pytest-gputrain-facts", "schema_version": 99}', "schema version 99"),
        ('{"kind": "pytest-gputrain-facts", "schema_version": 1, "environment": '
         '{"devices": [{"memory_total": "lots"}]}}', "invalid facts at environment.devices.0"),
    ],
)
def test_bad_facts_files_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, message: str
) -> None:
    path = tmp_path / "facts.json"
    if content is not None:
        path.write_text(content)
    assert main(["replay", str(path)]) == 2
    error = capsys.readouterr().err
    assert error.startswith("pytest_gputrain: error: ")
    assert str(path) in error
    assert message in error
    if content is not None:
        assert path.read_text() == content  # never touched


def _healthy_run_with(marker: str, inserted: str) -> str:
    """The recorded healthy run's facts file with ``marker`` (a JSON value in it) replaced."""
    text = json.dumps(json.loads((FACTS / "run_healthy_h200.json").read_text()))
    assert marker in text
    return text.replace(marker, inserted, 1)


DEEP = "arrays or objects are nested too deeply to read (a facts file nests fewer than ten levels)"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[" * 100_000, DEEP),
        (_healthy_run_with('"runs": [', '"runs": [' + "[" * 100_000 + "]" * 100_000 + ","),
         DEEP),
        (_healthy_run_with('"runs": [', '"runs": [' + "9" * 5000 + ","),
         "the integer '" + "9" * 40 + "'... (5000 characters) is out of range (a fact is at "
         "most 2**63)"),
        (_healthy_run_with('"memory_used": ', '"memory_used": ' + "1" + "0" * 400 + ", \"x\": "),
         "the integer '1000000000000000000000000000000000000000'... (401 characters) is out of "
         "range (a fact is at most 2**63)"),
        (_healthy_run_with('"memory_used": ', '"memory_used": NaN, "x": '),
         "NaN is not a JSON number (write null for an unknown value)"),
        (_healthy_run_with('"memory_used": ', '"memory_used": -Infinity, "x": '),
         "-Infinity is not a JSON number (write null for an unknown value)"),
    ],
    ids=["deep", "deep-inside-facts", "5000-digits", "400-digits", "nan", "infinity"],
)
def test_hostile_facts_files_are_clear_errors(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    path = tmp_path / "facts.json"
    path.write_text(content)
    result = replay(path)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"pytest_gputrain: error: {path}: {message}\n"


@pytest.mark.parametrize("output", ["text", "md", "json"])
def test_a_lone_surrogate_in_a_device_name_is_printed_escaped(tmp_path: Path,
                                                              output: str) -> None:
    path = tmp_path / "facts.json"
    path.write_text(_healthy_run_with('"NVIDIA H200"', '"NVIDIA \\ud800 H200"'))
    result = replay(path, "--format", output)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)["environment"]["devices"][0]["name"] if output == "json" \
        else result.stdout
    assert "NVIDIA \\ud800 H200" in shown


def test_rules_lists_the_catalogue(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    out = capsys.readouterr().out
    assert "GT001" in out and "no-nvidia-driver" in out
    assert main(["rules", "--scope", "device"]) == 0
    device_only = capsys.readouterr().out
    assert "GT007" in device_only and "GT001" not in device_only


def test_explain_prints_the_docs(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "gt007"]) == 0
    out = capsys.readouterr().out
    for heading in ("## What it checks", "## Why is this bad", "## Example", "## Fix",
                    "## Options", "## References"):
        assert heading in out
    assert "GT007.min_memory" in out
    assert main(["explain", "GT999"]) == 2
    assert "no rule 'GT999'" in capsys.readouterr().err


def test_facts_and_schema_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["facts", "--scope", "device"]) == 0
    out = capsys.readouterr().out
    assert "device.memory_total" in out and "bytes" in out
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema["properties"]["schema_version"]["default"] == 1
    assert "findings" in schema["required"]


@pytest.mark.parametrize("command", [
    ["rules"],
    ["replay", str(FACTS / "h200x2_hidden_recorded.json")],
    ["replay", str(FACTS / "run_healthy_h200.json"), "--format", "md"],
    ["replay", str(FACTS / "run_healthy_h200.json"), "--format", "json"],
    ["explain", "GT007"],
    ["facts", "--scope", "run"],
    ["schema"],
    ["--help"],
    ["--version"],
    ["history", "--help"],
], ids=lambda command: " ".join(Path(part).name for part in command))
def test_a_reader_that_went_away_ends_the_command_quietly(command: list[str]) -> None:
    """`python -m pytest_gputrain rules | head`: no BrokenPipeError traceback, whichever
    command. The pipe's reading end is closed before the command starts, so every write fails
    (as it does for `| true`, or for `| head` once head has its lines)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "pytest_gputrain", *command],
                                stdout=write_end, stderr=subprocess.PIPE, text=True,
                                check=False)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode in (0, 1)  # 1 as Python's docs do; argparse's --help exits 0


def test_head_takes_its_lines_and_the_rest_stops_quietly() -> None:
    """A real shell pipeline: `head` has its line from the first command and is gone by the
    time the second one writes."""
    command = (f"{shlex.quote(sys.executable)} -m pytest_gputrain explain GT007; "
               + f"{shlex.quote(sys.executable)} -m pytest_gputrain schema")
    result = subprocess.run(["bash", "-c", f"({command}) | head -n 1"],
                            capture_output=True, text=True, check=False)
    assert result.stdout.startswith("GT007")
    assert "Traceback" not in result.stderr and "BrokenPipeError" not in result.stderr
