"""The queue layer's records in the admin: readable, never editable."""

import pytest
from django.urls import reverse

from callbacks.models import ParkedMessage, PaymentHold, ProcessingError, QueueMessage
from tests.factories import (
    ParkedMessageFactory,
    PaymentHoldFactory,
    ProcessingErrorFactory,
    QueueMessageFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def records():
    started = "2026-11-02T12:00:00+00:00"
    message = QueueMessageFactory(
        message_id="m-1",
        group_id="p-1",
        body={"kind": "processor_event", "payment_id": "p-1"},
        first_started_at=started,
        attempts=6,
        status="dead_lettered",
    )
    error = ProcessingErrorFactory(
        queue_message=message,
        attempt_number=6,
        message="cannot move <payment>",
        traceback="Traceback (most recent call last):\n  <frame>",
    )
    hold = PaymentHoldFactory(payment_id="p-1", caused_by=message)
    parked = ParkedMessageFactory(hold=hold, message_id="m-2", sequence_number="2", body={"a": 1})
    return {"message": message, "error": error, "hold": hold, "parked": parked}


@pytest.mark.parametrize("model", [QueueMessage, ProcessingError, PaymentHold, ParkedMessage])
def test_changelist_renders_without_an_add_button(admin_client, records, model):
    opts = model._meta
    response = admin_client.get(reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist"))
    assert response.status_code == 200
    assert reverse(f"admin:{opts.app_label}_{opts.model_name}_add") not in response.content.decode()


@pytest.mark.parametrize(
    "key, model",
    [
        ("message", QueueMessage),
        ("error", ProcessingError),
        ("hold", PaymentHold),
        ("parked", ParkedMessage),
    ],
)
def test_records_cannot_be_added_changed_or_deleted(admin_client, records, key, model):
    opts = model._meta
    obj = records[key]
    change_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[obj.pk])
    page = admin_client.get(change_url)
    assert page.status_code == 200
    assert 'name="_save"' not in page.content.decode()
    add_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_add")
    assert admin_client.get(add_url).status_code == 403
    delete_url = reverse(f"admin:{opts.app_label}_{opts.model_name}_delete", args=[obj.pk])
    assert admin_client.post(delete_url, {"post": "yes"}).status_code == 403
    assert model.objects.filter(pk=obj.pk).exists()


def test_traceback_is_shown_escaped_in_pre(admin_client, records):
    url = reverse("admin:callbacks_processingerror_change", args=[records["error"].pk])
    html = admin_client.get(url).content.decode()
    assert "<pre>Traceback (most recent call last):\n  &lt;frame&gt;</pre>" in html


def test_queue_message_page_lists_its_errors_inline(admin_client, records):
    url = reverse("admin:callbacks_queuemessage_change", args=[records["message"].pk])
    html = admin_client.get(url).content.decode()
    assert "payments.exceptions.InvalidTransition" in html
    assert "cannot move &lt;payment&gt;" in html
