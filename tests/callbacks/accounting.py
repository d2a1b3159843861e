"""Whether every callback answered 202 is accounted for once the worker has drained the queue."""

from django.db.models import Q

from callbacks.models import ProcessingError, QueueMessage, QueueMessageStatus
from payments.models import PaymentEvent


def unaccounted(processor_event_ids: list[str]) -> list[str]:
    """The accepted event ids that left no finished trace: applied, stale or duplicate (done),
    parked behind a hold, or dead-lettered with an error row a person sees."""
    missing = []
    for event_id in dict.fromkeys(processor_event_ids):
        # A processor event applied cleanly keeps no body on its record: the payment's event
        # log names the message that carried it (caused_by "sqs:<message id>").
        carried_by = [
            caused_by.removeprefix("sqs:")
            for caused_by in PaymentEvent.objects.filter(
                processor_event_id=event_id, caused_by__startswith="sqs:"
            ).values_list("caused_by", flat=True)
        ]
        records = list(
            QueueMessage.objects.filter(
                Q(body__event__processor_event_id=event_id)
                | Q(raw_body__contains=event_id)
                | Q(message_id__in=carried_by)
            )
        )
        finished = [
            r
            for r in records
            if r.status in (QueueMessageStatus.DONE, QueueMessageStatus.PARKED)
            or (
                r.status == QueueMessageStatus.DEAD_LETTERED
                and ProcessingError.objects.filter(message_id=r.message_id).exists()
            )
        ]
        if not finished:
            missing.append(f"{event_id}: {[(r.message_id, r.status) for r in records]}")
    return missing
