import json
import os
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from callbacks import sqs
from payments import signing
from payments.services import payment_apply_event
from tests.factories import (
    DeadLetterFactory,
    PaymentFactory,
    PaymentHoldFactory,
    QueueMessageFactory,
    processor_event,
)
from triage.operations.monitoring import metrics_registry

ROOT = Path(__file__).resolve().parents[2]


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def post_callback(client, module_settings, payment, event_type, *, secret=None):
    body = json.dumps(
        {
            "payment_id": str(payment.id),
            "event_type": event_type,
            "processor_event_id": f"evt_{event_type}_{payment.id.hex[:8]}",
            "amount": f"{payment.amount:.2f}",
            "timestamp": "2026-11-02T12:00:00+00:00",
        }
    ).encode()
    header = signing.sign(body, [secret or module_settings.CALLBACK_SIGNING_SECRETS[0]])
    return client.post(
        "/callbacks/processor/",
        data=body,
        content_type="application/json",
        headers={signing.HEADER: header},
    )


@pytest.mark.django_db
def test_metrics_count_a_scripted_run(
    client, module_settings, sqs_queues, django_capture_on_commit_callbacks
):
    # The gauges read the queue and the database afresh for each of the two scrapes.
    module_settings.METRICS_SNAPSHOT_SECONDS = 0
    before = scrape(client)

    payments = [PaymentFactory(state="submitted") for _ in range(3)]
    with django_capture_on_commit_callbacks(execute=True):
        for payment in payments[:2]:
            payment_apply_event(event=processor_event(payment, "settled"))
        payment_apply_event(event=processor_event(payments[2], "returned"))
        # A repeat of the same event id is a duplicate: no transition counted.
        event = processor_event(payments[0], "settled", processor_event_id="evt_again")
        payment_apply_event(event=event)
    for payment in payments:
        assert post_callback(client, module_settings, payment, "settled").status_code == 202
    assert (
        post_callback(client, module_settings, payments[0], "settled", secret="wrong").status_code
        == 401
    )

    after = scrape(client)
    delta = lambda name, **labels: value(after, name, **labels) - value(before, name, **labels)  # noqa: E731
    assert delta("payments_transitions_total", from_state="submitted", to_state="confirmed") == 2
    assert delta("payments_transitions_total", from_state="submitted", to_state="failed") == 1
    assert delta("payments_callbacks_received_total", outcome="accepted") == 3
    assert delta("payments_callbacks_received_total", outcome="bad_signature") == 1
    # The three accepted callbacks are on the main queue now.
    assert value(after, "payments_queue_messages", queue="main", state="visible") == 3
    assert value(after, "payments_queue_messages", queue="dlq", state="visible") == 0
    assert value(after, "payments_by_state", state="confirmed") == 2
    assert value(after, "payments_by_state", state="failed") == 1


@pytest.mark.django_db
def test_operations_gauges_read_queue_depth_and_the_database_at_scrape_time(client, sqs_queues):
    for i in range(2):
        sqs_queues.client.send_message(
            QueueUrl=sqs_queues.dlq_url,
            MessageBody="{}",
            MessageGroupId=f"g{i}",
            MessageDeduplicationId=f"d{i}",
        )
    DeadLetterFactory(status="open")
    DeadLetterFactory(status="discarded")
    PaymentHoldFactory(payment_id="p-1")
    PaymentHoldFactory(payment_id="p-2", released_at=timezone.now())
    now = timezone.now()
    for status, age in [("in_progress", 120), ("retrying", 30), ("done", 900)]:
        QueueMessageFactory(enqueued_at=now - timedelta(seconds=age), status=status)

    samples = scrape(client)

    assert value(samples, "payments_queue_messages", queue="dlq", state="visible") == 2
    assert value(samples, "payments_dead_letters_open") == 1
    assert value(samples, "payments_on_hold") == 1
    assert value(samples, "payments_unfinished_messages") == 2
    # The finished message (900 s old) does not count; the oldest unfinished is 120 s old.
    assert 120 <= value(samples, "payments_oldest_unfinished_message_age_seconds") < 180
    assert value(samples, "payments_ops_scrape_error", source="sqs") == 0


@pytest.mark.django_db
def test_unreachable_queue_leaves_depth_out_and_flags_the_scrape_error(
    client, module_settings, sqs_queues
):
    module_settings.SQS_ENDPOINT_URL = "http://127.0.0.1:9"
    sqs.reset()
    samples = scrape(client)
    assert not any(name == "payments_queue_messages" for name, _ in samples)
    assert value(samples, "payments_ops_scrape_error", source="sqs") == 1
    assert value(samples, "payments_ops_scrape_error", source="dead_letters") == 0
    assert value(samples, "payments_dead_letters_open") == 0


@pytest.mark.django_db
def test_operations_collector_is_registered_once(client, sqs_queues):
    assert metrics_registry() is metrics_registry()
    scrape(client)
    text = client.get("/metrics").content.decode()
    assert text.count("# TYPE payments_dead_letters_open gauge") == 1


INCREMENT = """
import django, os, sys
django.setup()
from callbacks.metrics import CALLBACKS_RECEIVED
from payments.metrics import TRANSITIONS
for _ in range(int(sys.argv[1])):
    CALLBACKS_RECEIVED.labels(outcome="accepted").inc()
TRANSITIONS.labels("submitted", "confirmed").inc()
print(os.getpid())
"""


@pytest.mark.subprocess
@pytest.mark.django_db
def test_multiprocess_mode_adds_up_every_process(client, monkeypatch, tmp_path, sqs_queues):
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(tmp_path),
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
    }
    for count in (3, 4):
        subprocess.run(
            [sys.executable, "-c", INCREMENT, str(count)],
            cwd=ROOT,
            env=env,
            check=True,
            capture_output=True,
            timeout=60,
        )
    assert len(list(tmp_path.glob("counter_*.db"))) == 2

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    samples = scrape(client)
    # Only the two processes' files count: exactly their sum, whatever this process holds.
    assert value(samples, "payments_callbacks_received_total", outcome="accepted") == 7
    assert (
        value(samples, "payments_transitions_total", from_state="submitted", to_state="confirmed")
        == 2
    )
    # The scrape-time gauges are served once, not summed over processes.
    assert value(samples, "payments_dead_letters_open") == 0
    assert ("payments_queue_messages", (("queue", "main"), ("state", "visible"))) in samples


@pytest.mark.django_db(transaction=True)
def test_a_rolled_back_transition_is_not_counted():
    from django.db import transaction
    from prometheus_client import REGISTRY

    def confirmed() -> float:
        labels = {"from_state": "submitted", "to_state": "confirmed"}
        return REGISTRY.get_sample_value("payments_transitions_total", labels) or 0.0

    payment = PaymentFactory(state="submitted")
    before = confirmed()
    with pytest.raises(RuntimeError), transaction.atomic():
        payment_apply_event(event=processor_event(payment, "settled"))
        raise RuntimeError("the caller's transaction fails after the transition")
    assert confirmed() == before
    payment_apply_event(event=processor_event(payment, "settled"))
    assert confirmed() == before + 1


@pytest.mark.django_db
def test_a_cancel_is_counted_and_canceled_payments_have_their_state_label(
    client, module_settings, sqs_queues, django_capture_on_commit_callbacks
):
    from payments.services import payment_cancel

    module_settings.METRICS_SNAPSHOT_SECONDS = 0
    before = scrape(client)
    payments = [PaymentFactory() for _ in range(3)]

    with django_capture_on_commit_callbacks(execute=True):
        for payment in payments[:2]:
            payment_cancel(payment_id=payment.id)

    after = scrape(client)
    moved = value(after, "payments_transitions_total", from_state="pending", to_state="canceled")
    assert (
        moved
        - value(before, "payments_transitions_total", from_state="pending", to_state="canceled")
        == 2
    )
    assert value(after, "payments_by_state", state="canceled") == 2
    assert value(after, "payments_by_state", state="pending") == 1
    # Labelled from the first scrape on, before any payment was canceled.
    assert ("payments_by_state", (("state", "canceled"),)) in before
