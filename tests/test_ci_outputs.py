"""Findings where CI shows them: workflow annotations at the test's line, JUnit XML properties,
and the GPU section in pytest-html's report (docs/ci.md)."""

from __future__ import annotations

import html
import json
import re
import xml.etree.ElementTree as ET
from collections.abc import Callable
from typing import Any

import pytest

from pytest_gputrain.diagnosis_settings import parse_annotations
from pytest_gputrain.findings import Finding
from pytest_gputrain.report.annotations import annotation

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

# A test that fails on a CUDA out-of-memory error (GT201, an error) and one that trains on the
# CPU (a run with no finding on a machine without a GPU), beside one that does neither.
SUITE = """
    import torch


    def test_train():
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for _ in range(5):
            optimizer.zero_grad()
            model(torch.randn(8, 4)).sum().backward()
            optimizer.step()


    def test_oom():
        raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")


    def test_plain():
        pass
"""


def oom_line(pytester: pytest.Pytester) -> int:
    """The line of ``def test_oom`` in the file pytester wrote."""
    lines = (pytester.path / "test_suite.py").read_text().splitlines()
    return lines.index("def test_oom():") + 1


def _finding(severity: str, message: str = "m") -> Finding:
    return Finding(code="GT102", name="dataloader-starvation", title="t", severity=severity,
                   scope="run", subject="t.py::test_a", message=message, fix="f", why="w")


def test_an_annotation_names_the_file_line_and_rule_and_is_escaped() -> None:
    line = annotation(_finding("warning", "71 % waiting,\nworkers: 0"), "tests/t, x.py", 12)
    assert line == ("::warning file=tests/t%2C x.py,line=12,title=GT102 dataloader-starvation"
                    "::71 %25 waiting,%0Aworkers: 0 Fix: f")
    assert annotation(_finding("error"), None, None) == \
        "::error title=GT102 dataloader-starvation::m Fix: f"
    assert annotation(_finding("info"), "t.py", 3) is None  # information asks nothing


def test_annotations_are_on_under_github_actions_unless_told_otherwise() -> None:
    assert parse_annotations(None, {"GITHUB_ACTIONS": "true"}) is True
    assert parse_annotations("auto", {}) is False
    assert parse_annotations("never", {"GITHUB_ACTIONS": "true"}) is False
    assert parse_annotations("Always", {}) is True
    with pytest.raises(ValueError, match="'yes' is not a setting for workflow annotations; "
                                         "expected one of auto, always, never"):
        parse_annotations("yes", {})


def _run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_suite=SUITE)
    return pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never", "-p",
                              "no:cacheprovider", *args)


def test_github_actions_gets_an_annotation_at_the_failing_test_s_line(
        pytester: pytest.Pytester, use_facts: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    use_facts("cpu_laptop")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    monkeypatch.setenv("GITHUB_WORKSPACE", str(pytester.path.parent))
    result = _run(pytester)
    result.assert_outcomes(passed=2, failed=1)
    commands = [line for line in result.outlines if line.startswith("::")]
    folder = pytester.path.name
    assert len(commands) == 1, commands  # GT001 is about the session, not a test
    assert commands[0].startswith(
        f"::error file={folder}/test_suite.py,line={oom_line(pytester)},"
        "title=GT201 cuda-out-of-memory::CUDA ran out of memory trying to allocate 2.0 GiB")
    monkeypatch.delenv("GITHUB_ACTIONS")
    quiet = _run(pytester)
    assert not [line for line in quiet.outlines if line.startswith("::")]


def test_annotations_can_be_asked_for_and_refused(
        pytester: pytest.Pytester, use_facts: Callable[..., Any],
        monkeypatch: pytest.MonkeyPatch) -> None:
    use_facts("cpu_laptop")
    asked = _run(pytester, "--gpu-annotations=always")
    assert [line.split("::")[1] for line in asked.outlines if line.startswith("::")] == [
        f"error file=test_suite.py,line={oom_line(pytester)},title=GT201 cuda-out-of-memory"]
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    refused = _run(pytester, "-o", "gpu_annotations=never")
    assert not [line for line in refused.outlines if line.startswith("::")]
    bad = _run(pytester, "--gpu-annotations=sometimes")
    bad.stderr.fnmatch_lines(["*--gpu-annotations: 'sometimes' is not a "
                              "setting for workflow annotations; expected one of auto, always, "
                              "never"])


def _properties(path: Any) -> dict[str, list[tuple[str, str]]]:
    found = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        found[case.get("name", "")] = [(p.get("name", ""), p.get("value", ""))
                                       for p in case.iter("property")]
    return found


def test_findings_are_junit_xml_properties_of_their_test(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    use_facts("cpu_laptop")
    _run(pytester, "--junitxml=junit.xml").assert_outcomes(passed=2, failed=1)
    properties = _properties(pytester.path / "junit.xml")
    (name, value), = properties["test_oom"]
    assert name == "gpu_finding"
    assert value.startswith("GT201 [error] The test ran out of GPU memory: CUDA ran out of")
    assert "Fix: In this order" in value
    assert properties["test_train"] == properties["test_plain"] == []


def test_findings_reach_junit_xml_from_pytest_xdist_workers(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_suite=SUITE)
    result = pytester.runpytest_subprocess(
        "-n", "2", "--gpu-diagnose", "--gpu-fail-on=never", "-p", "no:cacheprovider",
        "--junitxml=junit.xml", "--gpu-annotations=always")
    result.assert_outcomes(passed=2, failed=1)
    assert [p[0] for p in _properties(pytester.path / "junit.xml")["test_oom"]] == [
        "gpu_finding"]
    result.stdout.fnmatch_lines(
        [f"::error file=test_suite.py,line={oom_line(pytester)},title=GT201 *"])


def test_pytest_html_shows_the_findings_and_the_timeline_in_the_test_s_extras(
        pytester: pytest.Pytester, use_facts: Callable[..., Any]) -> None:
    pytest.importorskip("pytest_html", reason="pytest-html is not installed")
    use_facts("cpu_laptop")
    _run(pytester, "--html=report.html", "--self-contained-html").assert_outcomes(
        passed=2, failed=1)
    page = (pytester.path / "report.html").read_text(encoding="utf-8")
    blob = re.search(r'data-jsonblob="([^"]*)"', page)
    assert blob is not None
    tests = json.loads(html.unescape(blob.group(1)))["tests"]

    def extras(nodeid: str) -> str:
        return "".join(extra["content"] for row in tests[nodeid] for extra in row["extras"]
                       if extra["format_type"] == "html")

    assert "<code>GT201</code> The test ran out of GPU memory" in extras("test_suite.py::test_oom")
    trained = extras("test_suite.py::test_train")
    assert "GPU diagnosis (pytest-gputrain)" in trained and "<svg" in trained
    assert "step time:" in trained  # the compact timeline's row of step times
    assert extras("test_suite.py::test_plain") == ""  # nothing recorded, nothing added
