"""gunicorn configuration: ``gunicorn -c config/gunicorn.py config.wsgi``.

Prometheus multiprocess mode (``triage/operations/monitoring.py``): when PROMETHEUS_MULTIPROC_DIR is
set (to a directory shared by every process of this host, and set before they start), the
master removes the files of processes that no longer run when it starts, and each exiting
worker is marked dead so its live gauges disappear. ``GET /metrics`` in any worker then serves
the sum over all workers. Without the variable every worker would serve its own counters only,
and consecutive scrapes would jump between workers' values.

The access log (``accesslog``) is written by ``MaskedAccessLogger``: a bank number in a
request's path or query is masked to its last 4 digits before the line is written.
"""

import os
from pathlib import Path

from gunicorn.glogging import Logger

from payments.kernel.logformat import BankNumbersInUrlsFilter

bind = os.environ.get("GUNICORN_BIND", "127.0.0.1:8000")
workers = int(os.environ.get("GUNICORN_WORKERS", "2"))
# The callback endpoint waits on the SQS round trip, not the CPU: more threads than cores keep
# the CPU busy and fill the coalesced sends (docs/benchmarks.md, "The whole pipeline").
threads = int(os.environ.get("GUNICORN_THREADS", "8"))
# One listening socket per worker (SO_REUSEPORT): the kernel spreads new connections over the
# workers by a hash of their addresses. On one shared socket the worker that wins the accepts
# takes most of a few long-lived keep-alive connections (a load balancer's, wrk's), holds more
# than its threads on one core by its GIL while the other idles (docs/benchmarks.md, "Callback
# ingest").
reuse_port = os.environ.get("GUNICORN_REUSE_PORT", "1") != "0"
timeout = int(os.environ.get("GUNICORN_TIMEOUT", "30"))
graceful_timeout = int(os.environ.get("GUNICORN_GRACEFUL_TIMEOUT", "30"))
accesslog = "-"


class MaskedAccessLogger(Logger):
    """gunicorn's logger, its access lines' paths and queries with any bank number masked to
    its last 4 digits (``payments.kernel.logformat.BankNumbersInUrlsFilter``): a URL is logged
    before the application refuses it."""

    def setup(self, cfg) -> None:
        super().setup(cfg)
        if not any(isinstance(f, BankNumbersInUrlsFilter) for f in self.access_log.filters):
            self.access_log.addFilter(BankNumbersInUrlsFilter())


logger_class = MaskedAccessLogger


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, owned by someone else
    return True


def on_starting(server) -> None:
    """Drop the metric files of processes that no longer run (an earlier run of this host).

    Files of live processes are kept: queue workers may share the directory and keep running
    while gunicorn restarts, and removing their open files would lose their increments.
    Dropping a dead process's counters is a counter reset, which Prometheus' rate() handles.
    """
    path = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
    if not path:
        return
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    for metric_file in directory.glob("*.db"):
        pid = metric_file.stem.rsplit("_", 1)[-1]
        if pid.isdigit() and not _pid_alive(int(pid)):
            metric_file.unlink()


def child_exit(server, worker) -> None:
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(worker.pid)
