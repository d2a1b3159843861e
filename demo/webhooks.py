"""The demo's webhooks: two verifying receivers in the demo's process, and the checks of what
they got.

- ``main`` takes an endpoint of every demo merchant but the first (every other one thin and
  ordered, the others alternating between the API's versions), and fails its first
  ``MAIN_FAILS_FIRST`` requests: retried, then delivered.
- ``flaky`` takes the first merchant's endpoint and answers 503 until that endpoint is
  disabled by the failure rule (``WEBHOOK_DISABLE_AFTER_FAILURES``); then it comes back and the
  endpoint is enabled through the API, which replays what it missed.

The summary checks every event delivered to every endpoint and verified, the
disabled-then-replayed endpoint complete, and repeats only as the same ``webhook-id`` (the
chaos run's invariants, ``chaos.invariants.webhooks``, on what the receivers recorded)."""

import time

import requests

from sandbox.webhook_receiver import WebhookReceiver

# Below WEBHOOK_DISABLE_AFTER_FAILURES: all of them to one endpoint still leaves it enabled.
MAIN_FAILS_FIRST = 8
# The demo's settings for its webhooks (demo/run.py's environment): loopback over http, retries
# within seconds, an endpoint disabled after 10 failures in a row.
ENVIRONMENT = {
    "WEBHOOK_ALLOW_HTTP": "true",
    "WEBHOOK_ALLOW_PRIVATE_ADDRESSES": "true",
    "WEBHOOK_TIMEOUT_SECONDS": "2",
    "WEBHOOK_RETRY_SCHEDULE": "[1, 2, 2, 4, 4, 8, 8, 8]",
    "WEBHOOK_DISABLE_AFTER_FAILURES": "10",
    "WEBHOOK_DISABLE_AFTER_HOURS": "0",
}


def webhooks_start(merchants: list[str]) -> dict:
    """Start both receivers and make the endpoints (before any traffic, so every event of the
    run is wanted by one)."""
    from payments.api_versions import VERSIONS
    from payments.webhooks.services import webhook_endpoint_create

    main, flaky = WebhookReceiver().start(), WebhookReceiver().start()
    main.fail_first = MAIN_FAILS_FIRST
    flaky.status = 503
    endpoints = []
    for n, merchant in enumerate(merchants):
        receiver = flaky if n == 0 else main
        endpoint = webhook_endpoint_create(
            merchant_id=merchant,
            url=f"{receiver.url}/{merchant}",
            event_types=[],
            thin=n % 2 == 1,
            ordered=n % 2 == 1,
            # Every version's shapes at size: the full endpoints alternate between them.
            api_version=VERSIONS[n // 2 % len(VERSIONS)],
        )
        receiver.secrets.append(endpoint.secret)
        endpoints.append(endpoint)
    return {"main": main, "flaky": flaky, "flaky_endpoint": endpoints[0]}


def flaky_recover(webhooks: dict, *, web_url: str, token: str, timeout: float = 120) -> bool:
    """Wait for the failure rule to disable the flaky endpoint, bring its receiver back and
    enable the endpoint through the merchant's API; whether it was disabled in time."""
    from payments.webhooks.models import WebhookEndpoint

    endpoint = webhooks["flaky_endpoint"]
    deadline = time.monotonic() + timeout
    while WebhookEndpoint.objects.get(pk=endpoint.pk).enabled:
        if time.monotonic() > deadline:
            return False
        time.sleep(1)
    webhooks["flaky"].status = 200
    answer = requests.post(
        f"{web_url}/api/webhook_endpoints/{endpoint.pk}/enable/",
        json={},
        headers={"Authorization": f"Token {token}"},
        timeout=10,
    )
    return answer.status_code == 200 and answer.json()["enabled"]


def webhooks_wait(timeout: float = 180) -> bool:
    """Wait until every event is dispatched and no delivery is pending."""
    from payments.webhooks.models import DeliveryStatus, Event, WebhookDelivery

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        moving = (
            Event.objects.filter(position__isnull=True).exists()
            or WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).exists()
        )
        if not moving:
            return True
        time.sleep(1)
    return False


def webhooks_checks(webhooks: dict, *, recovered: bool) -> tuple[list, list]:
    """The section's rows and checks, from the database and what the receivers recorded."""
    from chaos.invariants.report import Report
    from chaos.invariants.webhooks import check_webhook_ids, check_webhooks_delivered
    from payments.webhooks.models import Event, WebhookAction

    main, flaky = webhooks["main"], webhooks["flaky"]
    endpoint = webhooks["flaky_endpoint"]
    receipts = [*main.receipts, *flaky.receipts]
    report = Report()
    check_webhooks_delivered(report, receipts)
    check_webhook_ids(report, receipts)
    flaky_events = set(
        Event.objects.filter(merchant_id=endpoint.merchant_id, position__isnull=False)
        .exclude(type="webhook_endpoint.disabled", object_id=str(endpoint.pk))
        .values_list("id", flat=True)
    )
    flaky_got = {r["webhook_id"] for r in flaky.receipts if r["status"] == 200}
    answered = sum(1 for r in receipts if r["status"] == 200)
    replayed = WebhookAction.objects.filter(endpoint_ref=str(endpoint.pk), kind="enable").first()
    rows = [
        ("events", Event.objects.count()),
        ("requests answered 200, signature verified", answered),
        ("repeats (same webhook-id)", answered - len({r["webhook_id"] for r in receipts})),
        ("requests answered with a failure", main.requests + flaky.requests - answered),
        ("disabled endpoint's deliveries replayed", replayed.deliveries if replayed else 0),
    ]
    checks = [
        (
            "every event delivered to every endpoint wanting it",
            not report.violations_of("webhooks_delivered_at_least_once"),
        ),
        ("every request's signature verified", main.refused == 0 and flaky.refused == 0),
        (
            "repeats only under the same webhook-id, with the same body",
            not report.violations_of("webhook_ids_stable"),
        ),
        ("the failing endpoint was disabled, then enabled through the API", recovered),
        ("the re-enabled endpoint got every event of its merchant", flaky_events <= flaky_got),
    ]
    return rows, checks
