"""Text for the terminal and Markdown: fitted to a width, in time linear in its length.

The structure is asserted here (lines, cells, what is cut); how long a 2 MB word takes is a
figure of benchmarks/replay_scaling.py, not a timed assertion.
"""

from __future__ import annotations

import pytest

from pytest_gputrain.facts import DeviceFacts, EnvironmentFacts, NvmlFacts
from pytest_gputrain.findings import Finding
from pytest_gputrain.report.markdown import markdown_cell
from pytest_gputrain.report.model import build_report
from pytest_gputrain.report.terminal import (
    PrintedReport,
    findings_lines,
    header_lines,
    section_text,
    shown_in_reports,
)
from pytest_gputrain.report.text import (
    ELLIPSIS,
    MAX_HEADLINE,
    MAX_PARAGRAPH,
    shorten,
    wrap,
    wrap_test_id,
)

URL = "https://docs.pytorch.org/docs/stable/notes/cuda.html#environment-variables"
NODEID = ("sample_projects/pipelines/starved_loader/test_starved_loader.py::TestLoader::"
          "test_waits_on_its_loader[resnet18-bf16-batch64]")


def finding(**fields: str) -> Finding:
    values = {"code": "GT118", "name": "training-stalls", "title": "Training stalls",
              "severity": "warning", "scope": "run", "subject": NODEID,
              "message": "Eight steps took long.", "fix": f"Profile the loop; see {URL}.",
              "why": "Idle GPU."}
    values.update(fields)
    return Finding(**values)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Wrapping


def test_words_fill_lines_up_to_the_width_and_break_at_spaces_only() -> None:
    text = "a well-known, hyphenated sentence with several words " * 4
    lines = wrap(text, 30, indent="  ")
    assert all(len(line) <= 30 and line.startswith("  ") for line in lines)
    assert " ".join(line.strip() for line in lines) == " ".join(text.split())
    assert all(not line.endswith("-") for line in lines)  # never at a hyphen


def test_a_url_is_never_broken_and_gets_its_own_line_when_longer_than_one() -> None:
    lines = wrap(f"Read (see {URL}) first, then {URL}.", 40, indent="    ")
    assert lines == ["    Read (see", f"    {URL})", "    first, then", f"    {URL}."]
    assert wrap(f"see {URL}", 100) == [f"see {URL}"]  # a URL that fits shares its line


def test_a_long_word_is_cut_into_pieces_of_the_line_width() -> None:
    lines = wrap("x" * 95, 30, indent="  ", first="fix: ")
    assert lines[0] == "fix: " + "x" * 25
    assert [len(line) for line in lines] == [30, 30, 30, 16]
    assert "".join(line.strip().removeprefix("fix:").strip() for line in lines) == "x" * 95


def test_a_test_id_in_text_breaks_between_its_segments() -> None:
    lines = wrap(f"in {NODEID} above", 50)
    assert lines == ["in", "sample_projects/pipelines/starved_loader/",
                     "test_starved_loader.py::TestLoader",
                     "::test_waits_on_its_loader[resnet18-bf16-batch64]", "above"]


@pytest.mark.parametrize("width", [12, 40, 80])
def test_a_2_mb_word_gives_one_line_per_width_and_nothing_is_lost(width: int) -> None:
    word = "w" * 2_000_000
    lines = wrap(word, width)
    assert len(lines) == -(-len(word) // width)
    assert sum(len(line) for line in lines) == len(word)


def test_a_2_mb_test_id_wraps_by_segment_then_by_width() -> None:
    nodeid = "tests/test_a.py::test_" + "y" * 2_000_000
    lines = wrap_test_id(nodeid, 80)
    assert lines[0] == "tests/test_a.py"
    assert "".join(lines) == nodeid
    assert all(len(line) <= 80 for line in lines)


def test_shorten_caps_with_an_ellipsis() -> None:
    assert shorten("abc", 3) == "abc"
    assert shorten("abcd", 3) == "ab" + ELLIPSIS
    assert len(shorten("z" * 10**6, MAX_HEADLINE)) == MAX_HEADLINE


# --------------------------------------------------------------------------------------------
# Findings


def test_each_finding_is_printed_once_within_the_width() -> None:
    lines = findings_lines([finding(), finding(code="GT003", severity="error",
                                               subject="session")], width=80)
    assert all(len(line) <= 80 for line in lines)
    text = "\n".join(lines)
    assert text.count("Eight steps took long.") == 2  # one finding each, not two
    assert text.count("GT118 training-stalls") == 1
    assert "ERROR GT003 training-stalls: Training stalls" in lines
    assert "    where: session" in lines
    assert lines[-1] == "details: python -m pytest_gputrain explain CODE"


def test_a_finding_shown_in_a_failure_report_is_only_pointed_to() -> None:
    shown = shown_in_reports([(NODEID, "failure report",
                               [("Captured stdout call", "ERROR GT118 x"),
                                ("gputrain diagnosis", section_text([finding()], 80))]),
                              ("other.py::test_c", "report", [("Captured log", "...")])])
    assert shown == {NODEID: PrintedReport("failure report",
                                           frozenset({"WARNING GT118 training-stalls"}))}
    lines = findings_lines([finding(), finding(subject="other.py::test_b")], width=80,
                           printed=shown)
    text = " ".join(" ".join(lines).split())
    assert text.count("Eight steps took long.") == 1  # the other test's, in full
    assert "see the failure report of sample_projects/" in text
    assert NODEID in "".join(line.strip() for line in lines)  # wrapped between segments
    # a launch's subject names its test and what it launched
    launch = finding(subject=f"{NODEID} [2 ranks, nccl]")
    assert "see the failure report" in " ".join(findings_lines([launch], 80, False, shown))


def test_the_failure_section_names_no_subject_and_fits_the_width() -> None:
    text = section_text([finding()], 60)
    assert NODEID not in text
    assert all(len(line) <= 60 or URL in line for line in text.splitlines())
    assert text.splitlines()[0] == "WARNING GT118 training-stalls: Training stalls"


def test_a_finding_of_megabytes_is_capped_to_a_few_lines() -> None:
    huge = finding(title="T" * 2_000_000, subject="tests/t.py::test_" + "x" * 2_000_000,
                   message="M" * 2_000_000, fix="F" * 2_000_000)
    lines = findings_lines([huge], width=80, verbose=True)
    assert all(len(line) <= 80 for line in lines)
    limit = (2 * MAX_HEADLINE + 3 * MAX_PARAGRAPH) // 70 + 20
    assert len(lines) < limit
    assert any(line.rstrip().endswith(ELLIPSIS) for line in lines)


def test_verbose_adds_why_and_the_evidence() -> None:
    lines = findings_lines([finding(severity="info")], width=80)
    assert not any("fix:" in line for line in lines)  # info: no fix unless verbose
    verbose = findings_lines([finding(severity="info")], width=80, verbose=True)
    assert any(line.startswith("    fix: ") for line in verbose)
    assert any(line.startswith("    why: Idle GPU.") for line in verbose)


# --------------------------------------------------------------------------------------------
# Header and Markdown


def test_the_header_fits_the_width_breaking_between_parts() -> None:
    env = EnvironmentFacts(nvml=NvmlFacts(available=True, driver_version="580.159.04",
                                          cuda_driver_version="13.0", device_count=1),
                           devices=[DeviceFacts(index=0, name="NVIDIA H200",
                                                compute_capability="9.0",
                                                memory_used=2**29, memory_total=141 * 2**30,
                                                temperature=38.0, power_draw=128.0,
                                                power_limit=700.0, utilization_gpu=0.0,
                                                processes=[])])
    env.env.variables = {"CUDA_VISIBLE_DEVICES": "0", "NCCL_DEBUG": "INFO" * 200}
    wide = header_lines(env)
    assert len(wide) == 3  # one line each, as before
    narrow = header_lines(env, width=60)
    assert all(len(line) <= 60 for line in narrow)
    assert narrow[0].startswith("gputrain: NVIDIA driver 580.159.04")
    device = [line for line in narrow if "GPU 0 NVIDIA H200" in line]
    assert device and device[0].endswith(" |")


def test_markdown_cells_are_one_line_with_escaped_pipes_and_rows_are_unpadded() -> None:
    assert markdown_cell("a | b\nc") == "a \\| b c"
    from pytest_gputrain.report.markdown import report_markdown

    report = build_report(EnvironmentFacts(), [finding(message="M" * 1_000_000),
                                               finding(code="GT101")], "error")
    text = report_markdown(report, {"runs": "| test |\n|---|"})
    rows = [line for line in text.splitlines() if line.startswith("| ")]
    assert rows[0] == "| severity | code | where | seen | fix |"
    short = next(row for row in rows if "`GT101`" in row)
    long = next(row for row in rows if "`GT118`" in row)
    assert len(short) < 1000  # not padded to the long one
    assert MAX_PARAGRAPH < len(long) < MAX_PARAGRAPH + 2 * MAX_HEADLINE + 100
    assert text.rstrip().endswith("### runs\n\n| test |\n|---|")
