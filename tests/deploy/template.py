"""Reading deploy/aws/payments.yaml in tests: load it, and resolve its intrinsic functions for
one set of parameters the way CloudFormation would (Ref, Fn::If, Fn::GetAtt, conditions)."""

from pathlib import Path
from typing import Any

from cfnlint.decode import cfn_yaml

from callbacks.sqs_access import ProcessRole, QueueRole

TEMPLATE_PATH = Path(__file__).resolve().parents[2] / "deploy" / "aws" / "payments.yaml"

QUEUE_RESOURCES: dict[QueueRole, str] = {
    QueueRole.MAIN: "MainQueue",
    QueueRole.DEAD_LETTER: "DeadLetterQueue",
    QueueRole.CELERY_BROKER: "CeleryQueue",
}
POLICY_RESOURCES: dict[ProcessRole, str] = {
    ProcessRole.WEB: "WebPolicy",
    ProcessRole.QUEUE_WORKER: "QueueWorkerPolicy",
    ProcessRole.CELERY: "CeleryPolicy",
    ProcessRole.SETUP: "SetupPolicy",
}

_NO_VALUE = object()


def load_template(path: Path = TEMPLATE_PATH) -> dict:
    return cfn_yaml.loads(path.read_text())


def parameter_values(template: dict, **overrides: str) -> dict[str, str]:
    """Each parameter's default, replaced by ``overrides``; unknown names are an error."""
    values = {name: str(spec.get("Default", "")) for name, spec in template["Parameters"].items()}
    unknown = set(overrides) - set(values)
    assert not unknown, f"not parameters of the template: {sorted(unknown)}"
    values.update(overrides)
    return values


class Resolver:
    """Evaluates a template node for given parameter values. ``Fn::GetAtt`` and a ``Ref`` to a
    resource resolve to ``<resource>.<attribute>`` / ``<resource>`` unless ``physical`` maps
    them to a deployed value."""

    def __init__(self, template: dict, parameters: dict[str, str], physical=None) -> None:
        self.template = template
        self.parameters = parameters
        self.physical = physical or {}

    def condition(self, name: str) -> bool:
        return bool(self.value(self.template["Conditions"][name]))

    def value(self, node: Any) -> Any:
        if isinstance(node, list):
            items = [self.value(item) for item in node]
            return [item for item in items if item is not _NO_VALUE]
        if not isinstance(node, dict):
            return node
        if len(node) == 1:
            ((key, arg),) = node.items()
            if key == "Ref":
                if arg == "AWS::NoValue":
                    return _NO_VALUE
                if arg in self.parameters:
                    return self.parameters[arg]
                return self.physical.get(arg, arg)
            if key == "Fn::GetAtt":
                name = ".".join(arg) if isinstance(arg, list) else arg
                return self.physical.get(name, name)
            if key == "Fn::If":
                condition, when_true, when_false = arg
                return self.value(when_true if self.condition(condition) else when_false)
            if key == "Fn::Equals":
                left, right = (self.value(a) for a in arg)
                return str(left) == str(right)
            if key == "Fn::Split":
                separator, text = arg
                return str(self.value(text)).split(separator)
            if key == "Fn::Not":
                return not self.value(arg[0])
            if key == "Fn::And":
                return all(self.value(a) for a in arg)
            if key == "Condition":
                return self.condition(arg)
            if key == "Fn::Sub":
                text = arg
                for name, value in {**self.parameters, "AWS::StackName": "stack"}.items():
                    text = text.replace("${" + name + "}", value)
                return text
        resolved = {key: self.value(item) for key, item in node.items()}
        return {key: item for key, item in resolved.items() if item is not _NO_VALUE}

    def properties(self, resource: str) -> dict:
        return self.value(self.template["Resources"][resource].get("Properties", {}))

    def exists(self, resource: str) -> bool:
        condition = self.template["Resources"][resource].get("Condition")
        return condition is None or self.condition(condition)


def queue_attributes(resolver: Resolver, resource: str) -> dict[str, str]:
    """A queue resource's properties as the SQS attribute strings CreateQueue would be given."""
    attributes: dict[str, str] = {}
    for key, value in resolver.properties(resource).items():
        if key in ("QueueName", "Tags"):
            continue
        if isinstance(value, bool):
            attributes[key] = "true" if value else "false"
        elif isinstance(value, dict):  # RedrivePolicy
            attributes[key] = value
        else:
            attributes[key] = str(value)
    return attributes


def policy_grants(resolver: Resolver, resource: str) -> dict[str, set[str]]:
    """The actions an IAM managed policy allows, per resource it names (Deny is not expected)."""
    grants: dict[str, set[str]] = {}
    for statement in resolver.properties(resource)["PolicyDocument"]["Statement"]:
        assert statement["Effect"] == "Allow", statement
        actions = statement["Action"]
        targets = statement["Resource"]
        for target in targets if isinstance(targets, list) else [targets]:
            grants.setdefault(target, set()).update(
                actions if isinstance(actions, list) else [actions]
            )
    return grants
