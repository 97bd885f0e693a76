"""Inputs from files a user hands over (rule files, facts files) that used to pass silently or
without a bound: nan and inf thresholds, negative counts, control and bidirectional characters
on their way to the terminal, and files of unbounded size (``replay /dev/zero``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from endless_input import endless_json

from pytest_gputrain.cli import main
from pytest_gputrain.jsonfile import INPUT_LIMIT_VARIABLE
from pytest_gputrain.units import printable

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

FACTS = Path(__file__).parent / "facts"
RULE = """code = "GT901"
name = "few-cpus"
title = "few CPUs"
scope = "session"
severity = "warning"
condition = "host.cpu_count_logical < params.min_cpus"
message = "m"
fix = "f"
why = "w"

[params]
min_cpus = {value}
"""


def replay(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["replay", *args])
    out, err = capsys.readouterr()
    return code, out, err


def facts_file(tmp_path: Path, name: str = "h200x2_hidden_recorded", **changes: Any) -> Path:
    """A recorded facts file with ``changes`` (dotted paths under ``environment``) applied."""
    data = json.loads((FACTS / f"{name}.json").read_text())
    for dotted, value in changes.items():
        target = data["environment"]
        *parents, last = dotted.split(".")
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        if isinstance(target, list):
            target[int(last)] = value
        else:
            target[last] = value
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    return path


# -- nan and inf thresholds in a rule file ----------------------------------------------------

@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "+nan"])
def test_a_rule_file_threshold_of_nan_or_inf_is_refused_naming_file_rule_and_param(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], value: str
) -> None:
    (tmp_path / "GT901-few-cpus.toml").write_text(RULE.format(value=value))
    assert main(["rules", "--rules-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'GT901-few-cpus.toml'}: rule GT901: params.min_cpus = " in err
    assert "is not a finite number" in err


def test_a_nan_threshold_is_a_usage_error_in_pytest_too(pytester: pytest.Pytester) -> None:
    rules = pytester.mkdir("gpu-rules")
    (rules / "GT901-few-cpus.toml").write_text(RULE.format(value="nan"))
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-rules-dir=gpu-rules")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*GT901-few-cpus.toml: rule GT901: params.min_cpus = nan is "
                                 "not a finite number*"])


# -- negative counts in a facts file ----------------------------------------------------------

@pytest.mark.parametrize("field, value", [
    ("nvml.device_count", -5), ("torch.device_count", -5), ("devices.0.index", -1),
    ("devices.0.pcie_gen", -3), ("devices.0.other_process_count", -1),
    ("host.cpu_count_physical", -2), ("host.cpu_count_logical", -8),
])
def test_a_negative_count_in_a_facts_file_is_refused_naming_the_field(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], field: str, value: int
) -> None:
    code, out, err = replay(capsys, str(facts_file(tmp_path, **{field: value})))
    assert code == 2
    assert f"invalid facts at environment.{field}: Input should be greater than or equal to 0" \
        in err
    assert "GPU(s)" not in out


# -- control and bidirectional characters ------------------------------------------------------

HOSTILE = "\u202eevil\u202c \u2066iso\u2069 \u200e\u200f\u061c \x1b[2J\x1b]0;title\x07 \x85\u2028"
UNSEEN = "\u202e\u202c\u2066\u2069\u200e\u200f\u061c\x1b\x07\x85\u2028"  # what must not print


def test_printable_writes_out_controls_and_bidirectional_marks() -> None:
    assert printable("GPU\u202eH200") == "GPU\\u202eH200"
    assert printable("\x1b[2J") == "\\x1b[2J"
    assert printable("a\tb\nc") == "a\tb\nc"  # layout, not control
    assert printable(HOSTILE).isascii()
    for character in "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f":
        assert printable(character) == f"\\u{ord(character):04x}"


@pytest.mark.parametrize("form", ["text", "md"])
def test_hostile_strings_in_a_facts_file_reach_no_output_as_they_are(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], form: str
) -> None:
    path = facts_file(tmp_path, **{"devices.0.name": f"NVIDIA {HOSTILE} H200",
                                   "env.variables": {"NCCL_DEBUG": HOSTILE}})
    code, out, err = replay(capsys, str(path), "--format", form)
    assert code == 1, err  # GT003 fires, as in the recorded file
    assert "NVIDIA \\u202eevil\\u202c" in out
    for character in UNSEEN:
        assert character not in out, f"U+{ord(character):04X} reached the {form} output"


# -- a bound on what is read -----------------------------------------------------------------

def test_replay_of_an_unbounded_input_stops_at_the_limit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INPUT_LIMIT_VARIABLE, "1MiB")
    with endless_json(tmp_path) as endless:
        code, _, err = replay(capsys, str(endless))
    assert code == 2
    assert (f"{endless}: larger than 1 MiB (1048576 bytes), the most an input file may hold; "
            f"set {INPUT_LIMIT_VARIABLE} (e.g. 1GiB) to read a larger one") in err


def test_the_default_limit_stops_an_endless_input_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with endless_json(tmp_path) as endless:
        code, _, err = replay(capsys, str(endless))
    assert code == 2 and "larger than 256 MiB (268435456 bytes)" in err


def test_dev_zero_is_refused_at_its_first_block(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = replay(capsys, "/dev/zero")
    assert code == 2
    assert ("/dev/zero: not a pytest-gputrain facts file (written by --gpu-facts-out): its top "
            "level is not an object") in err


def test_a_file_at_the_limit_is_read_one_byte_more_is_not(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = facts_file(tmp_path)
    path.write_text(path.read_text() + " " * 100_000)  # larger than every rule file
    size = path.stat().st_size
    monkeypatch.setenv(INPUT_LIMIT_VARIABLE, str(size))
    assert replay(capsys, str(path))[0] == 1  # read and judged (GT003)
    monkeypatch.setenv(INPUT_LIMIT_VARIABLE, str(size - 1))
    code, _, err = replay(capsys, str(path))
    assert code == 2 and f"({size - 1} bytes), the most an input file may hold" in err


def test_a_rule_file_past_the_limit_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(INPUT_LIMIT_VARIABLE, "16KiB")  # more than any shipped rule file
    (tmp_path / "GT901-few-cpus.toml").write_text(RULE.format(value=4) + "#" * 20_000 + "\n")
    assert main(["rules", "--rules-dir", str(tmp_path)]) == 2
    assert "GT901-few-cpus.toml: larger than 16 KiB" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["lots", "0", "-1"])
def test_a_bad_limit_is_an_error_naming_the_variable(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv(INPUT_LIMIT_VARIABLE, value)
    code, _, err = replay(capsys, str(FACTS / "cpu_laptop.json"))
    assert code == 2 and f"not read: {INPUT_LIMIT_VARIABLE}: " in err


# -- pages and Markdown show hostile text as itself (issue 29) --------------------------------

def failure_facts(tmp_path: Path, nodeid: str, message: str) -> Path:
    """A recorded failed run (a device mismatch on the H200: GT202 names the test), its test
    id and failure message replaced."""
    data = json.loads((FACTS / "h200_samples" / "device_mismatch.json").read_text())
    for record in [*data["runs"], *data["failures"]]:
        record["nodeid"] = nodeid
    for failure in data["failures"]:
        failure["message"] = message
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(data))
    return path


INVISIBLE = "\u202e\u2066\u2067\u2068\u2069\u202a\u202b\u202c\u202d\u200e\u200f\u061c\u200b" \
            "\u2060\u2063\ufeff\u180e\u206a"


def test_the_html_report_writes_out_bidirectional_and_invisible_marks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The HTML report kept raw U+202E and U+2066 from a failure message; the terminal wrote
    them out."""
    path = failure_facts(tmp_path, "tests/test_train.py::test_\u202eevil",
                         f"assert {INVISIBLE} {HOSTILE} 0.62 >= 0.8")
    page = tmp_path / "report.html"
    code, out, err = replay(capsys, str(path), "--report", f"html:{page}")
    assert code in (0, 1), err
    text = page.read_text(encoding="utf-8")
    for character in UNSEEN + INVISIBLE:
        assert character not in text, f"U+{ord(character):04X} reached the HTML report"
        assert character not in out
    assert "test_\\u202eevil" in text  # written out, as the terminal writes it
    # The page's data (which its scripts draw) too: written out, not as the characters.
    from report_cases import page_data

    data = json.dumps(page_data(text), ensure_ascii=False)  # the page's block and each test's
    for character in UNSEEN + INVISIBLE:
        assert character not in data


def test_every_value_a_page_template_outputs_is_written_out() -> None:
    """The one environment of our pages (report.visible_text): what a template outputs and the
    data its scripts draw, whatever the template's markup."""
    from markupsafe import Markup

    from pytest_gputrain.report.visible_text import page_environment

    template = page_environment("pytest_gputrain.report").from_string(
        '<p title="{{ text }}">{{ text }}{{ items|join(",") }}</p>{{ svg }}'
        '<script type="application/json">{{ data|tojson }}</script>')
    text = template.render(text=f"a{INVISIBLE}<b>", items=["\u202ex", "y"],
                           svg=Markup("<svg></svg>"),
                           data={"\u2066key": ["\u202e", {"m": "\x1b[2J</script>"}]})
    for character in UNSEEN + INVISIBLE:
        assert character not in text
    assert '<p title="a\\u202e\\u2066' in text and "&lt;b&gt;" in text
    assert "\\u202ex,y" in text and "<svg></svg>" in text  # our own markup as it is
    assert '{"\\\\u2066key": ["\\\\u202e", {"m": "\\\\x1b[2J\\u003c/script\\u003e"}]}' in text


def test_the_markdown_report_escapes_html_from_a_test_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A GitHub step summary renders Markdown as HTML: a test id ``<img src=x
    onerror=alert(1)>`` went through raw."""
    hostile = "tests/test_x.py::test_a[<img src=x onerror=alert(1)>&#x202e;]"
    path = failure_facts(tmp_path, hostile, "<script>alert(2)</script>")
    code, out, err = replay(capsys, str(path), "--format", "md")
    assert code in (0, 1), err
    assert "<img" not in out and "<script" not in out and "&#x202e;" not in out
    assert "&lt;img src=x onerror=alert(1)&gt;&amp;#x202e;" in out


def test_the_gate_summary_escapes_html_from_a_test_id(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from pytest_gputrain.regression.store import ResultRecord
    from pytest_gputrain.regression.store_backends import open_store

    hostile = "t.py::test[<img src=x onerror=alert(1)>]"
    store = tmp_path / "b.sqlite"
    with open_store(store) as opened:
        for name, value in (("base", 0.010), ("head", 0.020)):
            rounds = [value * (1 + 0.001 * k) for k in range(20)]
            opened.save_run(name, {"device_type": "cpu"}, "h", None, [ResultRecord(
                hostile, {"device_type": "cpu"}, "h", 20,
                {"step_time": rounds, "throttled": [False] * 20}, {})])
    assert main(["compare", "base", "head", "--store", str(store), "--format", "md",
                 "--force"]) in (0, 1)
    out = capsys.readouterr().out
    assert "t.py::test[" in out and "<img" not in out and "&lt;img" in out


# -- a file that is not facts-shaped is refused before it is parsed (issue 29) ----------------

@pytest.mark.parametrize("make, said", [
    (lambda n: "[" + ",".join(["[]"] * n) + "]", "its top level is not an object"),
    (lambda n: '\ufeff \n {"kind": "pytest-gputrain-facts", "runs": ['
     + ",".join(["[]"] * n) + "]}", "more than one per 32 bytes"),
    (lambda n: '{"kind": "something-else", "data": "' + "x" * (3 * n) + '"}',
     '"kind": "pytest-gputrain-facts" in it'),
])
def test_a_file_not_shaped_as_facts_is_refused_in_bounded_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], make: Any, said: str
) -> None:
    """A 200 MB file of nested arrays took 43 s and 4.6 GB before it was refused: parsed, such
    a file takes twenty times its size. Refused before the parse, it takes the bytes read."""
    import tracemalloc

    path = tmp_path / "facts.json"
    path.write_text(make(2_000_000), encoding="utf-8")
    size = path.stat().st_size
    tracemalloc.start()
    try:
        code, _, err = replay(capsys, str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert code == 2
    assert f"{path}: not a pytest-gputrain facts file (written by --gpu-facts-out): " in err
    assert said in err, err
    assert peak < 3 * size + 8 * 2**20, f"{peak / size:.1f} times the file's size"
