"""Each process role's managed policy grants exactly the SQS actions its call sites use
(callbacks/sqs_access.py), each on the queue it uses them on, and nothing else."""

import pytest

from bank.vault.kms import CONTEXT_KEY
from callbacks.sqs_access import ProcessRole, QueueRole, role_permissions
from tests.deploy.template import (
    POLICY_RESOURCES,
    QUEUE_RESOURCES,
    Resolver,
    load_template,
    parameter_values,
    policy_grants,
)

ARN_OF = {f"{resource}.Arn": queue for queue, resource in QUEUE_RESOURCES.items()}


def grants_by_queue(template: dict, role: ProcessRole) -> dict[QueueRole, frozenset[str]]:
    resolver = Resolver(template, parameter_values(template))
    grants = policy_grants(resolver, POLICY_RESOURCES[role])
    unknown = set(grants) - set(ARN_OF)
    assert not unknown, (
        f"{POLICY_RESOURCES[role]} grants on resources other than the queues: {unknown}"
    )
    return {ARN_OF[arn]: frozenset(actions) for arn, actions in grants.items()}


def differences(template: dict, role: ProcessRole) -> tuple[set, set]:
    """(missing, unused): (queue, action) pairs the role calls but is not granted, and granted
    but never called."""
    granted = {(q, a) for q, actions in grants_by_queue(template, role).items() for a in actions}
    needed = {(q, a) for q, actions in role_permissions(role).items() for a in actions}
    return needed - granted, granted - needed


@pytest.mark.parametrize("role", list(ProcessRole))
def test_policy_grants_exactly_what_the_role_calls(role):
    missing, unused = differences(load_template(), role)
    assert not missing, f"{role}: actions called but not granted: {sorted(missing)}"
    assert not unused, f"{role}: actions granted but never called: {sorted(unused)}"


def test_every_process_role_has_a_policy_and_every_policy_a_role():
    template = load_template()
    policies = {
        name
        for name, resource in template["Resources"].items()
        if resource["Type"] == "AWS::IAM::ManagedPolicy"
        and name not in ("QueueKeyPolicy", "VaultKeyPolicy")
    }
    assert policies == set(POLICY_RESOURCES.values())


def test_a_missing_action_is_reported():
    template = load_template()
    statements = template["Resources"]["QueueWorkerPolicy"]["Properties"]["PolicyDocument"][
        "Statement"
    ]
    statements[0]["Action"].remove("sqs:DeleteMessage")
    missing, unused = differences(template, ProcessRole.QUEUE_WORKER)
    assert missing == {(QueueRole.MAIN, "sqs:DeleteMessage")}
    assert not unused


def test_a_granted_but_unused_action_is_reported():
    template = load_template()
    statements = template["Resources"]["WebPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    statements[1]["Action"].append("sqs:ReceiveMessage")  # web never receives from the DLQ
    missing, unused = differences(template, ProcessRole.WEB)
    assert unused == {(QueueRole.DEAD_LETTER, "sqs:ReceiveMessage")}
    assert not missing


def test_a_grant_on_the_wrong_queue_is_reported_both_ways():
    template = load_template()
    statements = template["Resources"]["CeleryPolicy"]["Properties"]["PolicyDocument"]["Statement"]
    dlq = next(s for s in statements if s["Sid"] == "DeadLetterQueue")
    dlq["Resource"] = {"Fn::GetAtt": ["MainQueue", "Arn"]}
    missing, unused = differences(template, ProcessRole.CELERY)
    assert (QueueRole.DEAD_LETTER, "sqs:ReceiveMessage") in missing
    assert (QueueRole.MAIN, "sqs:ReceiveMessage") in unused


def test_kms_policy_allows_only_the_queue_key():
    key = "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab"
    template = load_template()
    resolver = Resolver(template, parameter_values(template, KmsKeyArn=key))
    assert policy_grants(resolver, "QueueKeyPolicy") == {
        key: {"kms:Decrypt", "kms:GenerateDataKey"}
    }


def test_the_vault_policy_allows_only_its_keys_under_the_vaults_encryption_context():
    keys = [
        "arn:aws:kms:us-east-1:123456789012:key/1234abcd-12ab-34cd-56ef-1234567890ab",
        "arn:aws:kms:us-east-1:123456789012:key/5678abcd-12ab-34cd-56ef-1234567890ab",
    ]
    template = load_template()
    resolver = Resolver(template, parameter_values(template, VaultKmsKeyArns=",".join(keys)))

    assert resolver.exists("VaultKeyPolicy")
    assert policy_grants(resolver, "VaultKeyPolicy") == {
        key: {"kms:Encrypt", "kms:Decrypt"} for key in keys
    }
    [statement] = resolver.properties("VaultKeyPolicy")["PolicyDocument"]["Statement"]
    # The context key the code sends, so the two cannot drift apart.
    assert statement["Condition"]["ForAllValues:StringEquals"] == {
        "kms:EncryptionContextKeys": [CONTEXT_KEY]
    }
    assert statement["Condition"]["Null"] == {"kms:EncryptionContextKeys": "false"}


def test_without_vault_keys_there_is_no_vault_policy():
    template = load_template()
    resolver = Resolver(template, parameter_values(template))

    assert not resolver.exists("VaultKeyPolicy")
