"""The module's checks as django-health-check (4.x) backends, for a host that serves its page.

Needs the ``health-check`` extra (``pip install "django-ach-payments[health-check]"``); nothing
else in the module imports this file, so the module runs without the package. A host adds
``"health_check"`` to ``INSTALLED_APPS`` (its templates) and lists the checks in its view::

    from health_check.views import HealthCheckView

    path("ht/", HealthCheckView.as_view(checks=[
        "triage.operations.health_check_backends.Database",
        "triage.operations.health_check_backends.Migrations",
        "triage.operations.health_check_backends.Sqs",
        "triage.operations.health_check_backends.Processor",
    ]))

``Database`` and ``Migrations`` are what ``/readyz`` checks; ``Sqs`` and ``Processor`` are
shared dependencies: a page with them answers 500 during a queue blip, so point a load
balancer at ``/readyz`` or at a view with the first two only. The dependency checks read the
cached results of ``dependencies`` (a page refreshed in a loop costs one check per interval).
"""

from datetime import timedelta
from typing import ClassVar

from django.db import DatabaseError, connection

from triage.operations.dependencies import CHECK_TIMEOUT_SECONDS, dependencies_status
from triage.operations.health import unapplied_migrations

try:
    from health_check.base import HealthCheck
    from health_check.exceptions import ServiceUnavailable
except ImportError as exc:
    raise ImportError(
        "triage.operations.health_check_backends needs django-health-check: "
        'pip install "django-ach-payments[health-check]"'
    ) from exc


class _Dependency(HealthCheck):
    """One dependency of ``dependencies.CHECKS``, by its name there."""

    dependency: ClassVar[str]
    # Its own timeout is the check's; a second more covers the wait for the cache's lock.
    timeout = timedelta(seconds=CHECK_TIMEOUT_SECONDS + 1)

    def run(self) -> None:
        state = dependencies_status()[self.dependency]
        if not state.ok:
            raise ServiceUnavailable(state.detail)


class Database(_Dependency):
    dependency = "database"


class Sqs(_Dependency):
    dependency = "sqs"


class Processor(_Dependency):
    dependency = "processor"


class Migrations(HealthCheck):
    """The module's migrations applied to the database (read once, then cached when they are)."""

    def run(self) -> None:
        try:
            # The view runs a check in a pool's thread: no connection is left open in it.
            with connection.temporary_connection():
                unapplied = unapplied_migrations()
        except DatabaseError as exc:
            raise ServiceUnavailable(f"database unreachable ({type(exc).__name__})") from exc
        if unapplied:
            raise ServiceUnavailable(f"{len(unapplied)} migration(s) not applied")
