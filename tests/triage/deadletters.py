"""Helpers for the triage tests: real messages through the real worker and the local SQS."""

import io
import json

from django.core.management import call_command

from callbacks import sqs
from callbacks.schema import processor_event_message
from tests.factories import processor_event


def worker_run() -> str:
    out = io.StringIO()
    call_command(
        "run_sqs_worker",
        until_empty=True,
        wait_time=0,
        visibility_timeout=30,
        relay=False,
        stdout=out,
        stderr=out,
    )
    return out.getvalue()


def event_publish(payment, event_type: str, **overrides):
    """Publish a processor event for ``payment`` on the main queue, as the endpoint does."""
    event = processor_event(payment, event_type, **overrides)
    message_id = sqs.send_message_now(
        body=processor_event_message(event),
        group_id=str(payment.id),
        deduplication_id=event.processor_event_id,
    )
    return event, message_id


def dlq_drain(queues) -> list[dict]:
    """Receive (and delete) whatever is left in the DLQ."""
    found = []
    while True:
        response = queues.client.receive_message(
            QueueUrl=queues.dlq_url, MaxNumberOfMessages=10, WaitTimeSeconds=0
        )
        messages = response.get("Messages") or []
        if not messages:
            return found
        for message in messages:
            found.append(json.loads(message["Body"]))
            queues.client.delete_message(
                QueueUrl=queues.dlq_url, ReceiptHandle=message["ReceiptHandle"]
            )


def dlq_depth(queues) -> int:
    attributes = queues.client.get_queue_attributes(
        QueueUrl=queues.dlq_url,
        AttributeNames=["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
    )["Attributes"]
    return int(attributes["ApproximateNumberOfMessages"]) + int(
        attributes["ApproximateNumberOfMessagesNotVisible"]
    )


def user_with(*codenames: str, **fields):
    """A staff user holding exactly these triage permissions (codenames of the triage app)."""
    from django.contrib.auth.models import Permission

    from tests.factories import UserFactory

    user = UserFactory(is_staff=True, **fields)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="triage", codename__in=codenames)
    )
    return type(user).objects.get(pk=user.pk)  # fresh: no stale permission cache


def operator(**fields):
    return user_with("view_deadletter", "act_on_deadletter", "view_triageaction", **fields)


def viewer(**fields):
    return user_with("view_deadletter", "view_triageaction", **fields)
