import io
import json
import socket
import types
import uuid

import boto3
import pytest
from django.core.management import CommandError, call_command

from callbacks import sqs
from callbacks.queues import queues_ensure


@pytest.fixture
def queue_names(local_sqs, module_settings):
    """Unused queue names on the local SQS server; nothing is created."""
    suffix = uuid.uuid4().hex[:12]
    module_settings.SQS_ENDPOINT_URL = local_sqs.endpoint_url
    module_settings.SQS_QUEUE_NAME = f"setup-{suffix}.fifo"
    module_settings.SQS_DLQ_NAME = f"setup-dlq-{suffix}.fifo"
    sqs.reset()
    client = boto3.client("sqs", endpoint_url=local_sqs.endpoint_url, region_name="us-east-1")
    yield types.SimpleNamespace(
        client=client, main=module_settings.SQS_QUEUE_NAME, dlq=module_settings.SQS_DLQ_NAME
    )
    sqs.reset()


def run(*args) -> list[str]:
    out = io.StringIO()
    call_command("setup_queues", *args, stdout=out)
    return out.getvalue().splitlines()


def attributes(client, name: str) -> dict[str, str]:
    url = client.get_queue_url(QueueName=name)["QueueUrl"]
    return client.get_queue_attributes(QueueUrl=url, AttributeNames=["All"])["Attributes"]


def exists(client, name: str) -> bool:
    try:
        client.get_queue_url(QueueName=name)
    except client.exceptions.QueueDoesNotExist:
        return False
    return True


def test_creates_main_queue_and_dead_letter_queue_with_contract_attributes(queue_names):
    lines = run("--visibility-timeout", "45")

    assert lines[0].startswith(f"created queue {queue_names.dlq} ")
    assert lines[1].startswith(f"created queue {queue_names.main} ")
    dlq = attributes(queue_names.client, queue_names.dlq)
    main = attributes(queue_names.client, queue_names.main)
    assert dlq["FifoQueue"] == "true"
    assert dlq["MessageRetentionPeriod"] == str(14 * 24 * 3600)
    assert main["FifoQueue"] == "true"
    assert main["VisibilityTimeout"] == "45"
    assert main["DeduplicationScope"] == "messageGroup"
    assert main["FifoThroughputLimit"] == "perMessageGroupId"
    redrive = json.loads(main["RedrivePolicy"])
    assert redrive["deadLetterTargetArn"] == dlq["QueueArn"]
    assert int(redrive["maxReceiveCount"]) == 10


def test_second_run_verifies_without_changes(queue_names):
    run("--visibility-timeout", "45")
    before = attributes(queue_names.client, queue_names.main)

    lines = run("--visibility-timeout", "45")

    assert [line.split(" (")[0] for line in lines] == [
        f"verified queue {queue_names.dlq}",
        f"verified queue {queue_names.main}",
    ]
    assert attributes(queue_names.client, queue_names.main) == before


def test_drifted_attribute_is_reported_and_fixed(queue_names):
    run("--visibility-timeout", "45")
    url = queue_names.client.get_queue_url(QueueName=queue_names.main)["QueueUrl"]
    queue_names.client.set_queue_attributes(
        QueueUrl=url, Attributes={"VisibilityTimeout": "99", "MessageRetentionPeriod": "60"}
    )

    lines = run("--visibility-timeout", "45")

    assert f"changed queue {queue_names.main}: " in lines[1]
    assert "VisibilityTimeout 99 -> 45" in lines[1]
    assert f"MessageRetentionPeriod 60 -> {14 * 24 * 3600}" in lines[1]
    main = attributes(queue_names.client, queue_names.main)
    assert main["VisibilityTimeout"] == "45"
    assert main["MessageRetentionPeriod"] == str(14 * 24 * 3600)
    assert run("--visibility-timeout", "45")[1].startswith(f"verified queue {queue_names.main}")


# LocalStack, like AWS, accepts the change: only fauxqs refuses it (its run leaves this out).
@pytest.mark.fauxqs_only
def test_change_refused_by_sqs_is_a_command_error_naming_it(queue_names):
    # A queue created elsewhere without high throughput; fauxqs (unlike AWS) refuses to change
    # DeduplicationScope afterwards, which exercises the refusal path.
    queue_names.client.create_queue(QueueName=queue_names.main, Attributes={"FifoQueue": "true"})
    with pytest.raises(CommandError, match="SetQueueAttributes|set_queue_attributes"):
        run("--visibility-timeout", "30")
    assert attributes(queue_names.client, queue_names.main)["DeduplicationScope"] == "queue"


# fauxqs refuses the change (see the test above): only LocalStack's run takes this one.
@pytest.mark.localstack_only
def test_queue_created_without_high_throughput_is_changed_to_it(queue_names):
    queue_names.client.create_queue(QueueName=queue_names.main, Attributes={"FifoQueue": "true"})

    lines = run("--visibility-timeout", "30")

    assert lines[1].startswith(f"changed queue {queue_names.main}")
    now = attributes(queue_names.client, queue_names.main)
    assert (now["DeduplicationScope"], now["FifoThroughputLimit"]) == (
        "messageGroup",
        "perMessageGroupId",
    )
    assert json.loads(now["RedrivePolicy"])["maxReceiveCount"] == 10
    assert run("--visibility-timeout", "30")[1].startswith(f"verified queue {queue_names.main}")


def test_drifted_redrive_policy_is_fixed(queue_names):
    run("--visibility-timeout", "30")
    lines = run("--visibility-timeout", "30", "--max-receive-count", "20")
    assert "RedrivePolicy" in lines[1] and lines[1].startswith("changed")
    redrive = json.loads(attributes(queue_names.client, queue_names.main)["RedrivePolicy"])
    assert int(redrive["maxReceiveCount"]) == 20


def test_dry_run_on_missing_queues_creates_nothing(queue_names):
    lines = run("--visibility-timeout", "30", "--dry-run")
    assert lines[0].startswith(f"would create queue {queue_names.dlq}")
    assert lines[1].startswith(f"would create queue {queue_names.main}")
    assert not exists(queue_names.client, queue_names.dlq)
    assert not exists(queue_names.client, queue_names.main)


def test_dry_run_reports_drift_without_changing_it(queue_names):
    run("--visibility-timeout", "30")
    lines = run("--visibility-timeout", "60", "--dry-run")
    assert lines[1] == f"would change queue {queue_names.main}: VisibilityTimeout 30 -> 60"
    assert attributes(queue_names.client, queue_names.main)["VisibilityTimeout"] == "30"


@pytest.mark.django_db
def test_default_visibility_timeout_comes_from_processor_latency(queue_names):
    from payments.selectors import recommended_visibility_timeout

    lines = run()
    expected = recommended_visibility_timeout()
    assert lines[0] == f"visibility timeout {expected} s (recommended from processor latency)"
    assert attributes(queue_names.client, queue_names.main)["VisibilityTimeout"] == str(expected)


@pytest.mark.parametrize("count", ["6", "1", "1001"])
def test_max_receive_count_not_above_the_worker_limit_is_refused(queue_names, count):
    with pytest.raises(CommandError, match="max receive count"):
        run("--visibility-timeout", "30", "--max-receive-count", count)
    assert not exists(queue_names.client, queue_names.main)


def test_visibility_timeout_above_the_sqs_limit_is_refused(queue_names):
    with pytest.raises(CommandError, match="visibility timeout"):
        run("--visibility-timeout", str(12 * 3600 + 1))


def test_negative_visibility_timeout_is_refused_by_the_argument_parser(queue_names):
    with pytest.raises(CommandError, match="zero or more"):
        run("--visibility-timeout", "-1")


def test_queue_name_without_fifo_suffix_is_refused(queue_names, module_settings):
    module_settings.SQS_QUEUE_NAME = "payments-standard"
    with pytest.raises(CommandError, match="SQS_QUEUE_NAME"):
        run("--visibility-timeout", "30")


def test_unreachable_endpoint_is_a_command_error(queue_names, module_settings):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    module_settings.SQS_ENDPOINT_URL = f"http://127.0.0.1:{port}"
    sqs.reset()
    with pytest.raises(CommandError, match="failed|cannot"):
        run("--visibility-timeout", "30")


def test_service_returns_the_report_lines(queue_names):
    lines = queues_ensure(visibility_timeout=30)
    assert len(lines) == 2
    assert all(line.startswith("created queue") for line in lines)
