"""Operations endpoints: ``/healthz`` (liveness), ``/readyz`` (readiness), ``/metrics``.

None of them authenticates: restrict them to the monitoring network (see ``monitoring.py``).
``/healthz`` does no I/O, so a slow database never gets a healthy process killed; ``/readyz``
checks what the process needs to serve (the database and the main queue) and answers 503 naming
which of them failed (details go to the log only), so a load balancer stops routing to it.
"""

import logging

from django.db import DatabaseError, connection
from django.http import HttpResponse, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST

from triage.operations.monitoring import metrics_text

logger = logging.getLogger(__name__)


@never_cache
@require_GET
def healthz(request):
    return JsonResponse({"status": "ok"})


def _database_check() -> str:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        return f"{type(exc).__name__}: {exc}".strip()
    return ""


def _queue_check() -> str:
    from callbacks import sqs

    try:
        sqs.queue_attributes(sqs.main_queue_url(), ["QueueArn"])
    except sqs.QueueUnavailable as exc:
        return str(exc)
    return ""


@never_cache
@require_GET
def readyz(request):
    checks = {"database": _database_check(), "queue": _queue_check()}
    failed = {name: error for name, error in checks.items() if error}
    if failed:
        # The answer is unauthenticated: it names the dependency, never where it lives (host,
        # port, queue name); the log has the details.
        logger.warning("not ready: %s", "; ".join(f"{k}: {v}" for k, v in failed.items()))
        return JsonResponse(
            {
                "status": "unavailable",
                "reason": ", ".join(f"{name} unreachable" for name in failed),
                "failed": list(failed),
            },
            status=503,
        )
    return JsonResponse({"status": "ok", "checks": {name: "ok" for name in checks}})


@never_cache
@require_GET
def metrics(request):
    return HttpResponse(metrics_text(), content_type=CONTENT_TYPE_LATEST)
