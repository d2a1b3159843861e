"""``/metrics`` of a queue process on a port of its own (``--metrics-port``).

A worker or relay on a host without the web process has nobody to add its counters up for it:
``PROMETHEUS_MULTIPROC_DIR`` only helps processes that share a directory. With
``--metrics-port`` the process serves its own counters and histograms (``callbacks.metrics``,
``payments.metrics``) with prometheus_client's own HTTP server, in a daemon thread, so a slow
scrape never holds up a message. It serves no gauge read from SQS or the database: those are
the web's ``/metrics`` (``triage.operations.monitoring``), computed once per interval there,
and a fleet of workers must not multiply them.

The endpoint is unauthenticated, so it listens on 127.0.0.1 unless ``--metrics-address`` says
otherwise: exposing it to a network is a decision the operator makes where they know what that
network is (``0.0.0.0`` inside a container whose port only Prometheus can reach).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager

from django.core.management.base import CommandError
from prometheus_client import REGISTRY, CollectorRegistry, start_http_server
from prometheus_client.multiprocess import MultiProcessCollector

logger = logging.getLogger(__name__)

DEFAULT_ADDRESS = "127.0.0.1"


def counters_registry() -> CollectorRegistry:
    """The registry that holds this process's counters and histograms.

    Without ``PROMETHEUS_MULTIPROC_DIR``: the default registry, where they live. With it, they
    live in the directory's files, one set per process; a fresh registry reading them all adds
    up every process sharing the directory (the default one would count this process twice).
    """
    multiproc_dir = os.environ.get("PROMETHEUS_MULTIPROC_DIR", "")
    if not multiproc_dir:
        return REGISTRY
    registry = CollectorRegistry(auto_describe=True)
    MultiProcessCollector(registry, path=multiproc_dir)
    return registry


def _port(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a port number") from None
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(f"{number} is out of range (0-65535; 0 = off)")
    return number


def metrics_arguments_add(parser: argparse.ArgumentParser) -> None:
    """``--metrics-port`` and ``--metrics-address``, the same for every queue command."""
    parser.add_argument(
        "--metrics-port",
        type=_port,
        default=0,
        help="Serve this process's Prometheus metrics on /metrics at this port (default 0: "
        "off). With PROMETHEUS_MULTIPROC_DIR set, serves the sum of the directory's processes.",
    )
    parser.add_argument(
        "--metrics-address",
        default=DEFAULT_ADDRESS,
        help=f"Address the metrics port listens on (default {DEFAULT_ADDRESS}: the endpoint "
        "has no authentication; give 0.0.0.0 where only the monitoring network reaches it).",
    )


@contextmanager
def metrics_serving(*, port: int, address: str = DEFAULT_ADDRESS) -> Iterator[None]:
    """Serve ``/metrics`` on ``address:port`` for the duration (nothing when ``port`` is 0).

    A port that cannot be bound stops the command before it does any work: a worker that
    silently ran without the metrics it was started with would look idle to its alerts.
    """
    if not port:
        yield
        return
    try:
        server, thread = start_http_server(port, addr=address, registry=counters_registry())
    except OSError as exc:
        raise CommandError(f"cannot serve metrics on {address}:{port}: {exc}") from exc
    logger.info("serving metrics on http://%s:%s/metrics", address, port)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
