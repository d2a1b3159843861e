"""Each module of the bank path imports first in a fresh process, whatever was imported
before it: ``payments.conf`` checks the bank path's settings with some of them, so none of
those may import the settings at import time."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
MODULES = [
    "bank.nacha.layouts",
    "bank.nacha.parser",
    "bank.nacha.writer",
    "bank.nacha.originator",
    "bank.nacha.settings",
    "bank.nacha.windows",
    "bank.nacha.transports",
    "bank.vault.keys",
    "bank.vault.crypto",
]


@pytest.mark.subprocess
def test_every_settings_free_module_imports_first_in_a_fresh_process():
    code = "; ".join(
        f"import importlib, sys; importlib.import_module({m!r}); [sys.modules.pop(k) for k in "
        "list(sys.modules) if k.startswith('payments')]"
        for m in MODULES
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "DJANGO_SETTINGS_MODULE": "config.settings.test"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
