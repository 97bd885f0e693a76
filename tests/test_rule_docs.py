"""``explain`` and ``rules`` as a user reads them: fitted to the terminal, and a fix's template
shown as text with one line per case, never as its source."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from terminal_width import too_wide

from pytest_gputrain import cli
from pytest_gputrain.engine.expr import parse_template, read_template
from pytest_gputrain.probe.frameworks import case_label

ROOT = Path(__file__).resolve().parents[1]
CODES = sorted(path.name[:5] for path in (ROOT / "rules").glob("GT*.toml"))


def run_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str,
            columns: int = 80) -> str:
    monkeypatch.setenv("COLUMNS", str(columns))
    monkeypatch.chdir(ROOT)
    assert cli.main(list(args)) == 0
    return capsys.readouterr().out


def test_every_rule_file_is_counted() -> None:
    assert len(CODES) >= 97 and len(set(CODES)) == len(CODES)


@pytest.mark.parametrize("code", CODES)
def test_explain_fits_80_columns_and_shows_no_template_source(
        code: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(monkeypatch, capsys, "explain", code)
    assert out.startswith(f"{code} ")
    assert not too_wide(out), too_wide(out)
    fix = out.split("## Fix\n", 1)[1].split("\n## ", 1)[0]
    assert fix.strip(), "the fix is shown"
    assert "pick(" not in fix and "coalesce(" not in fix, fix


def test_explain_gt102_gives_each_framework_its_own_line(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(monkeypatch, capsys, "explain", "GT102")
    fix = out.split("## Fix\n", 1)[1].split("\n## ", 1)[0].splitlines()
    assert fix[0].startswith("Load batches in parallel with the training step")
    assert any(line.startswith("- Under Lightning: the loader is the DataLoader that")
               for line in fix)
    assert any(line.startswith("- Under the Hugging Face Trainer: the loader's settings are")
               for line in fix)
    assert "{" not in "\n".join(fix)
    # Code keeps its lines: the example's loop is still a loop.
    assert "    for x, y in loader:" in out.splitlines()


def test_explain_reflows_prose_to_a_wide_terminal(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    narrow = run_cli(monkeypatch, capsys, "explain", "GT102", columns=80)
    wide = run_cli(monkeypatch, capsys, "explain", "GT102", columns=160)
    assert max(map(len, wide.splitlines())) > 100  # prose uses the room
    assert len(wide.splitlines()) < len(narrow.splitlines())


def test_rules_fits_80_columns_and_lists_every_rule(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(monkeypatch, capsys, "rules")
    assert not too_wide(out), too_wide(out)
    listed = [line[:5] for line in out.splitlines() if line.startswith("GT")]
    assert listed == CODES
    assert "GT001  warning  session      no-nvidia-driver" in out.splitlines()


def test_rules_is_one_table_where_the_terminal_holds_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = run_cli(monkeypatch, capsys, "rules", columns=250)
    lines = out.splitlines()
    assert lines[0].split() == ["code", "name", "scope", "severity", "title"]
    assert len(lines) == len(CODES) + 2  # the header, its rule, a line per rule


def test_explain_and_rules_as_commands_fit_80_columns() -> None:
    """The installed command, in a process of its own, reads COLUMNS as a terminal sets it."""
    env = {**os.environ, "COLUMNS": "80"}
    for args in (["explain", "GT102"], ["rules"]):
        result = subprocess.run([sys.executable, "-m", "pytest_gputrain", *args], cwd=ROOT,
                                env=env, capture_output=True, text=True, check=False)
        assert result.returncode == 0, result.stderr
        assert not too_wide(result.stdout), too_wide(result.stdout)


# -- the template as read -------------------------------------------------------------------

def test_a_template_reads_as_text_with_facts_named() -> None:
    reading = read_template(parse_template(
        "Upgrade to CUDA {coalesce(torch.cuda_version, 'any')} on GPU {device.index}: "
        "{round(device.memory_total / 2, 1)} left."))
    assert reading.text == ("Upgrade to CUDA {torch.cuda_version} on GPU {device.index}: "
                            "{round(device.memory_total / 2, 1)} left.")
    assert reading.choices == ()


def test_each_case_of_a_pick_is_its_own_line_with_its_label() -> None:
    template = parse_template(
        '{pick(failure.cause, "oom", "Lower the batch. ", ["nccl", "gloo"], '
        '"Check the " + failure.backend + " setup. ", "Look at the log. ")}'
        "Then rerun.")
    reading = read_template(template)
    assert reading.text == "Then rerun."
    (cases,) = reading.choices
    assert [(case.label, case.text) for case in cases] == [
        ('When failure.cause is "oom"', "Lower the batch."),
        ('When failure.cause is one of "nccl", "gloo"', "Check the {failure.backend} setup."),
        ("Otherwise", "Look at the log."),
    ]


def test_a_framework_case_reads_under_the_framework() -> None:
    template = parse_template(
        '{pick(coalesce(run.framework, ""), "lightning", "Under Lightning, set it there. ", '
        '"transformers", "Use TrainingArguments. ", "")}Do it.')
    (cases,) = read_template(template, case_label).choices
    assert [(case.label, case.text) for case in cases] == [
        ("Under Lightning", "set it there."),
        ("Under the Hugging Face Trainer", "Use TrainingArguments."),
    ]  # the empty otherwise is left out


def test_a_boolean_case_reads_as_a_condition() -> None:
    template = parse_template('{pick(run.steps > 3, true, "Many. ", false, "Few. ", "")}')
    (cases,) = read_template(template).choices
    assert [case.label for case in cases] == ["When run.steps > 3", "When not run.steps > 3"]
