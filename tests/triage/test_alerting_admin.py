from datetime import UTC, datetime

import pytest

from triage.models import Alert
from triage.operations.alerting import alert_fire, alert_resolve

NOW = datetime(2026, 11, 30, 15, 0, tzinfo=UTC)


@pytest.fixture
def staff_client(client, django_user_model):
    user = django_user_model.objects.create_superuser("ops", "ops@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def resolved_alert(settings, module_settings):
    module_settings.ALERT_WEBHOOK_URL = "http://127.0.0.1:9/closed"
    module_settings.ALERT_WEBHOOK_TIMEOUT_SECONDS = 1
    settings.ADMINS = []
    alert_fire(key="queue.dlq_not_empty", severity="high", summary="2 in DLQ", now=NOW)
    return alert_resolve(key="queue.dlq_not_empty", now=NOW)


@pytest.mark.django_db
def test_alert_history_is_listed_and_shows_each_notification(staff_client, resolved_alert):
    listing = staff_client.get("/admin/triage/alert/")
    assert listing.status_code == 200
    assert b"queue.dlq_not_empty" in listing.content

    page = staff_client.get(f"/admin/triage/alert/{resolved_alert.pk}/change/")
    assert page.status_code == 200
    text = page.content.decode()
    assert "2 in DLQ" in text
    # fired and resolved, on the log and the (failing) webhook
    assert text.count("ConnectionError: HTTPConnectionPool") == 2
    assert "<pre>{\n  &quot;occurrences&quot;: 1\n}</pre>" in text  # details as JSON


@pytest.mark.django_db
def test_alert_history_is_read_only(staff_client, resolved_alert):
    assert staff_client.get("/admin/triage/alert/add/").status_code == 403
    assert staff_client.get(f"/admin/triage/alert/{resolved_alert.pk}/delete/").status_code == 403
    response = staff_client.post(
        f"/admin/triage/alert/{resolved_alert.pk}/change/", {"summary": "edited"}
    )
    assert response.status_code == 403
    assert Alert.objects.get(pk=resolved_alert.pk).summary == "2 in DLQ"
    assert staff_client.get("/admin/triage/alertnotification/add/").status_code == 403
