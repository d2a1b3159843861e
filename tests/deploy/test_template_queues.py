"""The template's queues have exactly the attributes the product's queue definitions give
(callbacks/queues.py, which setup_queues and the Celery app apply), for the same parameters."""

import json

import pytest

from callbacks.queues import (
    MAX_RECEIVE_COUNT_DEFAULT,
    VISIBILITY_TIMEOUT_FALLBACK,
    broker_queue_attributes,
    dead_letter_queue_attributes,
    main_queue_attributes,
)
from tests.deploy.template import Resolver, load_template, parameter_values, queue_attributes

DLQ_ARN = "DeadLetterQueue.Arn"  # what the resolver gives for !GetAtt DeadLetterQueue.Arn


def comparable(attributes: dict) -> dict:
    """RedrivePolicy compared as data: JSON spacing and key order carry no meaning."""
    out = dict(attributes)
    if isinstance(out.get("RedrivePolicy"), str):
        out["RedrivePolicy"] = json.loads(out["RedrivePolicy"])
    return out


def resolver(**parameters: str) -> Resolver:
    template = load_template()
    return Resolver(template, parameter_values(template, **parameters))


@pytest.mark.parametrize("visibility_timeout", [None, "45", "43200"])
def test_main_queue_matches_the_queue_definition(visibility_timeout):
    overrides = {} if visibility_timeout is None else {"VisibilityTimeout": visibility_timeout}
    expected = main_queue_attributes(
        visibility_timeout=int(visibility_timeout or VISIBILITY_TIMEOUT_FALLBACK),
        max_receive_count=MAX_RECEIVE_COUNT_DEFAULT,
        dead_letter_arn=DLQ_ARN,
    )
    assert comparable(queue_attributes(resolver(**overrides), "MainQueue")) == comparable(expected)


def test_dead_letter_queue_matches_the_queue_definition():
    assert queue_attributes(resolver(), "DeadLetterQueue") == dead_letter_queue_attributes()


@pytest.mark.parametrize("visibility_timeout", ["300", "900"])
def test_celery_queue_matches_the_broker_queue_definition(visibility_timeout):
    attributes = queue_attributes(
        resolver(CeleryVisibilityTimeout=visibility_timeout), "CeleryQueue"
    )
    assert attributes == broker_queue_attributes(visibility_timeout=int(visibility_timeout))


def test_default_parameters_are_the_product_defaults():
    # The settings' documented defaults (docs/reference/settings.md): a stack deployed without
    # parameters serves processes started without queue settings.
    values = parameter_values(load_template())
    assert values["MainQueueName"] == "payments.fifo"
    assert values["DeadLetterQueueName"] == "payments-dlq.fifo"
    assert values["CeleryQueueName"] == "payments-celery"
    assert values["VisibilityTimeout"] == str(VISIBILITY_TIMEOUT_FALLBACK)
    assert values["CeleryVisibilityTimeout"] == "300"


def test_kms_key_replaces_sse_sqs_on_every_queue():
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    resolved = resolver(KmsKeyArn=key)
    for queue in ("MainQueue", "DeadLetterQueue", "CeleryQueue"):
        attributes = queue_attributes(resolved, queue)
        assert attributes["KmsMasterKeyId"] == key
        assert "SqsManagedSseEnabled" not in attributes
    assert resolved.exists("QueueKeyPolicy")
    assert not resolver().exists("QueueKeyPolicy")


def test_every_queue_refuses_requests_not_made_over_tls():
    resolved = resolver()
    policy = resolved.properties("QueuesTlsOnlyPolicy")
    assert sorted(policy["Queues"]) == ["CeleryQueue", "DeadLetterQueue", "MainQueue"]
    (statement,) = policy["PolicyDocument"]["Statement"]
    assert statement["Effect"] == "Deny"
    assert statement["Principal"] == "*"
    assert statement["Action"] == "sqs:*"
    assert sorted(statement["Resource"]) == [
        "CeleryQueue.Arn",
        "DeadLetterQueue.Arn",
        "MainQueue.Arn",
    ]
    assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_alarms_watch_the_dead_letter_queue_and_the_oldest_message_and_notify_the_topic():
    resolved = resolver(DeadLetterAlarmThreshold="0", OldestMessageAgeThreshold="900")
    dead = resolved.properties("DeadLetterAlarm")
    oldest = resolved.properties("OldestMessageAlarm")
    assert (dead["MetricName"], dead["Dimensions"][0]["Value"]) == (
        "ApproximateNumberOfMessagesVisible",
        "DeadLetterQueue.QueueName",
    )
    assert (dead["ComparisonOperator"], dead["Threshold"]) == ("GreaterThanThreshold", "0")
    assert dead["AlarmDescription"].startswith("Severity HIGH")
    assert (oldest["MetricName"], oldest["Dimensions"][0]["Value"]) == (
        "ApproximateAgeOfOldestMessage",
        "MainQueue.QueueName",
    )
    assert (oldest["ComparisonOperator"], oldest["Threshold"]) == ("GreaterThanThreshold", "900")
    assert oldest["AlarmDescription"].startswith("Severity LOW")
    assert "settlement window" in oldest["AlarmDescription"]
    for alarm in (dead, oldest):
        assert alarm["AlarmActions"] == ["AlarmTopic"] == alarm["OKActions"]

    topic = "arn:aws:sns:us-east-1:123456789012:ops"
    given = resolver(AlarmTopicArn=topic)
    assert given.properties("DeadLetterAlarm")["AlarmActions"] == [topic]
    assert not given.exists("AlarmTopic")


def test_a_drifted_template_is_detected():
    """The comparison above is not vacuous: a template whose retention differs fails it."""
    template = load_template()
    template["Resources"]["DeadLetterQueue"]["Properties"]["MessageRetentionPeriod"] = 345600
    drifted = Resolver(template, parameter_values(template))
    assert queue_attributes(drifted, "DeadLetterQueue") != dead_letter_queue_attributes()
