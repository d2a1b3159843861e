"""What the report says about where it ran: the machine, the load generator and every version."""

import hashlib
import json
import os
import platform
import re
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
    cores, cpu, memory = os.cpu_count() or 0, _cpu_model(), _memory_gib()
    return {
        "cores": cores,
        "platform": platform.platform(),
        "cpu": cpu,
        "memory_gib": memory,
        "fingerprint": machine_fingerprint(cpu, cores, memory, platform.machine()),
        "load_average_start": os.getloadavg(),
    }


def machine_fingerprint(cpu: str, cores: int, memory_gib: int | None, arch: str) -> str:
    """The machine as the regression guard tells machines apart (``bench.guard``): its CPU
    model, cores, memory and architecture, readable first, then a hash of all four. Not the
    host name or the kernel: a container's host name changes with every start, and the guard's
    history should say when a kernel update moved a figure, not start afresh. Two hosts of one
    instance type share a history, as their figures should compare."""
    model = re.sub(r"[^a-z0-9]+", "-", cpu.lower()).strip("-")[:40].strip("-") or "cpu"
    digest = hashlib.sha256(f"{cpu}|{cores}|{memory_gib}|{arch}".encode()).hexdigest()[:8]
    return f"{cores}c-{model}-{digest}"


def _memory_gib() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / (1024 * 1024))
    except (OSError, ValueError, IndexError):
        pass
    return None


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
