"""``python -m pytest_gputrain``: replay recorded facts, list and explain the rules.

    python -m pytest_gputrain replay facts.json [--format text|json|md] [--fail-on error]
                                                [--report html:report.html]
    python -m pytest_gputrain rules [--scope device]
    python -m pytest_gputrain explain GT007
    python -m pytest_gputrain facts [--scope session]
    python -m pytest_gputrain schema
    python -m pytest_gputrain history [--test NODEID]
    python -m pytest_gputrain compare main pr-123 [--format text|md|json]
    python -m pytest_gputrain --version          (also: pytest-gputrain --version)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path

from pydantic import ValidationError
from tabulate import tabulate

from pytest_gputrain import scopes
from pytest_gputrain.diagnosis_settings import (
    FAIL_ON,
    ReportTarget,
    parse_fail_on,
    parse_report_target,
)
from pytest_gputrain.engine.evaluate import RuleEngine
from pytest_gputrain.engine.rule_settings import SettingError, build_config
from pytest_gputrain.engine.rules import RuleFileError
from pytest_gputrain.facts import FactsFile
from pytest_gputrain.findings import Finding
from pytest_gputrain.ini_settings import (
    ProjectSettings,
    ProjectSettingsError,
    read_project_settings,
)
from pytest_gputrain.options import not_empty
from pytest_gputrain.plugin import load_features
from pytest_gputrain.units import printable


class CliError(Exception):
    pass


FACTS_FILE = "a pytest-gputrain facts file (written by --gpu-facts-out)"


def _project(args: argparse.Namespace) -> ProjectSettings:
    """The project's ini settings (``gpu_*``), read once per command."""
    if getattr(args, "project", None) is None:
        try:
            args.project = read_project_settings(args.rootdir, args.config_file)
        except ProjectSettingsError as exc:
            raise CliError(str(exc)) from None
        for deprecation in args.project.deprecations:
            print(f"warning: {deprecation}", file=sys.stderr)
    project: ProjectSettings = args.project
    return project


def _engine(args: argparse.Namespace, every_rule: bool = False) -> RuleEngine:
    """The rules as ``pytest --gpu-diagnose`` in this project would load them: the project's
    ini settings, each overridden by its command-line twin when given. ``every_rule``: leave
    gpu_select and gpu_ignore aside (``explain`` documents a rule the project does not run)."""
    ini = _project(args).values
    try:
        if args.rules_dir:  # folders given here are relative to here; the ini's to its folder
            rules_dirs, base = args.rules_dir, None
        else:
            rules_dirs, base = ini["gpu_rules_dir"], _project(args).ini_folder
        select, ignore = (None, None) if every_rule else (args.select or ini["gpu_select"],
                                                          args.ignore or ini["gpu_ignore"])
        config = build_config(select=select, ignore=ignore,
                              severity=args.severity or ini["gpu_severity"],
                              params=args.rule_param or ini["gpu_rule_param"],
                              rules_dirs=rules_dirs, base_dir=base)
        return RuleEngine.load(config)
    except RuleFileError as exc:
        raise CliError(str(exc)) from None
    except SettingError as exc:
        raise CliError(f"{_given_as(args, exc.setting)}: {exc.problem}") from None


def _given_as(args: argparse.Namespace, setting: str) -> str:
    """A rule setting as the user gave it: this command's option (``--select``), else its
    ini name in the project's file."""
    if " " in setting:  # two settings together: "gpu_select / gpu_ignore"
        return setting
    flag = "--" + setting.removeprefix("gpu_").replace("_", "-")
    if getattr(args, flag[2:].replace("-", "_"), None):
        return flag
    ini_file = _project(args).ini_file
    return f"{setting} in {ini_file.name}" if ini_file else setting


def _fail_on(args: argparse.Namespace) -> str:
    if args.fail_on is not None:
        return str(args.fail_on)
    try:
        return parse_fail_on(_project(args).values["gpu_fail_on"])
    except ValueError as exc:
        raise CliError(f"gpu_fail_on: {exc}") from None


def load_facts(path: Path) -> FactsFile:
    from pytest_gputrain.jsonfile import JsonFileError, Shape, read_json

    try:
        data = read_json(path, Shape(FACTS_FILE, "kind", "pytest-gputrain-facts"))
    except JsonFileError as exc:
        raise CliError(str(exc)) from None
    if not isinstance(data, dict) or data.get("kind") != "pytest-gputrain-facts":
        raise CliError(f"{path}: not {FACTS_FILE}")
    if data.get("schema_version") != 1:
        raise CliError(f"{path}: facts schema version {data.get('schema_version')!r} is not "
                       "supported by this version (expected 1)")
    try:
        # Strictly: a hand-edited file's true where a number belongs is an error, not 1.
        return FactsFile.model_validate(data, strict=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CliError(f"{path}: invalid facts at {where}: {first['msg']} "
                       f"({exc.error_count()} problem(s))") from None


def cmd_replay(args: argparse.Namespace) -> int:
    from pytest_gputrain.report.markdown import report_markdown
    from pytest_gputrain.report.model import build_report, fails, report_json
    from pytest_gputrain.report.terminal import findings_lines, header_lines

    targets = _report_targets(args.report or [])  # checked before the facts are read
    facts = load_facts(Path(args.path))
    engine = _engine(args)
    fail_on = _fail_on(args)
    findings = engine.evaluate_environment(facts.environment)
    try:
        findings = engine.evaluate_records(facts, findings)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise CliError(f"{args.path}: invalid run or failure facts at {where}: {first['msg']} "
                       f"({exc.error_count()} problem(s))") from None
    _write_reports(targets, facts, findings, fail_on)
    # The records are judged: let them go before the report is built (most of the memory a
    # replay takes is the file's records, parsed).
    environment = facts.environment
    del facts
    if args.format == "json":
        sys.stdout.write(report_json(build_report(environment, findings, fail_on)))
    elif args.format == "md":
        sys.stdout.write(report_markdown(build_report(environment, findings, fail_on)))
    else:
        width = _width()
        sys.stdout.write("\n".join([*header_lines(environment, width), "",
                                    *findings_lines(findings, width, verbose=args.verbose)])
                         + "\n")
    return 1 if fails(findings, fail_on) else 0


def _report_targets(texts: list[str]) -> list[ReportTarget]:
    """``--report FORMAT:PATH`` values, each path checked as ``--gpu-report``'s are
    (``outputs.Claims``: a file that can be created or replaced, a device or a pipe; never
    under /proc or /sys, never one file twice)."""
    from pytest_gputrain.outputs import Claims, OutputPathError

    targets = []
    for text in texts:
        try:
            targets.append(parse_report_target(text, Path.cwd(), os.environ))
        except ValueError as exc:
            raise CliError(f"--report: {exc}") from None
    try:
        Claims().claim("--report", [target.path for target in targets])
    except OutputPathError as exc:
        raise CliError(str(exc)) from None
    return targets


def _write_reports(targets: list[ReportTarget], facts: FactsFile, findings: list[Finding],
                   fail_on: str) -> None:
    """The ``--report`` files, written as ``--gpu-report`` writes them (the HTML page too),
    each said on stderr (stdout holds the replay's own report)."""
    from pytest_gputrain.outputs import append_text, write_output
    from pytest_gputrain.report.markdown import report_markdown
    from pytest_gputrain.report.model import build_report, report_json

    for target in targets:
        report = build_report(facts.environment, findings, fail_on)
        if target.format == "html":
            from pytest_gputrain.report.html import report_html

            content = report_html(report, facts)
        else:
            content = report_json(report) if target.format == "json" else report_markdown(report)
        try:
            (append_text if target.append else write_output)(target.path, content)
        except OSError as exc:
            raise CliError(f"--report: could not write {target.path}: "
                           f"{exc.strerror or exc}") from None
        print(f"gputrain: report written to {target.path}", file=sys.stderr)


def cmd_rules(args: argparse.Namespace) -> int:
    from pytest_gputrain.report.rule_docs import catalogue_lines

    engine = _engine(args)
    rules = [rule for rule in engine.rules if args.scope in (None, rule.scope)]
    print(printable("\n".join(catalogue_lines(rules, _width()))))
    return 0


def cmd_explain(args: argparse.Namespace) -> int:
    from pytest_gputrain.probe.frameworks import case_label
    from pytest_gputrain.report.rule_docs import rule_doc_lines

    engine = _engine(args, every_rule=True)
    code = args.code.upper()
    rule = next((r for r in engine.rules if r.code == code or r.name == args.code), None)
    if rule is None:
        raise CliError(f"no rule {args.code!r}; `python -m pytest_gputrain rules` lists them")
    lines = rule_doc_lines(rule, _width(), case_label, Path.cwd())
    print(printable("\n".join(lines)))  # a project's rule file may hold anything
    return 0


def _width() -> int:
    return max(40, shutil.get_terminal_size().columns)  # as pytest: COLUMNS, or 80


def cmd_facts(args: argparse.Namespace) -> int:
    from pytest_gputrain.engine.vocabulary import scope_names
    from pytest_gputrain.facts import DeviceFacts, EnvironmentFacts, device_namespace

    if args.scope in ("session", "device"):  # the core's scopes, listed with their units
        names = device_namespace(EnvironmentFacts(), DeviceFacts())
        rows = [(name, unit or "") for name, (_, unit, _) in sorted(names.items())
                if name in scope_names(args.scope)]
    else:
        rows = [(name, "") for name in sorted(scope_names(args.scope))]
    print(tabulate(rows, headers=("fact", "unit")))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    from pytest_gputrain.report.model import report_schema

    print(json.dumps(report_schema(), indent=2))
    return 0


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """``prog``: the command as its usage lines show it; by default the name it was started as
    (argparse's default: ``pytest-gputrain`` for the console script)."""
    from pytest_gputrain import __version__

    load_features()  # their rule scopes, which rules and facts files may name
    parser = argparse.ArgumentParser(prog=prog, description="pytest-gputrain rule engine tools")
    parser.add_argument("--version", action="version", version=f"pytest-gputrain {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def rule_options(p: argparse.ArgumentParser, selection: bool = True) -> None:
        # An empty value is a usage error, as for pytest's --gpu-* options.
        if selection:
            p.add_argument("--select", action="append", type=not_empty, help="rule codes or "
                           "prefixes to run (instead of the ini file's gpu_select)")
            p.add_argument("--ignore", action="append", type=not_empty, help="rule codes or "
                           "prefixes to skip (instead of gpu_ignore)")
        p.add_argument("--severity", action="append", type=not_empty, metavar="CODE=LEVEL",
                       help="instead of gpu_severity")
        p.add_argument("--rule-param", action="append", type=not_empty,
                       metavar="CODE.PARAM=VALUE", help="instead of gpu_rule_param")
        p.add_argument("--rules-dir", action="append", type=not_empty, metavar="DIR",
                       help="extra rule folder (instead of gpu_rules_dir)")
        p.add_argument("--rootdir", metavar="DIR", type=not_empty,
                       help="the project's rootdir, as pytest's --rootdir (default: found from "
                            "the current directory, as pytest does)")
        p.add_argument("-c", "--config-file", metavar="FILE", type=not_empty,
                       help="the project's ini file, as pytest's -c (default: found as pytest "
                            "finds it)")

    replay = sub.add_parser(
        "replay", help="run the rules on facts recorded by --gpu-facts-out",
        description="Run the rules on a facts file written by `pytest --gpu-diagnose "
                    "--gpu-facts-out=FILE`, on any machine: the findings are those the recording "
                    "machine would get. Exits 1 when a finding reaches --fail-on.")
    replay.add_argument("path", metavar="FACTS_FILE", type=not_empty,
                        help="the JSON file written by --gpu-facts-out")
    replay.add_argument("--format", choices=("text", "json", "md"), default="text",
                        help="text: the terminal report (default); json: the --gpu-report "
                             "document (see the schema command); md: Markdown for a CI summary")
    replay.add_argument("--fail-on", choices=FAIL_ON, default=None,
                        help="default: the ini file's gpu_fail_on, else error")
    replay.add_argument("-v", "--verbose", action="store_true", help="show why and evidence")
    replay.add_argument("--report", action="append", metavar="FORMAT:PATH", type=not_empty,
                        help="also write a report file, as pytest's --gpu-report: html:PATH "
                             "(the page with each test's timeline), json:PATH or md:PATH, or a "
                             "path ending in .html, .json or .md; repeatable")
    rule_options(replay)
    replay.set_defaults(func=cmd_replay)

    rules = sub.add_parser(
        "rules", help="list the rule catalogue",
        description="List the rules (code, name, scope, severity, title) as `pytest "
                    "--gpu-diagnose` in this project loads them: the built-in ones and those of "
                    "gpu_rules_dir, less those gpu_select and gpu_ignore leave out.")
    rules.add_argument("--scope", choices=scopes.names(), help="only the rules of this scope")
    rule_options(rules)
    rules.set_defaults(func=cmd_rules)

    explain = sub.add_parser(
        "explain", help="print one rule's documentation",
        description="Print one rule's documentation: what it checks, why it matters, an example "
                    "and what to write instead, the fix, its options and references. Any rule, "
                    "whatever gpu_select and gpu_ignore choose; its severity and options are this "
                    "project's (gpu_severity, gpu_rule_param).")
    explain.add_argument("code", metavar="CODE", type=not_empty,
                         help="a rule's code (GT007) or name (other-processes-hold-vram)")
    rule_options(explain, selection=False)
    explain.set_defaults(func=cmd_explain)

    facts = sub.add_parser(
        "facts", help="list the fact names rules can use",
        description="List the facts a rule's condition, message and fix can name in one scope "
                    "(with their units in the session and device scopes).")
    facts.add_argument("--scope", choices=scopes.names(), default="device",
                       help="the scope whose facts to list (default: device)")
    facts.set_defaults(func=cmd_facts)

    schema = sub.add_parser(
        "schema", help="print the JSON schema of --gpu-report .json files",
        description="Print the JSON schema of the report that `pytest --gpu-diagnose "
                    "--gpu-report=FILE.json` writes (and `replay --format json` prints).")
    schema.set_defaults(func=cmd_schema)

    from pytest_gputrain.regression.compare_command import add_compare_parser
    from pytest_gputrain.regression.history import add_history_parser

    add_history_parser(sub)
    add_compare_parser(sub)
    return parser


def _stdout_closed() -> int:
    """The reader of our output went away (``… | head``): stop quietly, as Python's docs on
    SIGPIPE advise. stdout is pointed at /dev/null so that the flush at interpreter exit
    does not raise the same error again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # stdout is not a file (captured, or already closed)
        pass
    return 1


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    try:
        parser = build_parser(prog)
        args = parser.parse_args(argv)
        code = int(args.func(args))
        sys.stdout.flush()  # output still buffered fails here, while it can be handled
        return code
    except CliError as exc:
        print(f"pytest_gputrain: error: {printable(str(exc))}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _stdout_closed()
