"""What the report says about where it ran: the machine, the load generator and every version."""

import json
import os
import platform
import shutil
import subprocess
from pathlib import Path

import psycopg

from bench.options import log
from devstack.processes import ROOT


def _command_version(cmd: list[str]) -> str:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"unavailable ({exc})"
    return (
        (done.stdout or done.stderr).strip().splitlines()[0] if (done.stdout or done.stderr) else ""
    )


def versions(db_url: str) -> dict:
    import django
    import gunicorn
    import rest_framework

    with psycopg.connect(db_url) as conn:
        postgres = conn.execute("SHOW server_version").fetchone()[0]
    package = json.loads((ROOT / "localsqs" / "package.json").read_text())
    git = _command_version(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"])
    dirty = _command_version(["git", "-C", str(ROOT), "status", "--porcelain"])
    return {
        "python": platform.python_version(),
        "django": django.get_version(),
        "djangorestframework": rest_framework.VERSION,
        "gunicorn": gunicorn.__version__,
        "psycopg": psycopg.__version__,
        "postgresql": postgres,
        "fauxqs": package["dependencies"]["fauxqs"],
        "node": _command_version(["node", "--version"]),
        "wrk": " ".join(_command_version(["wrk", "--version"]).split()[1:2])
        if shutil.which("wrk")
        else None,
        "git_commit": git,
        "git_tree_clean": dirty == "",
    }


def machine() -> dict:
    return {
        "cores": os.cpu_count(),
        "platform": platform.platform(),
        "cpu": _cpu_model(),
        "load_average_start": os.getloadavg(),
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def ensure_wrk() -> str:
    """wrk when present (installed from Debian when missing and running as root); else the
    Python generator. Returns which one the ingest benchmark uses."""
    if os.environ.get("BENCH_GENERATOR") == "python":
        return "python"
    if shutil.which("wrk"):
        return "wrk"
    if hasattr(os, "geteuid") and os.geteuid() == 0 and shutil.which("apt-get"):
        log("wrk is missing: installing Debian's wrk package")
        done = subprocess.run(
            ["apt-get", "install", "-y", "-q", "wrk"], capture_output=True, text=True
        )
        if done.returncode == 0 and shutil.which("wrk"):
            return "wrk"
        log(f"apt-get install wrk failed ({done.returncode}); using the Python generator")
    return "python"
