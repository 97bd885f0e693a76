"""No value of an environment variable outside the allow-list reaches any output of a session."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestAssertRewriteWarning")

SECRETS = {"NCCL_IB_Password": "pw-3b1f", "NCCL_API_KEY": "key-8c2e", "NCCL_APIKEY": "key-51aa",
           "NCCL_AUTH": "auth-77d0", "NCCL_CREDENTIALS": "cred-0f19",
           "NCCL_PRIVATE_KEY_FILE": "/secrets/key-4e6d.pem"}


def test_secrets_stay_out_of_the_header_reports_and_facts_file(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("NCCL_DEBUG", "WARN")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never",
                                "--gpu-report=report.json", "--gpu-report=report.md",
                                "--gpu-facts-out=facts.json")
    assert result.ret == 0
    lines = result.stdout.lines
    start = next(index for index, line in enumerate(lines) if "gputrain: environment:" in line)
    end = next(index for index in range(start + 1, len(lines))
               if not lines[index].startswith(" "))
    header = " ".join(lines[start:end])  # wrapped to the terminal's width
    assert "NCCL_DEBUG='WARN'" in header
    assert "NCCL_API_KEY='<redacted>'" in header
    outputs = {"terminal": result.stdout.str()}
    outputs.update({name: (pytester.path / name).read_text()
                    for name in ("report.json", "report.md", "facts.json")})
    for where, text in outputs.items():
        for name, value in SECRETS.items():
            assert value not in text, f"{name}'s value is in the {where}"
        assert "<redacted>" in text, where
