"""Operations endpoints for a host project's URLconf: ``/healthz``, ``/readyz``,
``/dependencies``, ``/metrics`` under whatever prefix the host includes them (restrict them to
the monitoring network)."""

from django.urls import path

from triage.operations import health

urlpatterns = [
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("dependencies", health.dependencies, name="dependencies"),
    path("metrics", health.metrics, name="metrics"),
]
