import pytest
from django.db import connection
from django.utils import timezone

from tests.factories import UserFactory
from tests.model.clock import SimClock
from tests.model.machine import World
from tests.model.queue import SimSqs

QUEUE = "payments-model.fifo"
DLQ = "payments-model-dlq.fifo"


@pytest.fixture
def model_world(transactional_db, module_settings, monkeypatch):
    """The simulated world a model run drives the real code in: the clock behind
    ``timezone.now``, the SQS client behind the gateway, the simulated processor as the backend,
    an operator with every right."""
    from callbacks import sqs
    from payments.processor.backend import reset_backend

    clock = SimClock()
    fake = SimSqs(clock, main=QUEUE, dlq=DLQ)
    module_settings.SQS_QUEUE_NAME = QUEUE
    module_settings.SQS_DLQ_NAME = DLQ
    module_settings.SQS_ENDPOINT_URL = "https://sim.sqs"
    module_settings.PROCESSOR_BACKEND = "tests.model.processor.ModelProcessorBackend"
    module_settings.WORKER_VISIBILITY_HEARTBEAT = False
    module_settings.WORKER_RECEIVE_LINGER_SECONDS = 0
    # The breaker counts in the database's real time, which the simulated clock cannot move: it
    # never opens here (its own tests open it), so a step does the same on every replay. A 429
    # still pauses every caller, for a millisecond, and its submissions are parked and released.
    module_settings.PROCESSOR_BREAKER_FAILURES = 1000
    module_settings.PROCESSOR_BREAKER_WINDOW_CALLS = 10_000
    # For the same reason retries wait no backoff: a submission parked while the processor is
    # degraded for everyone is released after its backoff on the database's clock. A message
    # the worker did not delete (its crash before the delete) still comes back only when the
    # simulated clock passes its visibility timeout.
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0
    sqs.reset()
    reset_backend()
    with connection.cursor() as cursor:
        # Thousands of short transactions a run: not waiting for each commit's flush to disk
        # changes no visibility or lock (a crash of the server is no part of the model).
        cursor.execute("SET synchronous_commit TO off")
    monkeypatch.setattr(sqs, "sqs_client", lambda: fake)
    monkeypatch.setattr(timezone, "now", clock.now)
    World.clock = clock
    World.sqs = fake
    World.operator = UserFactory(is_superuser=True, is_staff=True)
    yield World
    sqs.reset()
    reset_backend()
