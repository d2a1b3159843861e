"""Start-up configuration: a missing secret stops start-up naming it; production is deploy-clean."""

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REQUIRED = {
    "SECRET_KEY": secrets.token_urlsafe(50),
    "DATABASE_URL": "postgres://postgres@127.0.0.1:5432/payments",
    "PROCESSOR_BASE_URL": "https://processor.example",
    "PROCESSOR_API_KEY": "key",
    "CALLBACK_SIGNING_SECRETS": "secret",
}


def _manage(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("missing", sorted(REQUIRED))
def test_a_missing_required_setting_stops_start_up_naming_it(missing):
    env = {k: v for k, v in REQUIRED.items() if k != missing}
    env["DJANGO_SETTINGS_MODULE"] = "config.settings.base"

    result = _manage(env, "check")

    assert result.returncode != 0
    assert f"Set the {missing} environment variable" in result.stderr


def test_production_settings_pass_check_deploy():
    env = {**REQUIRED, "DJANGO_SETTINGS_MODULE": "config.settings.production"}

    result = _manage(env, "check", "--deploy", "--fail-level", "WARNING")

    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout
