"""A script run in a process of its own against a fresh SQLite database, as the quick start
runs the module: the JSON object its last line prints."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def sqlite_script_answers(script: str, tmp_path: Path) -> dict:
    """Run ``script`` with ``config.settings.test`` on a new SQLite file under ``tmp_path``;
    fail with its stderr's tail if it fails, else return what its last line printed."""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env={
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "config.settings.test",
            "DATABASE_URL": f"sqlite:///{tmp_path / 'quick.sqlite3'}",
        },
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
