"""Operations endpoints: ``/healthz`` (liveness), ``/readyz`` (readiness), ``/dependencies``,
``/metrics``.

None of them authenticates: restrict them to the monitoring network (see ``monitoring.py``).
``/healthz`` does no I/O, so a slow database never gets a healthy process killed. ``/readyz``
fails only on what this replica itself lacks: its database connection, and the module's
migrations applied to that database. Never on SQS or the processor: every replica shares them,
so in a monolith, where the module's readiness is the site's, a queue blip would take every web
pod out of the load balancer, checkout pages and all, while the failure table says a queue
outage only makes payments wait in the outbox. Their state is ``/dependencies`` and the gauge
``payments_dependency_up`` (``dependencies``), for dashboards and alerts.
"""

import logging

from django.db import DatabaseError, connection
from django.db.migrations.executor import MigrationExecutor
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from triage.operations.dependencies import (
    database_error,
    dependencies_status,
)
from triage.operations.monitoring import metrics_text

logger = logging.getLogger(__name__)

MODULE_APPS = ("payments", "callbacks", "triage")

# Set once every migration of the module is applied: a process's code does not change, and
# migrations are not unapplied under a running release, so later probes cost nothing.
_migrated = False


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


def unapplied_migrations() -> list[str]:
    """The module's migrations (and what they depend on) not applied to this replica's
    database, as ``app.name``; read from the database until none is left, then never again."""
    global _migrated
    if _migrated:
        return []
    executor = MigrationExecutor(connection)
    targets = [key for app in MODULE_APPS for key in executor.loader.graph.leaf_nodes(app)]
    unapplied = [
        f"{migration.app_label}.{migration.name}"
        for migration, _backwards in executor.migration_plan(targets)
    ]
    _migrated = not unapplied
    return unapplied


def migrations_reset() -> None:
    """Read the migrations again at the next probe (tests)."""
    global _migrated
    _migrated = False


def _migrations_check() -> str:
    try:
        unapplied = unapplied_migrations()
    except DatabaseError as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return f"not applied: {', '.join(unapplied)}" if unapplied else ""


@never_cache
@require_GET
def readyz(request):
    failed = {"database": database_error()}
    if not failed["database"]:
        # Unreadable without the database, and then the database is the answer.
        failed["migrations"] = _migrations_check()
    failed = {name: error for name, error in failed.items() if error}
    if failed:
        # The answer is unauthenticated: it names what is missing, never where it lives (host,
        # port); the log has the details.
        logger.warning("not ready: %s", "; ".join(f"{k}: {v}" for k, v in failed.items()))
        reasons = {"database": "database unreachable", "migrations": "migrations not applied"}
        return JsonResponse(
            {
                "status": "unavailable",
                "reason": ", ".join(reasons[name] for name in failed),
                "failed": list(failed),
            },
            status=503,
        )
    return JsonResponse({"status": "ok", "checks": {"database": "ok", "migrations": "ok"}})


@never_cache
@require_GET
def dependencies(request):
    """Each shared dependency's state; always 200, since it reports and is not a probe."""
    return JsonResponse({name: state.as_dict() for name, state in dependencies_status().items()})


@never_cache
@require_GET
def metrics(request):
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)
