"""The SQS calls each process really makes, recorded on the gateway's boto3 client while the
real code runs against the local SQS server, are exactly those its role declares in
callbacks/sqs_access.py (and so exactly what the template's policy for it grants).

One scenario drives every process: the queue worker submits a payment and dead-letters an event
that has no valid transition (two more are parked behind it); Celery's periodic tasks ingest the
dead letter, sample the queues, evaluate alerts, relay a stale outbox row and reconcile; the
web answers a callback, /readyz, /metrics and the triage dashboard, and an operator redrives
the dead letter (which releases the hold); set-up creates the queues. Celery's broker traffic
goes through kombu's own client and is declared, not recorded here.
"""

import io
import uuid
import weakref
from collections import defaultdict
from contextlib import contextmanager
from datetime import timedelta

import pytest
from botocore import xform_name
from django.core.management import call_command
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from bank.collect import nacha_events_publish_now
from bank.nacha.models import NachaInboundEvent, NachaInboundFile
from callbacks import sqs
from callbacks import tasks as callbacks_tasks
from callbacks.sqs_access import (
    OPERATION_ACTIONS,
    SQS_CALL_SITES,
    ProcessRole,
    QueueRole,
    role_permissions,
)
from payments.models import OutboxMessage
from tests.callbacks.test_endpoint import event_body, post_json
from tests.factories import PaymentFactory
from tests.triage.deadletters import event_publish, operator
from triage import services as triage_services
from triage import tasks as triage_tasks
from triage.models import DeadLetter


class SqsCallRecorder:
    """Records (queue, IAM action) of every call made through ``sqs.sqs_client()``, under the
    role set by ``acting_as``; calls made outside a role (test set-up) are not recorded."""

    def __init__(self, monkeypatch, module_settings) -> None:
        self.settings = module_settings
        self.role: ProcessRole | None = None
        self.calls: dict[ProcessRole, set[tuple[str, str]]] = defaultdict(set)
        self._clients: weakref.WeakSet = weakref.WeakSet()
        original = sqs.sqs_client

        def recording_client():
            # A WeakSet, not ids: a client dropped by ``sqs.reset()`` can free its id for the
            # next one, which would then go unrecorded.
            client = original()
            if client not in self._clients:
                client.meta.events.register("provide-client-params.sqs", self._record)
                self._clients.add(client)
            return client

        monkeypatch.setattr(sqs, "sqs_client", recording_client)

    def _queue(self, params: dict) -> str:
        name = params.get("QueueName") or params["QueueUrl"].rstrip("/").rsplit("/", 1)[1]
        return {
            self.settings.SQS_QUEUE_NAME: QueueRole.MAIN,
            self.settings.SQS_DLQ_NAME: QueueRole.DEAD_LETTER,
            self.settings.CELERY_SQS_QUEUE_NAME: QueueRole.CELERY_BROKER,
        }.get(name, f"unknown queue {name}")

    def _record(self, params, model, **kwargs) -> None:
        if self.role is not None:
            operation = xform_name(model.name)
            action = OPERATION_ACTIONS.get(operation, f"undeclared operation {operation}")
            self.calls[self.role].add((self._queue(params), action))

    @contextmanager
    def acting_as(self, role: ProcessRole):
        sqs.reset()  # a process of its own: no client or queue URLs cached by another
        self.role = role
        try:
            yield
        finally:
            self.role = None


def declared(role: ProcessRole) -> set[tuple[str, str]]:
    return {
        (queue, action) for queue, actions in role_permissions(role).items() for action in actions
    }


def declared_in_product_code(role: ProcessRole) -> set[tuple[str, str]]:
    """What the role's own call sites use (kombu's broker traffic left out)."""
    return {
        (queue, OPERATION_ACTIONS[op])
        for site in SQS_CALL_SITES
        if role in site.roles and not site.third_party
        for queue, operations in site.access.items()
        for op in operations
    }


@pytest.fixture
def recorder(monkeypatch, module_settings, sqs_queues):
    return SqsCallRecorder(monkeypatch, module_settings)


@pytest.mark.django_db(transaction=True)
def test_each_process_makes_exactly_the_sqs_calls_its_role_declares(
    recorder, sqs_queues, sandbox, module_settings, admin_user, local_sqs
):
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    # Set-up, not recorded: a pending payment whose "settled" event has no valid transition,
    # with two events behind it, and a payment whose submission waits in the outbox.
    held = PaymentFactory()
    for event_type in ("settled", "submitted", "settled"):
        event_publish(held, event_type)
    submitted = PaymentFactory()
    OutboxMessage.objects.create(
        kind="submit_payment",
        group_id=str(submitted.id),
        body={"kind": "submit_payment", "payment_id": str(submitted.id)},
    )

    with recorder.acting_as(ProcessRole.QUEUE_WORKER):
        call_command(
            "run_sqs_worker",
            until_empty=True,
            wait_time=0,
            visibility_timeout=30,
            stdout=io.StringIO(),
            stderr=io.StringIO(),
        )

    # A row left unpublished for minutes, for beat's relay; the submitted payment is overdue
    # for reconciliation.
    stale = PaymentFactory()
    row = OutboxMessage.objects.create(
        kind="submit_payment",
        group_id=str(stale.id),
        body={"kind": "submit_payment", "payment_id": str(stale.id)},
    )
    OutboxMessage.objects.filter(pk=row.pk).update(created_at=timezone.now() - timedelta(minutes=5))
    module_settings.RECONCILE_SUBMITTED_AFTER = timedelta(0)
    bank_file = NachaInboundFile.objects.create(
        name="returns.ach", sha256="0" * 64, status="imported"
    )
    for payment, trace in ((stale, "021000020000001"), (None, "021000029999999")):
        NachaInboundEvent.objects.create(
            file=bank_file,
            record_number=3,
            original_trace_number=trace,
            code="R01",
            event_type="returned",
            payment=payment,
            deduplication_id=f"{trace}.0123456789abcdef",
            event={"payment_id": str(payment.pk) if payment else "", "event_type": "returned"},
        )
    with recorder.acting_as(ProcessRole.CELERY):
        assert triage_tasks.dead_letters_ingest() == 1
        triage_tasks.queue_metrics_sample()
        triage_tasks.alerts_evaluate()
        assert callbacks_tasks.outbox_relay_publish() == 1
        callbacks_tasks.payments_reconcile()
        # The bank files' collection (nacha_collect, beside the Celery jobs): a return of ours
        # to the main queue, one for an unknown trace number to the DLQ.
        assert nacha_events_publish_now() == (1, 1)

    with recorder.acting_as(ProcessRole.WEB):
        assert post_json(event_body()).status_code == 202
        assert Client().get("/readyz").status_code == 200
        assert Client().get("/metrics").status_code == 200
        admin = Client()
        admin.force_login(admin_user)
        dashboard = admin.get(reverse("admin:triage_triagedashboard_changelist"))
        assert dashboard.status_code == 200
        # What the admin's redrive confirmation runs: republish, then release the hold.
        dead_letter = DeadLetter.objects.get(group_id=str(held.id))
        result = triage_services.dead_letter_redrive(
            dead_letter=dead_letter, user=operator(), note="fixed upstream"
        )
        assert result.released == 2

    # Set-up on a fresh account creates the queues; run again after both drifted, it fixes them.
    suffix = uuid.uuid4().hex[:12]
    module_settings.SQS_QUEUE_NAME = f"setup-{suffix}.fifo"
    module_settings.SQS_DLQ_NAME = f"setup-dlq-{suffix}.fifo"
    module_settings.CELERY_SQS_QUEUE_NAME = f"celery-{suffix}"
    with recorder.acting_as(ProcessRole.SETUP):
        call_command("setup_queues", "--visibility-timeout", "30", stdout=io.StringIO())
        call_command("setup_celery_queue", stdout=io.StringIO())
    for name in (module_settings.SQS_QUEUE_NAME, module_settings.SQS_DLQ_NAME):
        url = sqs_queues.client.get_queue_url(QueueName=name)["QueueUrl"]
        sqs_queues.client.set_queue_attributes(
            QueueUrl=url, Attributes={"MessageRetentionPeriod": "60"}
        )
    with recorder.acting_as(ProcessRole.SETUP):
        out = io.StringIO()
        call_command("setup_queues", "--visibility-timeout", "30", stdout=out)
        assert [line.split()[0] for line in out.getvalue().splitlines()] == ["changed"] * 2

    for role in ProcessRole:
        made = recorder.calls[role]
        assert made <= declared(role), f"{role} called undeclared: {sorted(made - declared(role))}"
        unused = declared_in_product_code(role) - made
        assert not unused, f"{role} declares calls the scenario never made: {sorted(unused)}"


def test_the_recorder_sees_a_call_the_role_does_not_declare(recorder, sqs_queues):
    """The scenario's check can fail: a web process receiving from the DLQ is caught."""
    with recorder.acting_as(ProcessRole.WEB):
        sqs.sqs_client().receive_message(QueueUrl=sqs.dead_letter_queue_url(), WaitTimeSeconds=0)

    assert recorder.calls[ProcessRole.WEB] - declared(ProcessRole.WEB) == {
        (QueueRole.DEAD_LETTER, "sqs:ReceiveMessage")
    }
