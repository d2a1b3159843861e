"""A micro-entry that cannot be processed stops in front of a person like any payment: its
event dead-lettered through the worker and the local SQS server, ingested into triage, its
page showing the payment's history, and the operator's resolve recorded."""

import pytest
from django.urls import reverse

from callbacks import sqs
from callbacks.schema import processor_event_message
from payments.models import Payment
from payments.services.validation import account_validation_start
from tests.factories import processor_event
from tests.triage.deadletters import event_publish, operator, viewer, worker_run
from triage import ingestion, services
from triage.models import DeadLetter, DeadLetterStatus

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_stuck_micro_entry_is_dead_lettered_into_triage_and_resolved(
    sqs_queues, fast_retries, sandbox, client
):
    validation = account_validation_start(
        account_token="tok_micro_triage_01", merchant_id="m-micro", method="micro_entries"
    )
    worker_run()  # the round's submissions, published on the start's commit
    credit = Payment.objects.filter(account_validation=validation, direction="credit").first()
    credit.refresh_from_db()
    assert credit.state == "submitted"
    # The processor resends its settlement under the same id with another amount: a conflict,
    # never dropped unseen, for a person.
    event_publish(credit, "settled", direction="credit", processor_event_id="evt_micro_1")
    conflicting = processor_event(
        credit,
        "settled",
        direction="credit",
        processor_event_id="evt_micro_1",
        amount=credit.amount + 1,
    )
    # Its fingerprint differs, so the queue keeps it, as the endpoint's deduplication id does.
    sqs.send_message_now(
        body=processor_event_message(conflicting),
        group_id=str(credit.pk),
        deduplication_id="evt_micro_1.conflict",
    )

    worker_run()
    assert ingestion.dead_letters_ingest() == 1

    dead_letter = DeadLetter.objects.get(group_id=str(credit.pk))
    assert dead_letter.status == DeadLetterStatus.OPEN
    client.force_login(viewer())
    page = client.get(reverse("admin:triage_deadletter_change", args=[dead_letter.pk]))
    assert page.status_code == 200
    assert str(credit.pk) in page.content.decode()
    services.dead_letter_resolve(dead_letter=dead_letter, user=operator(), note="checked")
    dead_letter.refresh_from_db()
    assert dead_letter.status == DeadLetterStatus.RESOLVED
