"""How a project tunes the rules: select/ignore codes, severities, params, extra rule folders.

Settings come from the command line or the ini file (pytest.ini / pyproject.toml / tox.ini):

    gpu_select = GT0            # code prefixes, as linters do ("GT" = all)
    gpu_ignore = GT014 GT013
    gpu_severity = GT008=error
    gpu_rule_param = GT016.min_shm=1GiB  GT007.min_memory=2GiB
    gpu_rules_dir = ci/gpu-rules
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_gputrain.engine.codes import CODE_RE
from pytest_gputrain.options import resolve_path
from pytest_gputrain.severity import SEVERITY_RANK
from pytest_gputrain.units import parse_percent, parse_size, shown

if TYPE_CHECKING:
    from pytest_gputrain.engine.rules import Rule


class SettingError(ValueError):
    """A rule setting from the command line or ini file is malformed: ``setting`` names it by
    its ini name (an entry point names it as the user gave it: ``options.given_as``),
    ``problem`` says what is wrong."""

    def __init__(self, setting: str, problem: str) -> None:
        super().__init__(f"{setting}: {problem}")
        self.setting = setting
        self.problem = problem


@dataclass
class RuleConfig:
    select: list[str] = field(default_factory=lambda: ["GT"])
    ignore: list[str] = field(default_factory=list)
    severity: dict[str, str] = field(default_factory=dict)
    params: dict[str, dict[str, str]] = field(default_factory=dict)
    extra_dirs: list[Path] = field(default_factory=list)

    def enabled(self, code: str) -> bool:
        chosen = max((len(p) for p in self.select if code.startswith(p)), default=-1)
        dropped = max((len(p) for p in self.ignore if code.startswith(p)), default=-1)
        # The more specific prefix wins, as in ruff: select GT0 + ignore GT007 keeps GT001.
        return chosen >= 0 and chosen > dropped


def split_words(values: list[str] | str | None) -> list[str]:
    """Ini values may be comma or whitespace separated, and repeated on the command line."""
    if values is None:
        return []
    if isinstance(values, str):
        values = [values]
    words: list[str] = []
    for value in values:
        words.extend(word for word in value.replace(",", " ").split() if word)
    return words


_PREFIX_RE = re.compile(r"^G(T[0-9]{0,3})?$")


def _check_prefix(setting: str, prefix: str) -> str:
    prefix = prefix.strip().upper()
    if prefix == "ALL":
        return ""
    if not _PREFIX_RE.match(prefix):
        raise SettingError(setting, f"{shown(prefix)} is not a rule code or code prefix (e.g. "
                           "GT007 or GT0)")
    return prefix


def build_config(
    select: list[str] | str | None = None,
    ignore: list[str] | str | None = None,
    severity: list[str] | str | None = None,
    params: list[str] | str | None = None,
    rules_dirs: list[str] | str | None = None,
    base_dir: Path | None = None,
) -> RuleConfig:
    config = RuleConfig()
    selected = split_words(select)
    if selected:
        config.select = [_check_prefix("gpu_select", p) for p in selected]
    config.ignore = [_check_prefix("gpu_ignore", p) for p in split_words(ignore)]
    for item in split_words(severity):
        code, sep, level = item.partition("=")
        code, level = code.strip().upper(), level.strip().lower()
        if not sep or not CODE_RE.match(code) or level not in SEVERITY_RANK:
            raise SettingError("gpu_severity", f"{item!r} must be CODE=LEVEL with LEVEL info, "
                               "warning or error (e.g. GT008=error)")
        config.severity[code] = level
    for item in split_words(params):
        target, sep, value = item.partition("=")
        code, dot, name = target.partition(".")
        code = code.strip().upper()
        if not sep or not dot or not CODE_RE.match(code) or not name.strip():
            raise SettingError("gpu_rule_param", f"{item!r} must be CODE.PARAM=VALUE (e.g. "
                               "GT016.min_shm=1GiB)")
        config.params.setdefault(code, {})[name.strip()] = value.strip()
    for folder in split_words(rules_dirs):
        try:  # relative to base_dir, else to the current directory
            config.extra_dirs.append(resolve_path(folder, base_dir or Path()))
        except ValueError as exc:
            raise SettingError("gpu_rules_dir", str(exc)) from None
    return config


_WHOLE_RE = re.compile(r"-?[0-9]+")
_MAX_PARAM_DIGITS = 18  # a threshold beyond 10**18 is a typo; and int() refuses 4300+ digits


def _whole_number(text: str) -> int:
    if len(text.lstrip("-")) > _MAX_PARAM_DIGITS:
        raise ValueError(f"more than {_MAX_PARAM_DIGITS} digits")
    return int(text)


def _finite_number(text: str) -> float:
    number = float(text)
    if not math.isfinite(number) or abs(number) > 10.0**_MAX_PARAM_DIGITS:
        raise ValueError(f"not a finite number of at most {_MAX_PARAM_DIGITS} digits")
    return number


def coerce_param(rule: Rule, name: str, text: str) -> Any:
    """Give an overriding value the type of the rule's default (sizes and percents allowed)."""
    if name not in rule.params:
        known = ", ".join(sorted(rule.params)) or "none"
        raise SettingError("gpu_rule_param", f"{rule.code} has no parameter {name!r} (its "
                           f"parameters: {known})")
    default = rule.params[name]
    try:
        if isinstance(default, bool):
            lowered = text.lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(f"{text!r} is not a boolean (true or false)")
            return lowered in ("true", "1", "yes")
        if isinstance(default, int):
            return _whole_number(text) if _WHOLE_RE.fullmatch(text) else parse_size(text)
        if isinstance(default, float):
            return parse_percent(text) if text.endswith("%") else _finite_number(text)
        return text
    except ValueError as exc:
        raise SettingError("gpu_rule_param", f"{rule.code}.{name}={shown(text)}: {exc} (default "
                           f"is {default!r})") from None


def apply_config(rules: list[Rule], config: RuleConfig) -> list[Rule]:
    """Check the settings against the loaded rules; return the enabled rules with overrides.

    A code or prefix that names no rule is an error (a typo would otherwise select or ignore
    nothing, silently), and so is a selection that leaves no rule to run.
    """
    from dataclasses import replace

    by_code = {rule.code: rule for rule in rules}
    for setting, codes in (("gpu_severity", config.severity), ("gpu_rule_param", config.params)):
        for code in codes:
            if code not in by_code:
                raise SettingError(setting, f"no rule with code {code}{_listing(by_code)}")
    for setting, prefixes in (("gpu_select", config.select), ("gpu_ignore", config.ignore)):
        for prefix in prefixes:
            if not any(code.startswith(prefix) for code in by_code):
                what = "code" if CODE_RE.match(prefix) else "code prefix"
                raise SettingError(setting, f"the {what} {prefix} matches no rule"
                                   f"{_listing(by_code)}")
    result = []
    for rule in rules:
        if not config.enabled(rule.code):
            continue
        params = dict(rule.params)
        for name, text in config.params.get(rule.code, {}).items():
            params[name] = coerce_param(rule, name, text)
        if rule.code in config.severity:  # the project's severity holds whatever the cost
            rule = replace(rule, severity=config.severity[rule.code], warning_when=None)
        result.append(replace(rule, params=params))
    if rules and not result:
        raise SettingError("gpu_select / gpu_ignore", f"the two leave no rule to run (select "
                           f"{' '.join(config.select) or 'ALL'}, ignore "
                           f"{' '.join(config.ignore)}): nothing would be checked")
    return result


def _listing(by_code: dict[str, Rule]) -> str:
    codes = sorted(by_code)
    if not codes:
        return ""
    return (f" (the rules are {codes[0]} to {codes[-1]}: `python -m pytest_gputrain rules` "
            "lists them)")


__all__ = ["RuleConfig", "SettingError", "apply_config", "build_config"]
