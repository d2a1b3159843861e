"""The sandbox is the project's development app: installed for the demo, bench and tests, left
out of production (and of a host: tests/host)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.apps import apps
from django.core.management import get_commands

ROOT = Path(__file__).resolve().parent.parent.parent


def test_the_project_installs_the_sandbox_and_its_command():
    assert apps.is_installed("sandbox")
    assert get_commands()["run_sandbox_processor"] == "sandbox"


@pytest.mark.subprocess
def test_production_settings_leave_the_sandbox_out():
    code = (
        "import django; django.setup(); from django.apps import apps; "
        "from django.core.management import get_commands; "
        "print(apps.is_installed('sandbox'), 'run_sandbox_processor' in get_commands())"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.production",
            "SECRET_KEY": "x",
            "DATABASE_URL": "sqlite:///:memory:",
            "PROCESSOR_BASE_URL": "http://127.0.0.1:9",
            "PROCESSOR_API_KEY": "k",
            "CALLBACK_SIGNING_SECRETS": "s",
        },
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False"]
