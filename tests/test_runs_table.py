"""The table of probed training runs: long test ids wrap between their segments, whole."""

from __future__ import annotations

import re

import pytest

from pytest_gputrain.probe.summary import runs_lines, wrap_test_id

LONG_ID = ("sample_projects/pipelines/starved_loader/test_starved_loader.py::TestLoader::"
           "test_waits_on_its_loader[resnet18-bf16-batch64]")


def test_lines_join_back_into_the_id_and_break_only_between_segments() -> None:
    lines = wrap_test_id(LONG_ID, 28).split("\n")
    assert "".join(lines) == LONG_ID
    assert lines == ["sample_projects/pipelines/", "starved_loader/",
                     "test_starved_loader.py", "::TestLoader", "::test_waits_on_its_loader",
                     "[resnet18-bf16-batch64]"]


@pytest.mark.parametrize("width", [10, 28, 40, 60, 200])
def test_no_line_is_longer_than_the_width_unless_one_segment_is(width: int) -> None:
    segments = re.split(r"(?<=/)|(?=::)|(?=\[)|(?<=-)", LONG_ID)
    for line in wrap_test_id(LONG_ID, width).split("\n"):
        assert len(line) <= width or line in segments
    assert wrap_test_id("test_x.py::test_y", 28) == "test_x.py::test_y"


def test_the_runs_table_shows_whole_ids_wrapped_by_segment() -> None:
    runs = [{"nodeid": LONG_ID, "steps": 40, "device": "cuda:0", "step_time": 0.0123,
             "loader": {"wait_percent": 63.0}, "memory": {"peak_memory": 2**31}},
            {"nodeid": "tests/test_cpu.py::test_fit", "steps": 3, "device": "cpu"},
            {"nodeid": "tests/test_cpu.py::test_no_steps", "steps": 0}]
    lines = runs_lines(runs, width=100)
    assert lines[0] == "gputrain: 2 training run(s) probed"
    first_column = [line.split("  ", 1)[0].strip() for line in lines[3:]]
    assert "".join(first_column[:6]) == LONG_ID  # nothing cut, nothing dropped
    assert lines[3].startswith("sample_projects/pipelines/") and "12.3 ms" in lines[3]
    assert "peak memory" in lines[1] and "2.0 GiB" in lines[3]
    assert first_column[6] == "tests/test_cpu.py::test_fit"
