"""`python -m pytest_gputrain`: replay recorded facts, list and explain rules, clear errors."""

from __future__ import annotations

import json
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
