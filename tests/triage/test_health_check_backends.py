"""The module's checks as django-health-check backends, installed the way a host installs them:
``health_check`` in INSTALLED_APPS and its view listing them."""

import importlib
import sys

import pytest
from django.urls import path
from health_check.views import HealthCheckView

from callbacks import sqs
from triage.operations import dependencies
from triage.operations.health import migrations_reset

BACKENDS = "triage.operations.health_check_backends"
urlpatterns = [
    path(
        "ht/",
        HealthCheckView.as_view(
            checks=[f"{BACKENDS}.{name}" for name in ("Database", "Migrations", "Sqs", "Processor")]
        ),
    ),
]


@pytest.fixture
def host(settings):
    settings.INSTALLED_APPS = [*settings.INSTALLED_APPS, "health_check"]
    settings.ROOT_URLCONF = __name__
    dependencies.dependencies_reset()
    migrations_reset()
    yield
    dependencies.dependencies_reset()


@pytest.mark.django_db
def test_the_backends_report_every_check_ok(client, host, sqs_queues):
    response = client.get("/ht/?format=json")
    assert response.status_code == 200
    assert response.json() == {
        "Database()": "OK",
        "Migrations()": "OK",
        "Sqs()": "OK",
        "Processor()": "OK",
    }
    assert client.get("/ht/").status_code == 200  # the package's own page renders


@pytest.mark.django_db
def test_an_unreachable_queue_is_the_sqs_backends_error_not_a_crash(client, host, module_settings):
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"  # nothing listens there
    sqs.reset()
    response = client.get("/ht/?format=json")
    assert response.status_code == 500
    body = response.json()
    assert body["Sqs()"] == "Unavailable: main queue unreachable"
    assert body["Database()"] == body["Migrations()"] == body["Processor()"] == "OK"


def test_without_the_package_the_backends_say_which_extra_to_install(monkeypatch):
    # As if not installed, whether or not this process imported it before.
    names = {"health_check"} | {
        name for name in sys.modules if name.split(".")[0] == "health_check"
    }
    for name in names:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, BACKENDS, raising=False)
    with pytest.raises(ImportError, match=r"django-ach-payments\[health-check\]"):
        importlib.import_module(BACKENDS)
