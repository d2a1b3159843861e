"""Which SQS actions each process calls, on which queue: the table least-privilege IAM is built on.

Every place in the product that calls SQS (through the gateway ``callbacks.sqs``, the only module
that holds the boto3 client) is declared here once, with the boto3 operations it uses, the queues
it uses them on and the process roles that run it. The CloudFormation template's IAM policies
(``deploy/aws/payments.yaml``) must grant exactly ``role_permissions(role)``: tests fail on an
action a policy lacks and on one it grants that nothing calls. Other tests keep the table honest:
one reads the code and fails on a call site that is missing here (or declared but gone), others
record the calls each process really makes and fail on one its role does not declare.

IAM authorises a batch call with its single-message action (``SendMessageBatch`` needs
``sqs:SendMessage``), hence ``OPERATION_ACTIONS``.
"""

from dataclasses import dataclass
from enum import StrEnum


class ProcessRole(StrEnum):
    """The IAM role (and managed policy) each kind of process runs under."""

    WEB = "web"  # gunicorn: callback endpoint, payments API, admin, triage, /dependencies, /metrics
    QUEUE_WORKER = "queue_worker"  # run_sqs_worker, run_outbox_relay
    CELERY = "celery"  # celery worker and beat; ingest_dlq, reconcile_payments, evaluate_alerts
    SETUP = "setup"  # setup_queues, setup_celery_queue (deploy time only)


class QueueRole(StrEnum):
    MAIN = "main"  # SQS_QUEUE_NAME, FIFO
    DEAD_LETTER = "dead_letter"  # SQS_DLQ_NAME, FIFO
    CELERY_BROKER = "celery_broker"  # CELERY_SQS_QUEUE_NAME, standard


OPERATION_ACTIONS: dict[str, str] = {
    "send_message": "sqs:SendMessage",
    "send_message_batch": "sqs:SendMessage",
    "receive_message": "sqs:ReceiveMessage",
    "delete_message": "sqs:DeleteMessage",
    "delete_message_batch": "sqs:DeleteMessage",
    "change_message_visibility": "sqs:ChangeMessageVisibility",
    "change_message_visibility_batch": "sqs:ChangeMessageVisibility",
    "get_queue_url": "sqs:GetQueueUrl",
    "get_queue_attributes": "sqs:GetQueueAttributes",
    "create_queue": "sqs:CreateQueue",
    "set_queue_attributes": "sqs:SetQueueAttributes",
}


@dataclass(frozen=True)
class SqsCallSite:
    """One function that calls SQS. ``function`` is ``module:qualname``; ``access`` maps each
    queue to the boto3 operations the function uses on it (gateway calls included)."""

    function: str
    access: dict[QueueRole, frozenset[str]]
    roles: frozenset[ProcessRole]
    # Code outside this project (Celery's SQS transport): declared, but not found by reading
    # the product's code.
    third_party: bool = False

    @property
    def operations(self) -> frozenset[str]:
        return frozenset().union(*self.access.values())


def _ops(*names: str) -> frozenset[str]:
    return frozenset(names)


def _roles(*roles: ProcessRole) -> frozenset[ProcessRole]:
    return frozenset(roles)


MAIN, DLQ, BROKER = QueueRole.MAIN, QueueRole.DEAD_LETTER, QueueRole.CELERY_BROKER
WEB, WORKER, CELERY, SETUP = (
    ProcessRole.WEB,
    ProcessRole.QUEUE_WORKER,
    ProcessRole.CELERY,
    ProcessRole.SETUP,
)
_SEND = _ops("send_message", "get_queue_url")
_SEND_BATCH = _ops("send_message_batch", "get_queue_url")
_READ_ATTRIBUTES = _ops("get_queue_attributes", "get_queue_url")

SQS_CALL_SITES: tuple[SqsCallSite, ...] = (
    # The callback endpoint publishes each accepted event: with the events other requests of
    # the process publish at the same time in one batch call, or alone when that is turned off.
    SqsCallSite("callbacks.apis:_publish", {MAIN: _SEND | _ops("send_message_batch")}, _roles(WEB)),
    # The outbox is published right after commit (web: payment creation; worker: events that
    # create outbox rows), by each worker loop's relay, and by beat's relay task.
    SqsCallSite("callbacks.outbox:_publish", {MAIN: _SEND_BATCH}, _roles(WEB, WORKER, CELERY)),
    # The queue worker.
    SqsCallSite(
        "callbacks.worker.loop:Worker._main_queue_url",
        {MAIN: _ops("get_queue_url")},
        _roles(WORKER),
    ),
    # The messages a worker holds (callbacks.worker.hand): taken, deleted, released, hidden.
    SqsCallSite("callbacks.worker.hand:Hand.take", {MAIN: _ops("receive_message")}, _roles(WORKER)),
    SqsCallSite(
        "callbacks.worker.hand:Hand.delete", {MAIN: _ops("delete_message_batch")}, _roles(WORKER)
    ),
    # Also what the worker's visibility heartbeat calls (callbacks.sqs.VisibilityHeartbeat, part
    # of the gateway, so not a call site of its own).
    SqsCallSite(
        "callbacks.worker.hand:Hand.release",
        {MAIN: _ops("change_message_visibility_batch")},
        _roles(WORKER),
    ),
    SqsCallSite(
        "callbacks.worker.hand:Hand.hide",
        {MAIN: _ops("change_message_visibility")},
        _roles(WORKER),
    ),
    # ... and what it held when the database went away, hidden until it answers again.
    SqsCallSite(
        "callbacks.worker.hand:Hand.hold_back",
        {MAIN: _ops("change_message_visibility_batch")},
        _roles(WORKER),
    ),
    # The worker dead-letters a message itself by sending a copy to the DLQ.
    SqsCallSite("callbacks.services.outcomes:message_dead_letter", {DLQ: _SEND}, _roles(WORKER)),
    # The bank path's collection (nacha_collect, run by cron or beat beside the Celery jobs):
    # each return or NOC to the main queue, one for an unknown trace number to the DLQ.
    SqsCallSite(
        "bank.collect:nacha_events_publish_now",
        {MAIN: _SEND, DLQ: _SEND},
        _roles(CELERY),
    ),
    # Triage: redrive, and the release of a payment's held messages; one by one in the admin,
    # or by a bulk triage job in the Celery worker.
    SqsCallSite(
        "callbacks.services.republish:message_republish", {MAIN: _SEND}, _roles(WEB, CELERY)
    ),
    # ... and the workers' release of the submissions an outage held in the database.
    SqsCallSite(
        "callbacks.services.republish:parked_message_republish",
        {MAIN: _SEND},
        _roles(WEB, CELERY, WORKER),
    ),
    # ... and the worker's move of a processor event behind its payment's submission.
    SqsCallSite("callbacks.services.republish:message_send_behind", {MAIN: _SEND}, _roles(WORKER)),
    # Beat's reconciliation of stuck payments.
    SqsCallSite("callbacks.reconciliation:payment_reconcile", {MAIN: _SEND_BATCH}, _roles(CELERY)),
    # Beat's pull of the processor's events (or processor_events_pull beside the Celery jobs):
    # each page's events to the main queue, an event breaking the contract, or one the main
    # queue cannot take, to the DLQ.
    SqsCallSite("callbacks.events_pull:_page_publish", {MAIN: _SEND_BATCH}, _roles(CELERY)),
    SqsCallSite("callbacks.events_pull:_malformed_dead_letter", {DLQ: _SEND}, _roles(CELERY)),
    SqsCallSite("callbacks.events_pull:_unqueued_dead_letter", {DLQ: _SEND}, _roles(CELERY)),
    # Beat's DLQ ingestion.
    SqsCallSite(
        "triage.ingestion:dead_letters_ingest",
        {DLQ: _ops("receive_message", "get_queue_url")},
        _roles(CELERY),
    ),
    SqsCallSite("triage.ingestion:_dlq_delete", {DLQ: _ops("delete_message")}, _roles(CELERY)),
    # Queue depths: /metrics (web), queue metrics and alert evaluation (beat), the dashboard.
    SqsCallSite(
        "triage.selectors:queue_depths",
        {MAIN: _READ_ATTRIBUTES, DLQ: _READ_ATTRIBUTES},
        _roles(WEB, CELERY),
    ),
    # The main queue's state for /dependencies and payments_dependency_up (never /readyz).
    SqsCallSite("triage.operations.dependencies:_sqs_check", {MAIN: _READ_ATTRIBUTES}, _roles(WEB)),
    # setup_queues.
    SqsCallSite(
        "callbacks.queues:_find",
        {MAIN: _ops("get_queue_url"), DLQ: _ops("get_queue_url")},
        _roles(SETUP),
    ),
    SqsCallSite(
        "callbacks.queues:_ensure",
        {
            MAIN: _ops("create_queue", "get_queue_attributes", "set_queue_attributes"),
            DLQ: _ops("create_queue", "get_queue_attributes", "set_queue_attributes"),
        },
        _roles(SETUP),
    ),
    # The main queue's RedrivePolicy names the dead-letter queue's ARN.
    SqsCallSite(
        "callbacks.queues:queues_ensure", {DLQ: _ops("get_queue_attributes")}, _roles(SETUP)
    ),
    # setup_celery_queue. Celery processes call it too when CELERY_SQS_QUEUE_URL is unset; in
    # production it is set (the template outputs it), so they never need sqs:CreateQueue.
    SqsCallSite(
        "callbacks.celery_queue:celery_queue_ensure", {BROKER: _ops("create_queue")}, _roles(SETUP)
    ),
    # Celery's SQS transport (kombu) with the queue's URL given in ``predefined_queues``: it
    # sends (beat, tasks), receives, deletes, changes visibility (retries, shutdown) and reads
    # RedrivePolicy before dropping a rejected message. It never lists or creates queues then.
    SqsCallSite(
        "kombu.transport.SQS:Channel",
        {
            BROKER: _ops(
                "send_message",
                "receive_message",
                "delete_message",
                "change_message_visibility",
                "get_queue_attributes",
            )
        },
        _roles(CELERY),
        third_party=True,
    ),
)


def role_permissions(role: ProcessRole) -> dict[QueueRole, frozenset[str]]:
    """The IAM actions ``role`` needs, per queue: exactly what its call sites use."""
    permissions: dict[QueueRole, set[str]] = {}
    for site in SQS_CALL_SITES:
        if role not in site.roles:
            continue
        for queue, operations in site.access.items():
            permissions.setdefault(queue, set()).update(OPERATION_ACTIONS[op] for op in operations)
    return {queue: frozenset(actions) for queue, actions in permissions.items()}
