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
        # Markdown writes the marker's < and > as entities: rendered as HTML, it shows.
        assert ("&lt;redacted&gt;" if where == "report.md" else "<redacted>") in text, where


# -- credentials inside the values that are kept --------------------------------------------------

@pytest.mark.parametrize(("value", "expected"), [
    ("https://user:pw-9d1c@host/trace", "https://<redacted>@host/trace"),
    ("https://token-9d1c@host:8443/x?y=1", "https://<redacted>@host:8443/x?y=1"),
    ("http://p@ss:w@rd-9d1c@host/x", "http://<redacted>@host/x"),  # an "@" in the password
    ("s3://key:secret-9d1c@bucket/a,https://u:p-9d1c@h/b",
     "s3://<redacted>@bucket/a,https://<redacted>@h/b"),
    ("/tmp/trace", "/tmp/trace"), ("user@host", "user@host"),
    ("https://host/path/a@b", "https://host/path/a@b"),  # an "@" in the path is no user-info
])
def test_user_info_of_urls_is_redacted(value: str, expected: str) -> None:
    from pytest_gputrain.collect.environment_variables import without_credentials

    assert without_credentials(value) == expected


def test_redaction_is_linear_in_the_value() -> None:
    import time

    from pytest_gputrain.collect.environment_variables import without_credentials

    for value in ("://a" * 50_000 + "@", "a://" + "b" * 200_000 + "@", "://" + "@" * 200_000):
        started = time.perf_counter()
        without_credentials(value)
        assert time.perf_counter() - started < 1.0


def test_a_credential_in_an_allowed_url_value_stays_out_of_every_output(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCH_TRACE", "https://ci-bot:tok-5e7a91@traces.example.com/run/1")
    pytester.makepyfile("def test_ok(): pass")
    result = pytester.runpytest("--gpu-diagnose", "--gpu-fail-on=never",
                                "--gpu-report=report.json", "--gpu-report=report.md",
                                "--gpu-facts-out=facts.json")
    assert result.ret == 0
    outputs = {"terminal": result.stdout.str()}
    outputs.update({name: (pytester.path / name).read_text()
                    for name in ("report.json", "report.md", "facts.json")})
    for where, text in outputs.items():
        assert "tok-5e7a91" not in text and "ci-bot" not in text, where
        marker = "&lt;redacted&gt;" if where == "report.md" else "<redacted>"
        assert f"https://{marker}@traces.example.com/run/1" in text, where
