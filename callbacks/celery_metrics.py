"""``/metrics`` of a Celery worker or beat on a port of its own (``--metrics-port``).

The Celery worker runs the module's periodic work (the outbox sweep, dead-letter ingestion,
alert evaluation, bulk triage), so on a host of its own it needs what ``run_sqs_worker`` has:
its counters and histograms served where that host's Prometheus can scrape them. The host's
Celery app calls ``celery_metrics_configure(app)`` once (``config/celery.py`` does), which adds
``--metrics-port`` and ``--metrics-address`` to ``celery worker`` and ``celery beat``. The
server is ``callbacks.metrics_server``'s, started once the process is what it will stay (after
``--detach`` has forked) and stopped with it; beside the module's counters it serves
``payments_celery_tasks_total`` (the module's tasks the worker ran, by task and outcome).

Under the prefork pool the tasks run in child processes: give the worker a
``PROMETHEUS_MULTIPROC_DIR`` of its own and the port serves the sum of its children (the
metrics server reads the directory), as for gunicorn.
"""

from __future__ import annotations

import atexit
import logging
from contextlib import ExitStack

import click
from celery import signals
from django.core.management.base import CommandError

from callbacks.metrics import CELERY_TASKS
from callbacks.metrics_server import DEFAULT_ADDRESS, metrics_serving

logger = logging.getLogger(__name__)

_COMMANDS = ("worker", "beat")
# The module's tasks: counted by name, a bounded label (a host's own tasks are its business).
_MODULE_TASKS = ("payments.", "callbacks.", "triage.")
_wanted: dict[str, object] = {}
_serving = ExitStack()


def _options() -> list[click.Option]:
    return [
        click.Option(
            ["--metrics-port"],
            type=click.IntRange(0, 65535),
            default=0,
            help="Serve this process's Prometheus metrics on /metrics at this port (default "
            "0: off). With PROMETHEUS_MULTIPROC_DIR set, serves the sum of its processes.",
        ),
        click.Option(
            ["--metrics-address"],
            default=DEFAULT_ADDRESS,
            help=f"Address the metrics port listens on (default {DEFAULT_ADDRESS}: the "
            "endpoint has no authentication).",
        ),
    ]


def _remember(sender, app, options, **kwargs) -> None:
    if getattr(sender, "__name__", "") in _COMMANDS:
        _wanted.update(
            port=options.get("metrics_port") or 0,
            address=options.get("metrics_address") or DEFAULT_ADDRESS,
        )


def _serve(**kwargs) -> None:
    port = _wanted.get("port") or 0
    if not port or _serving._exit_callbacks:
        return
    try:
        _serving.enter_context(metrics_serving(port=port, address=_wanted["address"]))
    except CommandError as exc:
        # A process that silently ran without the metrics it was started with would look
        # idle to its alerts: refuse to run instead.
        logger.critical("%s", exc)
        raise SystemExit(1) from exc
    # Beat has no shutdown signal: stopped at exit, while the server's thread still runs. Left
    # to the interpreter's finalization, the server's shutdown waited for a thread already
    # stopped, and beat never exited on SIGTERM (until killed: a supervisor's stop timeout).
    atexit.register(_stop)


def _stop(**kwargs) -> None:
    _serving.close()


def _counted(outcome: str):
    def count(sender=None, **kwargs) -> None:
        name = getattr(sender, "name", "") or ""
        if name.startswith(_MODULE_TASKS):
            CELERY_TASKS.labels(task=name, outcome=outcome).inc()

    return count


_COUNTERS = {
    signals.task_success: _counted("succeeded"),
    signals.task_failure: _counted("failed"),
    signals.task_retry: _counted("retried"),
}


def celery_metrics_configure(app) -> None:
    """Give ``app``'s worker and beat commands ``--metrics-port`` and ``--metrics-address``."""
    for option in _options():
        app.user_options["preload"].add(option)
    signals.user_preload_options.connect(_remember, weak=False)
    signals.worker_init.connect(_serve, weak=False)
    signals.beat_init.connect(_serve, weak=False)
    signals.worker_shutdown.connect(_stop, weak=False)
    for signal, count in _COUNTERS.items():
        signal.connect(count, weak=False)
