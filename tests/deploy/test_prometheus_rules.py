"""The shipped Prometheus alert rules (deploy/prometheus/): valid for promtool, passing their unit
tests, and reading only metrics the module's ``/metrics`` serves.

promtool comes from Debian's prometheus package (``scripts/ensure-promtool``, run by ``make
test``). A rule on a metric nobody exports never fires, and promtool cannot know that; the last
tests scrape ``/metrics`` for it.
"""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

RULES_DIR = Path(__file__).resolve().parents[2] / "deploy" / "prometheus"
RULES = RULES_DIR / "payments-rules.yml"
RULE_TESTS = RULES_DIR / "payments-rules.test.yml"
METRIC_NAME = re.compile(r"\bpayments_[a-z_]+")

# What the rules read, spelled out so a rule on a new (or renamed) metric is a deliberate change
# here too.
RULE_METRICS = {
    "payments_queue_messages",
    "payments_dead_letters_open",
    "payments_oldest_unfinished_message_age_seconds",
    "payments_ops_scrape_error",
    "payments_processor_breaker_open_seconds",
    "payments_merchant_return_rate_ratio",
    "payments_return_rate_threshold_ratio",
    "payments_beat_heartbeat_timestamp_seconds",
    "payments_merchants_return_rate_over_level",
    "payments_dependency_up",
    "payments_processor_events_pull_success_timestamp_seconds",
    "payments_books_days_not_closed",
    "payments_books_oldest_open_variance_banking_days",
    "payments_books_variance_alert_banking_days",
    "payments_books_oldest_unmatched_entry_age_seconds",
}


def promtool(*args: str) -> subprocess.CompletedProcess:
    if shutil.which("promtool") is None:
        pytest.fail("promtool is missing: run scripts/ensure-promtool (Debian's prometheus)")
    return subprocess.run(
        ["promtool", *args], capture_output=True, text=True, timeout=120, check=False
    )


def assert_succeeds(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, f"{result.args} failed:\n{result.stdout}\n{result.stderr}"


def rule_expressions() -> dict[str, str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {rule["alert"]: rule["expr"] for group in groups for rule in group["rules"]}


def exported_metric_names(client) -> set[str]:
    """Every series name ``/metrics`` can serve: each family's name as its ``# TYPE`` line gives
    it, with a histogram's ``_bucket``, ``_sum`` and ``_count``."""
    # The counters and histograms are defined where they are incremented (the worker's modules);
    # a web process serves them (from the multiprocess files) whichever it imported.
    import callbacks.metrics  # noqa: F401
    import payments.metrics  # noqa: F401

    response = client.get("/metrics")
    assert response.status_code == 200
    names = set()
    for name, kind in re.findall(r"^# TYPE (\S+) (\S+)$", response.content.decode(), re.M):
        names.add(name)
        if kind in ("histogram", "summary"):
            names.update(f"{name}{suffix}" for suffix in ("_bucket", "_sum", "_count"))
    return names


def test_promtool_checks_the_rules():
    assert_succeeds(promtool("check", "rules", str(RULES)))


def test_the_rules_pass_their_unit_tests():
    assert_succeeds(promtool("test", "rules", str(RULE_TESTS)))


def test_the_unit_tests_catch_a_changed_rule(tmp_path):
    """The test above can fail: beat's heartbeat alert moved from 300 to 3000 seconds."""
    changed = RULES.read_text().replace(
        "payments_beat_heartbeat_timestamp_seconds) > 300",
        "payments_beat_heartbeat_timestamp_seconds) > 3000",
    )
    assert changed != RULES.read_text()
    (tmp_path / RULES.name).write_text(changed)
    (tmp_path / RULE_TESTS.name).write_text(RULE_TESTS.read_text())

    result = promtool("test", "rules", str(tmp_path / RULE_TESTS.name))

    assert result.returncode != 0
    assert "PaymentsBeatHeartbeatStale" in result.stdout + result.stderr


def test_every_rule_has_a_unit_test():
    tested = {
        case["alertname"]
        for test in yaml.safe_load(RULE_TESTS.read_text())["tests"]
        for case in test["alert_rule_test"]
    }
    assert tested == set(rule_expressions())


def test_every_rule_has_a_severity_of_the_apps_and_a_runbook_section_of_the_docs():
    from markdown.extensions.toc import slugify

    from triage.models import AlertSeverity

    root = RULES_DIR.parents[1]
    for group in yaml.safe_load(RULES.read_text())["groups"]:
        for rule in group["rules"]:
            assert rule["labels"]["severity"] in AlertSeverity.values, rule["alert"]
            page, anchor = rule["annotations"]["runbook"].split("#")
            assert page.startswith("docs/") and (root / page).is_file(), rule["alert"]
            # The anchors MkDocs gives the page's headings (the toc extension's slugify).
            headings = {
                slugify(line.lstrip("#").strip(), "-")
                for line in (root / page).read_text().splitlines()
                if line.startswith("#")
            }
            assert anchor in headings, (rule["alert"], page, anchor)


def test_the_rules_read_the_metrics_listed_here():
    used = {name for expr in rule_expressions().values() for name in METRIC_NAME.findall(expr)}
    assert used == RULE_METRICS


@pytest.mark.django_db
def test_every_metric_the_rules_read_is_one_the_module_exports(client, sqs_queues):
    assert RULE_METRICS - exported_metric_names(client) == set()
