"""The apps are a module a host adopts: the lint rule that keeps them off ``config`` (the
project's package) and ``sandbox`` (its development app) works."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def ruff_on(filename: str, source: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "--stdin-filename", filename, "-"],
        cwd=ROOT,
        input=source,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize("app", ["payments", "callbacks", "bank", "triage"])
@pytest.mark.parametrize(
    "source", ["from config.celery import app\n", "import config.settings.base\n"]
)
def test_an_app_importing_config_fails_the_lint(app, source):
    result = ruff_on(f"{app}/anything.py", source)

    assert result.returncode != 0
    assert "TID251" in result.stdout


@pytest.mark.parametrize("app", ["payments", "callbacks", "bank", "triage"])
@pytest.mark.parametrize(
    "source", ["from sandbox import SandboxProcessor\n", "import sandbox.faults\n"]
)
def test_an_app_importing_the_sandbox_fails_the_lint(app, source):
    result = ruff_on(f"{app}/anything.py", source)

    assert result.returncode != 0
    assert "TID251" in result.stdout


def test_the_project_package_may_import_itself():
    result = ruff_on("config/anything.py", "from config.celery import app\n\nprint(app)\n")

    assert result.returncode == 0, result.stdout
