"""The shipped Grafana dashboard (deploy/grafana/payments-dashboard.json): JSON Grafana imports,
with PromQL promtool parses, over metrics the module's ``/metrics`` serves."""

import json
from pathlib import Path

import pytest
import yaml

from tests.deploy.test_prometheus_rules import (
    METRIC_NAME,
    assert_succeeds,
    exported_metric_names,
    promtool,
)

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "payments-dashboard.json"
# The figures it shows, one metric each.
DASHBOARD_METRICS = {
    "payments_queue_messages",
    "payments_oldest_unfinished_message_age_seconds",
    "payments_dead_letters_open",
    "payments_processor_breaker_state",
    "payments_processor_breaker_open_seconds",
    "payments_worker_messages_total",
    "payments_enqueue_to_applied_seconds_bucket",
    "payments_merchant_return_rate_ratio",
    "payments_return_rate_threshold_ratio",
    "payments_beat_heartbeat_timestamp_seconds",
    "payments_ops_scrape_error",
    "payments_dependency_up",
    "payments_celery_tasks_total",
    "payments_processor_events_pull_success_timestamp_seconds",
    "payments_books_oldest_unmatched_entry_age_seconds",
    "payments_books_oldest_unmatched_line_age_seconds",
    "payments_processor_events_pulled_total",
    "payments_dedup_hits_total",
    "payments_books_open_variances",
    "payments_books_days_not_closed",
    "payments_money_out_total",
    "payments_double_losses_total",
}


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def expressions() -> list[str]:
    return [target["expr"] for panel in dashboard()["panels"] for target in panel["targets"]]


def test_the_dashboard_is_a_grafana_dashboard_over_a_chosen_prometheus():
    board = dashboard()
    assert board["uid"] and board["title"] and board["panels"]
    [variable] = board["templating"]["list"]
    assert (variable["type"], variable["query"]) == ("datasource", "prometheus")
    ids = [panel["id"] for panel in board["panels"]]
    assert len(ids) == len(set(ids))
    for panel in board["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert panel["targets"], panel["title"]


def test_every_dashboard_expression_is_promql_promtool_parses(tmp_path):
    # As recording rules, with Grafana's own interval variable given a value.
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:expr{i}", "expr": expr.replace("$__rate_interval", "5m")}
                    for i, expr in enumerate(expressions())
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-rules.yml"
    path.write_text(yaml.safe_dump(rules))

    assert_succeeds(promtool("check", "rules", str(path)))


def test_the_dashboard_shows_the_figures_listed_here():
    used = {name for expr in expressions() for name in METRIC_NAME.findall(expr)}
    assert used == DASHBOARD_METRICS


@pytest.mark.django_db
def test_every_metric_the_dashboard_reads_is_one_the_module_exports(client, sqs_queues):
    assert DASHBOARD_METRICS - exported_metric_names(client) == set()
