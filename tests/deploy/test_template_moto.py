"""The template deploys (moto's in-process CloudFormation), and what it creates is what the
product creates: queue attributes read back through the SQS API equal those of the queues
``setup_queues`` and ``setup_celery_queue`` create, and ``setup_queues`` run against the stack's
queues finds nothing to change. moto serves only this static check; the pipeline tests run on
the local SQS server."""

import json

import boto3
import pytest
from moto import mock_aws

from callbacks import sqs
from callbacks.celery_queue import celery_queue_ensure
from callbacks.queues import queues_ensure
from callbacks.sqs_access import ProcessRole, QueueRole, role_permissions
from tests.deploy.template import (
    POLICY_RESOURCES,
    QUEUE_RESOURCES,
    TEMPLATE_PATH,
    Resolver,
    load_template,
    parameter_values,
)

# moto notes each resource type its CloudFormation skips; the skipped ones are asserted below.
pytestmark = pytest.mark.filterwarnings("ignore:Tried to parse AWS:UserWarning")

REGION = "us-east-1"
STACK = "payments"
PARAMETERS = {
    "MainQueueName": "stack-payments.fifo",
    "DeadLetterQueueName": "stack-payments-dlq.fifo",
    "CeleryQueueName": "stack-payments-celery",
    "VisibilityTimeout": "45",
    "CeleryVisibilityTimeout": "300",
    "OldestMessageAgeThreshold": "900",
}
# Attributes that name or date a queue, or count its messages: never part of its definition.
VOLATILE = {"QueueArn", "CreatedTimestamp", "LastModifiedTimestamp"}
# moto's CloudFormation skips these types (it says so); the test applies them through their
# own APIs instead, so they are still checked against a real API's parameter validation.
NOT_DEPLOYED_BY_MOTO = {"AWS::SQS::QueuePolicy", "AWS::CloudWatch::Alarm"}


@pytest.fixture
def aws(monkeypatch, module_settings):
    for name, value in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_SESSION_TOKEN": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(name, value)
    module_settings.SQS_ENDPOINT_URL = None  # boto3's AWS endpoint, which moto intercepts
    module_settings.AWS_REGION = REGION
    sqs.reset()
    with mock_aws():
        yield
    sqs.reset()


@pytest.fixture
def stack(aws):
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    cloudformation.create_stack(
        StackName=STACK,
        TemplateBody=TEMPLATE_PATH.read_text(),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in PARAMETERS.items()],
    )
    (description,) = cloudformation.describe_stacks(StackName=STACK)["Stacks"]
    assert description["StackStatus"] == "CREATE_COMPLETE"
    outputs = {o["OutputKey"]: o["OutputValue"] for o in description["Outputs"]}
    resources = cloudformation.list_stack_resources(StackName=STACK)["StackResourceSummaries"]
    return outputs, resources


def attributes(url: str) -> dict[str, str]:
    found = boto3.client("sqs", region_name=REGION).get_queue_attributes(
        QueueUrl=url, AttributeNames=["All"]
    )["Attributes"]
    return {k: v for k, v in found.items() if k not in VOLATILE and "Approximate" not in k}


def definition(url: str) -> dict:
    """A queue's attributes with its RedrivePolicy's target checked to be a queue's ARN and
    replaced by that queue's name, so queues of two sets compare by role."""
    found = attributes(url)
    if "RedrivePolicy" in found:
        policy = json.loads(found["RedrivePolicy"])
        target = policy.pop("deadLetterTargetArn")
        assert target.startswith(f"arn:aws:sqs:{REGION}:")
        policy["target"] = "dead-letter queue of the set"
        found["RedrivePolicy"] = policy
    return found


def setup_queues_in(module_settings, *, prefix: str) -> dict[QueueRole, str]:
    """Create a set of queues the product's way, under other names; return their URLs."""
    module_settings.SQS_QUEUE_NAME = f"{prefix}-payments.fifo"
    module_settings.SQS_DLQ_NAME = f"{prefix}-payments-dlq.fifo"
    module_settings.CELERY_SQS_QUEUE_NAME = f"{prefix}-payments-celery"
    sqs.reset()
    lines = queues_ensure(visibility_timeout=int(PARAMETERS["VisibilityTimeout"]))
    assert [line.split()[0] for line in lines] == ["created", "created"]
    broker = celery_queue_ensure(visibility_timeout=int(PARAMETERS["CeleryVisibilityTimeout"]))
    client = boto3.client("sqs", region_name=REGION)
    return {
        QueueRole.MAIN: client.get_queue_url(QueueName=module_settings.SQS_QUEUE_NAME)["QueueUrl"],
        QueueRole.DEAD_LETTER: client.get_queue_url(QueueName=module_settings.SQS_DLQ_NAME)[
            "QueueUrl"
        ],
        QueueRole.CELERY_BROKER: broker,
    }


def stack_queue_urls(outputs) -> dict[QueueRole, str]:
    return {queue: outputs[f"{resource}Url"] for queue, resource in QUEUE_RESOURCES.items()}


def test_stack_queues_have_the_attributes_setup_queues_gives(stack, module_settings):
    outputs, _ = stack
    deployed = stack_queue_urls(outputs)
    created = setup_queues_in(module_settings, prefix="setup")

    for queue in QueueRole:
        assert definition(deployed[queue]) == definition(created[queue]), queue
    main = json.loads(attributes(deployed[QueueRole.MAIN])["RedrivePolicy"])
    assert main["deadLetterTargetArn"] == outputs["DeadLetterQueueArn"]
    assert attributes(deployed[QueueRole.MAIN])["VisibilityTimeout"] == "45"
    assert attributes(deployed[QueueRole.DEAD_LETTER])["MessageRetentionPeriod"] == "1209600"
    assert attributes(deployed[QueueRole.MAIN])["SqsManagedSseEnabled"] == "true"


def test_setup_queues_on_the_stacks_queues_finds_nothing_to_change(stack, module_settings):
    module_settings.SQS_QUEUE_NAME = PARAMETERS["MainQueueName"]
    module_settings.SQS_DLQ_NAME = PARAMETERS["DeadLetterQueueName"]
    sqs.reset()

    lines = queues_ensure(visibility_timeout=int(PARAMETERS["VisibilityTimeout"]), dry_run=True)

    assert [line.split(" (")[0] for line in lines] == [
        f"verified queue {PARAMETERS['DeadLetterQueueName']}",
        f"verified queue {PARAMETERS['MainQueueName']}",
    ]


def test_setup_queues_restores_encryption_turned_off_on_the_stacks_queue(stack, module_settings):
    outputs, _ = stack
    client = boto3.client("sqs", region_name=REGION)
    client.set_queue_attributes(
        QueueUrl=outputs["MainQueueUrl"], Attributes={"SqsManagedSseEnabled": "false"}
    )
    module_settings.SQS_QUEUE_NAME = PARAMETERS["MainQueueName"]
    module_settings.SQS_DLQ_NAME = PARAMETERS["DeadLetterQueueName"]
    sqs.reset()

    lines = queues_ensure(visibility_timeout=int(PARAMETERS["VisibilityTimeout"]))

    assert lines[1] == (
        f"changed queue {PARAMETERS['MainQueueName']}: SqsManagedSseEnabled false -> true"
    )
    assert attributes(outputs["MainQueueUrl"])["SqsManagedSseEnabled"] == "true"


def test_setup_queues_accepts_the_stacks_kms_encrypted_queues(aws, module_settings):
    key = boto3.client("kms", region_name=REGION).create_key()["KeyMetadata"]["Arn"]
    cloudformation = boto3.client("cloudformation", region_name=REGION)
    parameters = {**PARAMETERS, "KmsKeyArn": key}
    cloudformation.create_stack(
        StackName=STACK,
        TemplateBody=TEMPLATE_PATH.read_text(),
        Parameters=[{"ParameterKey": k, "ParameterValue": v} for k, v in parameters.items()],
    )
    outputs = {
        o["OutputKey"]: o["OutputValue"]
        for o in cloudformation.describe_stacks(StackName=STACK)["Stacks"][0]["Outputs"]
    }
    assert attributes(outputs["MainQueueUrl"])["KmsMasterKeyId"] == key
    assert "QueueKeyPolicyArn" in outputs
    # AWS reports a KMS-encrypted queue with SqsManagedSseEnabled=false; moto keeps its default.
    client = boto3.client("sqs", region_name=REGION)
    for url in (outputs["MainQueueUrl"], outputs["DeadLetterQueueUrl"]):
        client.set_queue_attributes(QueueUrl=url, Attributes={"SqsManagedSseEnabled": "false"})
    module_settings.SQS_QUEUE_NAME = PARAMETERS["MainQueueName"]
    module_settings.SQS_DLQ_NAME = PARAMETERS["DeadLetterQueueName"]
    sqs.reset()

    lines = queues_ensure(visibility_timeout=int(PARAMETERS["VisibilityTimeout"]), dry_run=True)

    assert [line.split()[0] for line in lines] == ["verified", "verified"]


def test_deployed_policies_grant_exactly_each_roles_actions(stack):
    outputs, _ = stack
    iam = boto3.client("iam", region_name=REGION)
    queue_of_arn = {outputs[f"{resource}Arn"]: queue for queue, resource in QUEUE_RESOURCES.items()}
    for role in ProcessRole:
        arn = outputs[f"{POLICY_RESOURCES[role]}Arn"]
        version = iam.get_policy(PolicyArn=arn)["Policy"]["DefaultVersionId"]
        document = iam.get_policy_version(PolicyArn=arn, VersionId=version)["PolicyVersion"][
            "Document"
        ]
        if isinstance(document, str):
            document = json.loads(document)
        granted: dict[QueueRole, set[str]] = {}
        for statement in document["Statement"]:
            assert statement["Effect"] == "Allow"
            targets = statement["Resource"]
            for target in targets if isinstance(targets, list) else [targets]:
                granted.setdefault(queue_of_arn[target], set()).update(statement["Action"])
        assert granted == role_permissions(role), role


def test_moto_skips_only_the_alarms_and_the_queue_policy(stack):
    """If a later moto deploys these too, this fails: then read them back from the stack."""
    template = load_template()
    _, resources = stack
    deployed = {r["LogicalResourceId"] for r in resources if r["LogicalResourceId"]}
    resolver = Resolver(template, parameter_values(template, **PARAMETERS))
    expected = {name for name in template["Resources"] if resolver.exists(name)}
    skipped = {template["Resources"][name]["Type"] for name in expected - deployed}
    assert skipped == NOT_DEPLOYED_BY_MOTO


def test_alarms_and_queue_policy_are_accepted_by_their_apis(stack):
    outputs, _ = stack
    template = load_template()
    client = boto3.client("sqs", region_name=REGION)
    physical = {"AlarmTopic": outputs["AlarmTopic"]}
    for resource in QUEUE_RESOURCES.values():
        url = outputs[f"{resource}Url"]
        physical[resource] = url
        physical[f"{resource}.Arn"] = outputs[f"{resource}Arn"]
        physical[f"{resource}.QueueName"] = url.rsplit("/", 1)[1]
    resolver = Resolver(template, parameter_values(template, **PARAMETERS), physical)

    cloudwatch = boto3.client("cloudwatch", region_name=REGION)
    for name in ("DeadLetterAlarm", "OldestMessageAlarm"):
        alarm = resolver.properties(name)
        alarm["Threshold"] = float(alarm["Threshold"])
        cloudwatch.put_metric_alarm(**alarm)
    alarms = {a["AlarmName"]: a for a in cloudwatch.describe_alarms()["MetricAlarms"]}
    dead = alarms["stack-dead-letters"]
    assert dead["Dimensions"] == [{"Name": "QueueName", "Value": PARAMETERS["DeadLetterQueueName"]}]
    assert dead["Threshold"] == 0.0 and dead["AlarmActions"] == [outputs["AlarmTopic"]]
    oldest = alarms["stack-oldest-message-age"]
    assert oldest["MetricName"] == "ApproximateAgeOfOldestMessage"
    assert oldest["Threshold"] == 900.0

    policy = resolver.properties("QueuesTlsOnlyPolicy")
    document = json.dumps(policy["PolicyDocument"])
    for url in policy["Queues"]:
        client.set_queue_attributes(QueueUrl=url, Attributes={"Policy": document})
        stored = json.loads(
            client.get_queue_attributes(QueueUrl=url, AttributeNames=["Policy"])["Attributes"][
                "Policy"
            ]
        )
        (statement,) = stored["Statement"]
        assert statement["Effect"] == "Deny"
        assert statement["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}
        assert set(statement["Resource"]) == {outputs[f"{r}Arn"] for r in QUEUE_RESOURCES.values()}
