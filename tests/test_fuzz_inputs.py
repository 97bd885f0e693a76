"""Generated inputs, as a careless user or an attacker would give them: option values, rule-file
thresholds, facts-file fields and output paths of every kind.

Each test asserts that no input crashes (only the documented error of its kind, never a
traceback or an INTERNALERROR), none hangs (every example runs under an alarm), and no file the
project does not own is replaced (a device, a FIFO, a socket, a directory keeps its kind). The
examples are derandomized and no database is kept, so every run tries the same inputs; the
module takes well under a minute on one core.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import signal
import socket
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from endless_input import endless_json
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pytest_gputrain import cli, diagnosis_settings, options, outputs
from pytest_gputrain.assertions.markers import MarkerError, parse_default_max_vram
from pytest_gputrain.assertions.options import OPTIONS as ASSERTION_OPTIONS
from pytest_gputrain.assertions.worker_gpus import parse_per_worker
from pytest_gputrain.cli import main as cli_main
from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.engine.rule_settings import SettingError, build_config, coerce_param
from pytest_gputrain.engine.rules import RuleFileError, builtin_rules_dir, load_rule_file
from pytest_gputrain.facts import FactsFile
from pytest_gputrain.jsonfile import INPUT_LIMIT_VARIABLE
from pytest_gputrain.probe.options import OPTIONS as PROBE_OPTIONS
from pytest_gputrain.probe.probe_settings import parse_profile_steps
from pytest_gputrain.regression import settings as regression_settings
from pytest_gputrain.regression.options import OPTIONS as REGRESSION_OPTIONS
from pytest_gputrain.units import parse_percent, parse_size

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

FUZZ = settings(derandomize=True, database=None, deadline=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
FACTS = Path(__file__).parent / "facts"
EXAMPLE_LIMIT_S = 20  # one example past this has hung


class Hung(Exception):
    pass


@contextlib.contextmanager
def bounded(seconds: float = EXAMPLE_LIMIT_S) -> Iterator[None]:
    """Fail (rather than wait forever) when the block runs past ``seconds``."""
    def expire(signum: int, frame: FrameType | None) -> None:
        raise Hung(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


# -- values: what a user types ---------------------------------------------------------------

CONTROL = st.sampled_from(["\x00", "\x1b[2J", "\r", "\x7f", "\x85", "\u202e", "\u2066", "\u200f",
                           "\u2028", "\ud800"])
NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.integers(min_value=300, max_value=5000).map(lambda n: "9" * n),  # 300 to 5000 digits
    st.sampled_from(["nan", "inf", "-inf", "NaN", "1e400", "-0", "0x10", "1_000", "٣", "0.5%",
                     "1e-400", "6GiB", "6 GB", "-1GiB", "2000000 TiB", "3-6", "2-1", "off"]),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
VALUES = st.one_of(
    st.just(""), st.text(" \t", max_size=3), NUMBERS,
    st.builds(lambda a, c, b: a + c + b, st.text(max_size=8), CONTROL, st.text(max_size=8)),
    st.text(max_size=40),
)

# Options whose value is a path written to are fuzzed as paths below, not as free text here (a
# generated "../x" would write outside the test's folder).
PATH_OPTIONS = {"--gpu-report", "--gpu-facts-out", "--gpu-benchmark-json", "--gpu-store"}
VALUED = [option.flag for option in (options.OPTIONS + PROBE_OPTIONS + ASSERTION_OPTIONS
                                     + REGRESSION_OPTIONS)
          if option.kind != "bool" and option.flag not in PATH_OPTIONS]

RULE = next(rule for rule in (load_rule_file(path) for path in
                              sorted(builtin_rules_dir().glob("*.toml"))) if rule.params)

PARSERS: list[tuple[str, Callable[[str], Any], tuple[type[BaseException], ...]]] = [
    ("parse_fail_on", diagnosis_settings.parse_fail_on, (ValueError,)),
    ("parse_report_target",
     lambda v: diagnosis_settings.parse_report_target(v, Path("/nonexistent-base"), {}),
     (ValueError,)),
    ("not_empty", options.not_empty, (argparse.ArgumentTypeError,)),
    ("build_config", lambda v: build_config(select=v, ignore=v, severity=v, params=v,
                                            rules_dirs=v), (SettingError,)),
    ("coerce_param", lambda v: coerce_param(RULE, next(iter(RULE.params)), v), (SettingError,)),
    ("parse_thresholds", regression_settings.parse_thresholds, (ValueError,)),
    ("parse_alpha", regression_settings.parse_alpha, (ValueError,)),
    ("parse_step_summary", regression_settings.parse_step_summary, (ValueError,)),
    ("parse_cannot_tell", regression_settings.parse_cannot_tell, (ValueError,)),
    ("parse_run_name", lambda v: regression_settings.parse_run_name(v, for_save=True),
     (ValueError,)),
    ("parse_profile_steps", parse_profile_steps, (ValueError,)),
    ("parse_default_max_vram", parse_default_max_vram, (MarkerError,)),
    ("parse_per_worker", parse_per_worker, (ValueError,)),
    ("parse_size", parse_size, (ValueError,)),
    ("parse_percent", parse_percent, (ValueError,)),
]


@settings(FUZZ, max_examples=400)
@given(parser=st.sampled_from(PARSERS), value=VALUES)
def test_option_parsers_answer_a_value_or_their_error(
    parser: tuple[str, Callable[[str], Any], tuple[type[BaseException], ...]], value: str
) -> None:
    name, parse, errors = parser
    with bounded(5):
        try:
            parse(value)
        except errors as exc:
            assert str(exc), f"{name}({value!r}): an error without a message"


@settings(FUZZ, max_examples=60)
@given(flag=st.sampled_from(VALUED), value=VALUES)
def test_option_values_on_the_command_line_never_crash_pytest(
    pytester: pytest.Pytester, flag: str, value: str
) -> None:
    pytester.makepyfile(test_fuzz="def test_ok(): pass")
    with bounded():
        result = pytester.runpytest(f"{flag}={value}", "-p", "no:cacheprovider",
                                    "-p", "no:hypothesispytest", "-p", "no:xdist")
    text = result.stdout.str() + result.stderr.str()
    assert "INTERNALERROR" not in text and "Traceback" not in text, text
    assert result.ret in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED,
                          pytest.ExitCode.USAGE_ERROR), text
    if not value.strip():
        assert result.ret == pytest.ExitCode.USAGE_ERROR and flag in text


# -- rule-file thresholds --------------------------------------------------------------------

TOML_VALUES = st.one_of(
    st.sampled_from(["nan", "inf", "-inf", "+nan", "-nan", "9223372036854775807",
                     "-9223372036854775808", "1e308", "true", '"6GiB"', '""', "[1, 2]",
                     "{a = 1}", '"\\u202e"', '"\\u0000"']),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(str),
    st.text(max_size=20).map(json.dumps),  # a TOML basic string
)
RULE_FILE = """code = "GT901"
name = "fuzzed"
title = "t"
scope = "session"
severity = "warning"
condition = "host.cpu_count_logical < params.limit"
message = "{{host.cpu_count_logical}} below {{params.limit}}"
fix = "f"
why = "w"

[params]
limit = {value}
"""


@settings(FUZZ, max_examples=150)
@given(value=TOML_VALUES)
def test_rule_file_thresholds_load_or_are_refused_naming_the_file(value: str) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "GT901-fuzzed.toml"
        path.write_text(RULE_FILE.format(value=value), encoding="utf-8", errors="surrogatepass")
        with bounded(5):
            try:
                rule = load_rule_file(path)
            except RuleFileError as exc:
                assert str(path) in str(exc)
                return
            limit = rule.params["limit"]
            assert not (isinstance(limit, float) and limit != limit), "nan accepted"
            assert limit not in (float("inf"), float("-inf")), "inf accepted"
            # Judged, it fires, stays quiet or is reported as broken (a threshold of the wrong
            # type), never a crash of the engine.
            RuleEngine([rule]).evaluate_environment(LAPTOP)


# -- facts-file fields -----------------------------------------------------------------------

FIELDS = ["nvml.device_count", "torch.device_count", "devices.0.name", "devices.0.index",
          "devices.0.memory_total", "devices.0.temperature", "devices.0.processes",
          "devices.0.pcie_gen", "host.cpu_count_logical", "host.memory_total",
          "env.variables", "env.cuda_visible_devices", "torch.version", "tools.nvcc_path",
          "nvml.driver_version", "collected_at"]
JSON_VALUES = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
              st.floats(allow_nan=False, allow_infinity=False),
              st.text(max_size=30), st.builds(lambda c: f"GPU{c}H200", CONTROL)),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=5),
                                                                       children, max_size=3),
    max_leaves=6)


ENGINE = RuleEngine.load()  # the shipped rules, loaded once (each replay would load them anew)
LAPTOP = FactsFile.model_validate(json.loads((FACTS / "cpu_laptop.json").read_text())).environment


def run_cli(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), \
            mock.patch.object(cli, "_engine", lambda _: ENGINE):
        try:
            code = cli_main(args)
        except SystemExit as exc:  # argparse's own usage errors
            code = int(exc.code or 0)
    return code, out.getvalue(), err.getvalue()


def patched(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    target = data["environment"]
    *parents, last = dotted.split(".")
    for part in parents:
        target = target[int(part)] if isinstance(target, list) else target[part]
    if isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = value
    return data


@settings(FUZZ, max_examples=150)
@given(field=st.sampled_from(FIELDS), value=JSON_VALUES, form=st.sampled_from(["text", "md",
                                                                                "json"]))
def test_facts_file_fields_replay_or_are_refused(field: str, value: Any, form: str) -> None:
    data = patched(json.loads((FACTS / "h200x2_recorded.json").read_text()), field, value)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "facts.json"
        path.write_text(json.dumps(data), encoding="utf-8", errors="surrogatepass")
        with bounded():
            code, out, err = run_cli(["replay", str(path), "--format", form])
    assert code in (0, 1, 2), err
    assert "Traceback" not in out + err
    if code == 2:
        assert str(path) in err
    if form != "json":  # the terminal and Markdown show no control or bidirectional character
        assert not any(ch in out for ch in "\x1b\x00\r\x7f\x85\u202e\u2066\u200f\u2028"), out
    if isinstance(value, int) and not isinstance(value, bool) and value < 0 and \
            field.endswith(("_count", "index", "pcie_gen", "memory_total")):
        assert code == 2, f"{field} = {value} was judged"


@settings(FUZZ, max_examples=5)
@given(limit=st.integers(min_value=1, max_value=2**16))
def test_unbounded_input_stops_at_the_limit(limit: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(INPUT_LIMIT_VARIABLE, str(limit))
    with tempfile.TemporaryDirectory() as folder, endless_json(Path(folder)) as endless, \
            bounded():
        code, _, err = run_cli(["replay", str(endless)])
    assert code == 2 and f"{endless}: larger than" in err
    with bounded():
        code, _, err = run_cli(["replay", "/dev/zero"])  # refused at its first block
    assert code == 2 and "/dev/zero: not a pytest-gputrain facts file" in err


# -- output paths of every kind --------------------------------------------------------------

KINDS = ("new", "new_in_new_folder", "regular", "directory", "null_device", "fifo", "socket",
         "link_to_regular", "dangling_link", "below_a_file")
WRITABLE = {"new", "new_in_new_folder", "regular", "link_to_regular", "dangling_link"}


def make_path(folder: Path, name: str, kind: str, keep: list[Any]) -> Path:
    path = folder / name
    if kind == "new_in_new_folder":
        return folder / f"{name}.d" / "deeper" / name
    if kind == "regular":
        path.write_text("theirs\n")
    elif kind == "directory":
        path.mkdir()
    elif kind == "null_device":
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod not permitted here")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(path))
        keep.append(server)
    elif kind == "link_to_regular":
        (folder / f"{name}.target").write_text("theirs\n")
        path.symlink_to(folder / f"{name}.target")
    elif kind == "dangling_link":
        path.symlink_to(folder / f"{name}.missing")
    elif kind == "below_a_file":
        path.write_text("a file, not a folder\n")
        return path / "inside.json"
    return path


def node_kind(path: Path) -> int | None:
    try:
        return stat.S_IFMT(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return None


@settings(FUZZ, max_examples=150)
@given(targets=st.lists(st.tuples(st.sampled_from(["report", "facts", "benchmark_json"]),
                                  st.sampled_from(KINDS), st.sampled_from(["a", "b"])),
                        min_size=1, max_size=3))
def test_outputs_replace_only_their_own_files(targets: list[tuple[str, str, str]]) -> None:
    keep: list[Any] = []
    with tempfile.TemporaryDirectory() as name:
        folder = Path(name)
        paths: dict[str, Path] = {}
        for _, kind, file in targets:
            if file not in paths:  # the same name twice is the same path twice
                paths[file] = make_path(folder, file, kind, keep)
        before = {file: node_kind(path) for file, path in paths.items()}
        config = SimpleNamespace(stash=pytest.Stash())
        claims: dict[str, list[Path]] = {}
        for option, _, file in targets:
            claims.setdefault(option, []).append(paths[file])
        try:
            for option, claimed in claims.items():
                outputs.claim(config, option, claimed)  # type: ignore[arg-type]
        except pytest.UsageError as exc:
            assert any(str(path) in str(exc) for path in paths.values()), exc
            claimed_ok = False
        else:
            claimed_ok = True
        for file, path in paths.items():
            with bounded(5):
                try:
                    outputs.write_output(path, '{"written": true}\n')
                    written = True
                except OSError:
                    written = False
            first_kind = next(kind for _, kind, f in targets if f == file)
            if first_kind in ("directory", "null_device", "fifo", "socket"):
                assert node_kind(path) == before[file], f"{first_kind} {path} was replaced"
            if written and first_kind in WRITABLE:
                assert path.read_text() == '{"written": true}\n'
                if first_kind == "link_to_regular":
                    assert path.is_symlink()
            if claimed_ok:
                assert first_kind not in ("directory", "socket"), f"{first_kind} was accepted"
        leftovers = [p.name for p in folder.rglob(".*") if p.name.startswith((".a.", ".b."))]
        assert leftovers == [], "temporary files left behind"
    for server in keep:
        server.close()


# -- store URLs: the one redaction (issue 29) --------------------------------------------------

# Every printable ASCII character, the reserved ones of a URL weighted up, and beyond ASCII.
URL_CHARACTERS = st.one_of(st.sampled_from(list("@:/?#[]%&=+,;$!*'() \\\"")),
                           st.characters(min_codepoint=0x21, max_codepoint=0x7E),
                           st.characters(blacklist_categories=("Cc", "Cs", "Co", "Cn")))
URL_PARTS = st.text(URL_CHARACTERS, max_size=12)
URL_FORMS = st.sampled_from([
    "postgresql://{user}:{password}@{host}/{db}",
    "postgres://{user}:{password}@{host}:5432/{db}?sslmode=require",
    "postgresql://{user}:{password}@/{db}?host=/run/{host}",
    "postgresql://{host}/{db}?user={user}&password={password}",
    "postgresql://{user}@{host}/{db}?sslpassword={password}&application_name={db}",
    "postgresql://{user}:{password}@[{host}/{db}",
])


@settings(FUZZ, max_examples=400)
@given(form=URL_FORMS, user=URL_PARTS, password=st.text(URL_CHARACTERS, min_size=3,
                                                         max_size=16),
       host=URL_PARTS, db=URL_PARTS)
def test_no_store_url_shows_a_password_libpq_reads_in_it(form: str, user: str, password: str,
                                                         host: str, db: str) -> None:
    """A URL written any way, raw reserved characters and all: what libpq reads as a secret
    is never shown, and neither is the password the URL was written with, unless the rest of
    the URL shows its text anyway; nothing of a URL libpq cannot read is shown."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict

    from pytest_gputrain.regression.store_location import describe, redact

    url = form.format(user=user, password=password, host=host, db=db)
    shown = describe(url)  # never raises
    scheme = url.split("://")[0]
    assert shown.startswith(f"{scheme}://")
    rest = describe(form.format(user=user, password="x", host=host, db=db))
    if password not in rest:
        assert password not in shown, (url, shown)
    try:
        parameters = conninfo_to_dict(url)
    except psycopg.ProgrammingError:
        assert shown == f"{scheme}://***"
        return
    for key in ("password", "sslpassword"):
        secret = parameters.get(key)
        if secret and secret not in rest.replace("***", ""):
            assert secret not in shown, (url, shown)
            assert secret not in redact(f"libpq said: {secret}", url)


# -- the history site: written into its own folder, never through a link (issue 29) -----------

SITE_NAMES = ("index.html", "tests", "tests/a.html", "tests/b.html")
SITE_KINDS = ("absent", "file", "folder", "link_to_file", "link_to_folder", "dangling_link")


@settings(FUZZ, max_examples=150)
@given(folder_kind=st.sampled_from(("absent", "folder", "link_to_folder", "file")),
       inside=st.dictionaries(st.sampled_from(SITE_NAMES), st.sampled_from(SITE_KINDS),
                              max_size=4))
def test_a_folder_of_pages_is_never_written_through_a_link(folder_kind: str,
                                                          inside: dict[str, str]) -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        outside = root / "outside"
        outside.mkdir()
        (outside / "victim.html").write_text("theirs\n")
        folder = root / "site"
        if folder_kind == "folder":
            folder.mkdir()
        elif folder_kind == "link_to_folder":
            folder.symlink_to(outside)
        elif folder_kind == "file":
            folder.write_text("a file\n")
        if folder_kind == "folder":
            for relative, kind in sorted(inside.items()):
                path = folder / relative
                if not path.parent.is_dir() or path.parent.is_symlink():
                    continue
                if kind == "file":
                    path.write_text("old\n")
                elif kind == "folder":
                    path.mkdir()
                elif kind == "link_to_file":
                    path.symlink_to(outside / "victim.html")
                elif kind == "link_to_folder":
                    path.symlink_to(outside)
                elif kind == "dangling_link":
                    path.symlink_to(outside / "nothing")
        before = sorted(p.name for p in outside.iterdir())
        pages = {"index.html": b"index", "tests/a.html": b"a"}
        with bounded(5):
            try:
                outputs.write_folder(folder, pages)
                written = True
            except (outputs.OutputPathError, OSError) as exc:
                assert str(root) in str(exc), exc
                written = False
        assert sorted(p.name for p in outside.iterdir()) == before, "written outside"
        assert (outside / "victim.html").read_text() == "theirs\n"
        if written:
            assert not folder.is_symlink()
            for relative, data in pages.items():
                page = folder / relative
                assert not page.is_symlink() and page.read_bytes() == data
        assert not [p for p in root.rglob(".*")], "temporary files left behind"


# -- facts files: their shape checked before the parse (issue 29) -----------------------------


@settings(FUZZ, max_examples=200)
@given(value=JSON_VALUES, kind=st.sampled_from(["", '"kind": "pytest-gputrain-facts", ']),
       wrap=st.booleans())
def test_any_json_is_read_or_refused_by_its_shape(value: Any, kind: str, wrap: bool) -> None:
    from pytest_gputrain.jsonfile import JsonFileError, Shape, read_json

    shape = Shape("a facts file", "kind", "pytest-gputrain-facts")
    text = ("{" + kind + '"value": ' + json.dumps(value) + "}") if wrap else json.dumps(value)
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "facts.json"
        path.write_text(text, encoding="utf-8", errors="surrogatepass")
        with bounded(5):
            try:
                data = read_json(path, shape)
            except JsonFileError as exc:
                assert str(path) in str(exc)
                return
    # Small, a file is parsed whatever it holds but its top level must be an object; large,
    # its kind must be named too (tests/test_untrusted_inputs.py: the large files).
    assert isinstance(data, dict), "a file whose top level is no object was parsed"


# -- the history and compare commands' options (issue 29) --------------------------------------

HISTORY_OPTIONS = ["--name", "--test", "--limit", "--min-change", "--metric", "--step-summary",
                   "--png", "--html"]
COMPARE_OPTIONS = ["--regression", "--alpha", "--lookback", "--cannot-tell", "--max-sessions",
                   "--step-summary"]


@pytest.fixture(scope="module")
def small_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from pytest_gputrain.regression.store import ResultRecord
    from pytest_gputrain.regression.store_backends import open_store

    path = tmp_path_factory.mktemp("store") / "b.sqlite"
    with open_store(path) as store:
        for name in ("base", "head"):
            rounds = [0.01 * (1 + 0.001 * k) for k in range(12)]
            store.save_run(name, {"device_type": "cpu"}, "h", None, [ResultRecord(
                "t.py::test_a", {"device_type": "cpu"}, "h", 12,
                {"step_time": rounds, "throttled": [False] * 12}, {})])
    # ruptures (--html) imported now, not under an example's alarm: an import cut short there
    # leaves scipy half imported for every later example.
    from pytest_gputrain.regression import change_points

    change_points.check_available()
    return path


@settings(FUZZ, max_examples=120)
@given(command=st.sampled_from(["history", "compare"]), data=st.data(), value=VALUES)
def test_history_and_compare_options_answer_or_refuse(small_store: Path, command: str,
                                                      data: st.DataObject, value: str) -> None:
    options_ = HISTORY_OPTIONS if command == "history" else COMPARE_OPTIONS
    option = data.draw(st.sampled_from(options_))
    args = ["compare", "base", "head"] if command == "compare" else ["history"]
    with tempfile.TemporaryDirectory() as folder:
        cwd = os.getcwd()
        os.chdir(folder)  # a generated --png or --html path lands in a folder of its own
        try:
            with bounded():
                code, out, err = run_cli([*args, "--store", str(small_store), option, value])
        finally:
            os.chdir(cwd)
    assert code in (0, 1, 2, 3), err  # 3: --max-sessions asks for more sessions
    assert "Traceback" not in out + err
    if not value.strip():
        assert code == 2 and option in err, err
