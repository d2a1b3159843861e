"""gunicorn configuration: ``gunicorn -c config/gunicorn.py config.wsgi``.

Prometheus multiprocess mode (see ``triage/monitoring.py``): when PROMETHEUS_MULTIPROC_DIR is
set (to a directory shared by every process of this host, and set before they start), the
master empties it on start so counters from an earlier run are not added in, and each exiting
worker is marked dead so its live gauges disappear. ``GET /metrics`` in any worker then serves
the sum over all workers. Without the variable every worker would serve its own counters only,
and consecutive scrapes would jump between workers' values.
"""

import os
from pathlib import Path

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
threads = int(os.environ.get("GUNICORN_THREADS", "4"))
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
accesslog = "-"


def on_starting(server) -> None:
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob("*.db"):
        stale.unlink()


def child_exit(server, worker) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
