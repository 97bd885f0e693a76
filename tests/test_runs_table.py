"""The table of probed training runs: it fits the terminal, and test ids wrap between their
segments, whole."""

from __future__ import annotations

import pytest

from pytest_gputrain.probe.summary import runs_lines, runs_markdown
from pytest_gputrain.report.text import nodeid_segments, wrap_test_id

LONG_ID = ("sample_projects/pipelines/starved_loader/test_starved_loader.py::TestLoader::"
           "test_waits_on_its_loader[resnet18-bf16-batch64]")
RUNS = [{"nodeid": LONG_ID, "steps": 40, "device": "cuda:0", "step_time": 0.0123,
         "loader": {"wait_percent": 63.0}, "memory": {"peak_memory": 2**31}},
        {"nodeid": "tests/test_cpu.py::test_fit", "steps": 3, "device": "cpu"},
        {"nodeid": "tests/test_cpu.py::test_no_steps", "steps": 0}]


def test_lines_join_back_into_the_id_and_break_only_between_segments() -> None:
    lines = wrap_test_id(LONG_ID, 28)
    assert "".join(lines) == LONG_ID
    assert lines == ["sample_projects/pipelines/", "starved_loader/",
                     "test_starved_loader.py", "::TestLoader", "::test_waits_on_its_loader",
                     "[resnet18-bf16-batch64]"]


@pytest.mark.parametrize("width", [10, 28, 40, 60, 200])
def test_no_line_is_longer_than_the_width_and_only_a_longer_segment_is_cut(width: int) -> None:
    segments = nodeid_segments(LONG_ID)
    lines = wrap_test_id(LONG_ID, width)
    assert "".join(lines) == LONG_ID
    for line in lines:
        assert len(line) <= width
        if not any(segment in line for segment in segments):
            assert any(line in segment for segment in segments if len(segment) > width)
    assert wrap_test_id("test_x.py::test_y", 28) == ["test_x.py::test_y"]


def test_a_wide_terminal_shows_the_ids_in_a_column_wrapped_by_segment() -> None:
    lines = runs_lines(RUNS, width=120)
    assert lines[0] == "gputrain: 2 training run(s) probed"
    assert all(len(line) <= 120 for line in lines)
    heading = next(index for index, line in enumerate(lines) if line.startswith("test "))
    assert "peak" in lines[heading - 1] and "memory" in lines[heading]
    rows = lines[heading + 2:]
    first_column = [line[:line.index("  ")] if "  " in line else line for line in rows]
    assert "".join(first_column[:-1]) == LONG_ID  # nothing cut, nothing dropped
    assert rows[0].startswith("sample_projects/") and "12.3 ms" in rows[0]
    assert "2.0 GiB" in rows[0] and "63 %" in rows[0]
    assert rows[-1].startswith("tests/test_cpu.py::test_fit ") and " cpu " in rows[-1]


def test_an_80_column_terminal_puts_each_id_above_its_figures() -> None:
    lines = runs_lines(RUNS, width=80)
    assert all(len(line) <= 80 for line in lines)
    assert lines[1] == "test"
    ids = [line for line in lines[2:] if not line.startswith("  ")]
    figures = [line for line in lines[2:] if line.startswith("  ")]
    assert "".join(ids[:-1]) == LONG_ID and ids[-1] == "tests/test_cpu.py::test_fit"
    assert any("12.3 ms" in line and "2.0 GiB" in line for line in figures)
    # each id's figures follow its last line
    assert "12.3 ms" in lines[lines.index(ids[-2]) + 1]


def test_only_the_first_runs_are_shown_and_the_count_says_so() -> None:
    runs = [{"nodeid": f"t.py::test_{index}", "steps": 1, "device": "cpu"}
            for index in range(40)]
    lines = runs_lines(runs, width=100, limit=30)
    assert lines[0] == "gputrain: 40 training run(s) probed (first 30 shown)"
    assert sum(line.startswith("t.py::test_") for line in lines) == 30


def test_an_id_of_megabytes_is_capped_and_every_line_still_fits() -> None:
    runs = [{"nodeid": "t.py::test_" + "x" * 2_000_000, "steps": 1, "device": "cpu"}]
    lines = runs_lines(runs, width=80)
    assert all(len(line) <= 80 for line in lines)
    assert 2 < len(lines) < 20


def test_the_markdown_table_has_every_column_and_escaped_pipes() -> None:
    runs = [*RUNS, {"nodeid": "t.py::test_a[x|y]", "steps": 2, "device": "cpu"}]
    text = runs_markdown(runs)
    assert text is not None
    lines = text.splitlines()
    assert lines[0] == "3 training run(s) probed"
    assert lines[2] == ("| test | device | steps | step | loader wait | GPU busy | syncs/step "
                        "| peak memory |")
    assert lines[3] == "|---|---|---|---|---|---|---|---|"
    assert lines[4] == (f"| {LONG_ID} | cuda:0 | 40 | 12.3 ms | 63 % | - | - | 2.0 GiB |")
    assert lines[-1] == "| t.py::test_a[x\\|y] | cpu | 2 | - | - | - | - | - |"
    assert runs_markdown([RUNS[2]]) is None  # no test trained
