"""A bulk job on real Celery workers over the SQS broker: a worker killed mid-job, and the
task message the broker hands to the next worker finishes the job without acting twice."""

import signal
import subprocess

import pytest
from celery import Celery
from kombu import Connection

from tests.test_celery import ROOT, broker_environment
from tests.triage.bulk_support import dead_letters_bulk_create, job_for
from tests.triage.deadletters import operator
from tests.waiting import wait_for
from triage.models import BulkJobStatus, BulkTriageJob, DeadLetter, DeadLetterStatus, TriageAction

pytestmark = pytest.mark.subprocess

WORKER_ARGS = [
    "worker",
    "--pool=solo",
    "--without-heartbeat",
    "--without-gossip",
    "--without-mingle",
    "--loglevel=INFO",
]


def worker_start(env: dict, queue: str, log) -> subprocess.Popen:
    with open(log, "w") as log_file:
        return subprocess.Popen(
            [str(ROOT / ".venv" / "bin" / "celery"), "-A", "config", *WORKER_ARGS, "-Q", queue],
            cwd=ROOT,
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )


def celery_queue_setup(
    module_settings, local_sqs, *, visibility_timeout: int, name: str = ""
) -> tuple[str, str]:
    """Create a Celery queue on ``local_sqs`` (named ``name``, or a fresh name); returns its
    name and URL."""
    import uuid

    from callbacks import sqs
    from callbacks.celery_queue import celery_queue_ensure

    module_settings.SQS_ENDPOINT_URL = local_sqs.endpoint_url
    module_settings.CELERY_SQS_QUEUE_NAME = name or f"payments-celery-{uuid.uuid4().hex[:10]}"
    sqs.reset()
    return module_settings.CELERY_SQS_QUEUE_NAME, celery_queue_ensure(
        visibility_timeout=visibility_timeout
    )


@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_job_leaves_it_to_the_next_worker_which_acts_once_on_each(
    module_settings, local_sqs, tmp_path
):
    # The queue's own visibility timeout: an unacknowledged task message comes back 5 s after
    # the worker holding it died.
    name, url = celery_queue_setup(module_settings, local_sqs, visibility_timeout=5)
    dead_letters_bulk_create(150)
    job = job_for(DeadLetter.objects.all(), action="resolve", user=operator())
    env = broker_environment(local_sqs, name, url)
    env.update({"TRIAGE_BULK_RATE_PER_SECOND": "30", "CELERY_SQS_VISIBILITY_TIMEOUT": "5"})
    sender = Celery("sender", set_as_current=False)
    transport = {
        "region": "us-east-1",
        "is_secure": False,
        "predefined_queues": {name: {"url": url}},
    }
    with Connection(f"sqs://127.0.0.1:{local_sqs.port}", transport_options=transport) as broker:
        sender.send_task("triage.tasks.bulk_job_run", args=[job.pk], connection=broker, queue=name)

    first_log, second_log = tmp_path / "first.log", tmp_path / "second.log"
    first = worker_start(env, name, first_log)
    try:
        wait_for(
            lambda: BulkTriageJob.objects.get(pk=job.pk).done >= 20,
            60,
            "progress",
            watch=[first],
            logs=[first_log],
        )
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(30)
    at_crash = DeadLetter.objects.filter(status=DeadLetterStatus.RESOLVED).count()
    assert 20 <= at_crash < 150
    assert BulkTriageJob.objects.get(pk=job.pk).status == BulkJobStatus.RUNNING

    env["TRIAGE_BULK_RATE_PER_SECOND"] = "500"
    second = worker_start(env, name, second_log)
    try:
        wait_for(
            lambda: BulkTriageJob.objects.get(pk=job.pk).status == BulkJobStatus.COMPLETED,
            90,
            "completion",
            watch=[second],
            logs=[second_log],
        )
    finally:
        second.terminate()
        second.wait(30)

    job.refresh_from_db()
    assert (job.done, job.failed, job.skipped) == (150, 0, 0)
    assert DeadLetter.objects.filter(status=DeadLetterStatus.RESOLVED).count() == 150
    per_letter = list(
        TriageAction.objects.filter(bulk_job=job).values_list("dead_letter_id", flat=True)
    )
    assert len(per_letter) == len(set(per_letter)) == 150
    assert "triage.tasks.bulk_job_run" in second_log.read_text()
