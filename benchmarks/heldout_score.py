"""Score the diagnosis on the held-out samples (sample_projects/heldout/) from their facts files.

    python benchmarks/heldout_score.py FACTS_DIR [--expected EXPECTED.toml]
                                       [--rules-dir DIR ...] [--format text|md|json]

FACTS_DIR holds one facts file per sample, ``<sample>.json``, as the GPU runner keeps them
(``GPUTRAIN_SAMPLE_SET=heldout GPUTRAIN_SAMPLE_FACTS=FACTS_DIR python -m pytest
tests/gpu/test_sample_pipelines_gpu.py``). Each file is judged again by the rules of this
checkout (plus any ``--rules-dir``), as ``python -m pytest_gputrain replay`` judges it, so a
score recorded on the GPU can be recomputed on any machine and with any version of the rules:
check out another commit and run this script on the same files.

For each sample of the EXPECTED table it prints the codes found at warning or error level in
run or failure scope, and:

- for a faulty sample (one with ``cause``): NAMED when the message or the fix of one of those
  findings matches the sample's ``names`` (a case-insensitive regular expression), with the code
  that named it; MISSED otherwise, a finding that names a symptom included;
- for a healthy sample: quiet when there is no such finding, LOUD otherwise;
- "not run" when FACTS_DIR has no file for it (a sample skipped for a missing framework, say).

and last the totals: "named N of M faults; K of H healthy quiet" (samples not run counted
apart). The exit status is 0 once the files are scored, whatever the score; 2 for a bad
argument, a missing folder or an unreadable EXPECTED table or facts file.
"""

from __future__ import annotations

import argparse
import itertools
import json
import re
import shlex
import sys
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
HELDOUT = ROOT / "sample_projects" / "heldout"
PIPELINE_SCOPES = frozenset({"run", "failure"})
LOUD = frozenset({"warning", "error"})


class ScoreError(Exception):
    """A bad input: the EXPECTED table, a facts file, a rules folder."""


@dataclass(frozen=True)
class Verdict:
    """How the diagnosis of one sample compares with its EXPECTED table."""

    sample: str
    faulty: bool
    ran: bool
    loud: list[str]  # warning/error codes in run or failure scope
    info: list[str]  # info codes in run or failure scope
    named_by: list[str]  # codes whose message or fix matches ``names`` (faulty samples)

    @property
    def named(self) -> bool:
        return self.faulty and bool(self.named_by)

    @property
    def quiet(self) -> bool:
        return not self.faulty and not self.loud

    @property
    def outcome(self) -> str:
        if not self.ran:
            return "not run"
        if self.faulty:
            return "NAMED" if self.named else "MISSED"
        return "quiet" if self.quiet else "LOUD"


def load_expected(path: Path) -> dict[str, dict[str, Any]]:
    """The EXPECTED table, checked: every faulty sample has a ``cause`` and a ``names`` that
    compiles; every healthy one expects nothing."""
    try:
        table: dict[str, dict[str, Any]] = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise ScoreError(f"{path}: cannot read the EXPECTED table: {exc}") from None
    for name, spec in table.items():
        if not isinstance(spec, dict):
            raise ScoreError(f"{path}: [{name}] must be a table")
        if ("cause" in spec) != ("names" in spec):
            raise ScoreError(f"{path}: [{name}] needs both cause and names, or neither "
                             "(a healthy sample)")
        if "names" in spec:
            names_pattern(name, spec)
        elif spec.get("expect", []) != []:
            raise ScoreError(f"{path}: [{name}] is healthy (no cause): expect must be []")
    return table


def names_pattern(name: str, spec: Mapping[str, Any]) -> re.Pattern[str]:
    text = spec["names"]
    if not isinstance(text, str) or not text:
        raise ScoreError(f"[{name}] names must be a regular expression, got {text!r}")
    try:
        return re.compile(text, re.IGNORECASE)
    except re.error as exc:
        raise ScoreError(f"[{name}] names {text!r} is not a regular expression: {exc}") from None


def judge(sample: str, spec: Mapping[str, Any], findings: Iterable[Mapping[str, Any]] | None
          ) -> Verdict:
    """The verdict on one sample from its findings (mappings with code, severity, scope,
    message and fix, as the JSON report and ``Finding.model_dump()`` give them); ``None``: the
    sample did not run."""
    faulty = "cause" in spec
    if findings is None:
        return Verdict(sample, faulty, ran=False, loud=[], info=[], named_by=[])
    pipeline = [f for f in findings if f["scope"] in PIPELINE_SCOPES]
    loud = [f for f in pipeline if f["severity"] in LOUD]
    named_by: list[str] = []
    if faulty:
        pattern = names_pattern(sample, spec)
        named_by = sorted({f["code"] for f in loud if pattern.search(f.get("message", ""))
                           or pattern.search(f.get("fix", ""))})
    return Verdict(sample, faulty, ran=True, loud=sorted({f["code"] for f in loud}),
                   info=sorted({f["code"] for f in pipeline if f["severity"] == "info"}),
                   named_by=named_by)


def _rule_params(args: list[str]) -> list[str]:
    """The ``gpu_rule_param`` values a sample's ``args`` set (``-o gpu_rule_param=A.b=1``), as
    tests/test_h200_sample_facts.py reads them for the recorded pipelines."""
    params: list[str] = []
    for flag, value in itertools.pairwise(args):
        key, _, text = value.partition("=")
        if flag == "-o" and key in ("gpu_rule_param", "gpu_rule_params"):
            params.extend(shlex.split(text))
    return params


def replay_findings(facts_path: Path, params: list[str], rules_dirs: list[str]
                    ) -> list[dict[str, Any]]:
    """The findings today's rules give on a facts file, as ``pytest_gputrain replay`` computes
    them (the environment's, then the records')."""
    from pydantic import ValidationError

    from pytest_gputrain.cli import CliError, load_facts
    from pytest_gputrain.engine.evaluate import RuleEngine
    from pytest_gputrain.engine.rule_settings import SettingError, build_config
    from pytest_gputrain.engine.rules import RuleFileError

    try:
        engine = RuleEngine.load(build_config(params=params, rules_dirs=rules_dirs))
    except (RuleFileError, SettingError) as exc:
        raise ScoreError(str(exc)) from None
    try:
        facts = load_facts(facts_path)
        findings = engine.evaluate_records(facts, engine.evaluate_environment(facts.environment))
    except CliError as exc:
        raise ScoreError(str(exc)) from None
    except ValidationError as exc:
        raise ScoreError(f"{facts_path}: invalid run or failure facts: "
                         f"{exc.errors()[0]['msg']}") from None
    return [finding.model_dump() for finding in findings]


def score(facts_dir: Path, expected: Mapping[str, Mapping[str, Any]],
          rules_dirs: list[str] | None = None) -> list[Verdict]:
    """One verdict per sample of ``expected``, in its order."""
    from pytest_gputrain.plugin import load_features

    load_features()
    verdicts = []
    for sample, spec in expected.items():
        path = facts_dir / f"{sample}.json"
        findings = (replay_findings(path, _rule_params(list(spec.get("args", []))),
                                    list(rules_dirs or []))
                    if path.is_file() else None)
        verdicts.append(judge(sample, spec, findings))
    return verdicts


def totals(verdicts: list[Verdict]) -> str:
    faults = [v for v in verdicts if v.faulty and v.ran]
    healthy = [v for v in verdicts if not v.faulty and v.ran]
    line = (f"named {sum(v.named for v in faults)} of {len(faults)} faults; "
            f"{sum(v.quiet for v in healthy)} of {len(healthy)} healthy quiet")
    not_run = [v.sample for v in verdicts if not v.ran]
    if not_run:
        line += f" (not run: {', '.join(not_run)})"
    return line


def render(verdicts: list[Verdict], expected: Mapping[str, Mapping[str, Any]], fmt: str) -> str:
    if fmt == "json":
        return json.dumps({"samples": [{**asdict(v), "outcome": v.outcome} for v in verdicts],
                           "totals": totals(verdicts)}, indent=2) + "\n"
    rows = [(v.sample, "fault" if v.faulty else "healthy", ", ".join(v.loud) or "-",
             ", ".join(v.info) or "-", v.outcome + (f" ({', '.join(v.named_by)})"
                                                   if v.named_by else ""),
             str(expected[v.sample].get("cause", "-")))
            for v in verdicts]
    header = ("sample", "kind", "warning/error", "info", "verdict",
              "what a correct diagnosis names")
    if fmt == "md":
        lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
                  for row in rows]
        return "\n".join([*lines, "", f"**{totals(verdicts)}**"]) + "\n"
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
             + "  " + row[-1] for row in [header, *rows]]
    return "\n".join([*lines, "", totals(verdicts)]) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="heldout_score.py", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("facts_dir", type=Path, metavar="FACTS_DIR",
                        help="folder of <sample>.json facts files (GPUTRAIN_SAMPLE_FACTS)")
    parser.add_argument("--expected", type=Path, default=HELDOUT / "EXPECTED.toml",
                        help="the samples' table (default: sample_projects/heldout/EXPECTED.toml)")
    parser.add_argument("--rules-dir", action="append", default=[], metavar="DIR",
                        help="another folder of GT*.toml rules, beside the built-in ones")
    parser.add_argument("--format", choices=("text", "md", "json"), default="text")
    args = parser.parse_args(argv)
    # This checkout's package and rules, whatever version may be installed beside it.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    try:
        if not args.facts_dir.is_dir():
            raise ScoreError(f"{args.facts_dir}: no such folder of facts files")
        expected = load_expected(args.expected)
        verdicts = score(args.facts_dir, expected, args.rules_dir)
    except ScoreError as exc:
        print(f"heldout_score: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(render(verdicts, expected, args.format))
    return 0


if __name__ == "__main__":
    sys.exit(main())
