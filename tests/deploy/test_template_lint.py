"""cfn-lint, AWS's CloudFormation linter, passes on the template: no error, warning or note."""

from pathlib import Path

from cfnlint.api import lint_file

from tests.deploy.template import TEMPLATE_PATH


def lint(path: Path) -> list[str]:
    return [f"{m.rule.id} {m.message} (line {m.linenumber})" for m in lint_file(path)]


def test_template_passes_cfn_lint():
    assert lint(TEMPLATE_PATH) == []


def test_cfn_lint_reports_a_broken_template(tmp_path):
    """The check above can fail: a misspelt property and an unknown resource type are found."""
    broken = tmp_path / "payments.yaml"
    broken.write_text(
        TEMPLATE_PATH.read_text()
        .replace("FifoThroughputLimit:", "FifoThroughputLimits:", 1)
        .replace("Type: AWS::CloudWatch::Alarm", "Type: AWS::CloudWatch::Alarms", 1)
    )
    rules = {finding.split()[0] for finding in lint(broken)}
    assert {"E3002", "E3006"} <= rules
