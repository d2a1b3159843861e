"""Delivering events to endpoints over real HTTP: signed as Standard Webhooks, retried with the
same webhook-id, recorded, disabled after failing, replayed once enabled again, never lost."""

import base64
import hashlib
import hmac
import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from standardwebhooks.webhooks import Webhook

from payments.models import PaymentState
from payments.signals import alert_raised
from payments.webhooks.delivery import (
    deliveries_claim,
    deliveries_run,
    delivery_attempt,
    events_dispatch,
    retry_delay,
)
from payments.webhooks.models import (
    DeliveryStatus,
    Event,
    WebhookAction,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from payments.webhooks.services import webhook_endpoint_enable, webhook_endpoint_rotate_secret
from tests.payments.webhook_support import (
    endpoint_for,
    settle,
)

pytestmark = pytest.mark.django_db(transaction=True)


def test_each_transition_is_delivered_once_and_verified_by_the_library(receiver):
    endpoint_for(receiver)
    payment = settle()

    assert deliveries_run() == 2

    assert [body["type"] for body in receiver.verified] == [
        "payment.submitted",
        "payment.confirmed",
    ]
    assert receiver.refused == 0 and receiver.repeats == 0
    confirmed = receiver.verified[1]["data"]["object"]
    assert confirmed["id"] == str(payment.id) and confirmed["state"] == PaymentState.CONFIRMED
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 2


def test_the_signature_is_the_hmac_the_standard_defines(receiver):
    endpoint = endpoint_for(receiver)
    settle()
    deliveries_run()

    headers = {k.lower(): v for k, v in receiver.headers[0].items()}
    event = Event.objects.get(id=headers["webhook-id"])
    body = json.dumps(
        {
            "id": event.id,
            "type": event.type,
            "created_at": event.created_at.isoformat().replace("+00:00", "Z"),
            "merchant_id": event.merchant_id,
            "data": event.data,
        },
        separators=(",", ":"),
    ).encode()
    key = base64.b64decode(endpoint.secret.removeprefix("whsec_"))
    signed = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    assert headers["webhook-signature"] == f"v1,{expected}"
    assert abs(int(headers["webhook-timestamp"]) - time.time()) < 60


def test_after_rotation_both_secrets_sign_until_the_grace_ends(receiver, module_settings):
    endpoint = endpoint_for(receiver)
    old = endpoint.secret
    endpoint = webhook_endpoint_rotate_secret(endpoint=endpoint, actor="test")
    receiver.secrets = [old]  # a receiver not yet given the new secret
    settle()
    deliveries_run()
    signatures = receiver.headers[0]["webhook-signature"].split(" ")
    assert len(signatures) == 2 and receiver.refused == 0 and len(receiver.verified) == 2
    assert endpoint.secret != old
    Webhook(endpoint.secret)  # the new secret is a valid whsec_

    WebhookEndpoint.objects.filter(id=endpoint.id).update(
        previous_secret_expires_at=timezone.now() - timedelta(seconds=1)
    )
    settle()
    deliveries_run()
    assert receiver.refused >= 1  # the old secret no longer signs
    receiver.secrets = [endpoint.secret]
    WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).update(
        next_attempt_at=timezone.now()
    )
    deliveries_run()
    assert len(receiver.verified) == 4


def test_a_failing_receiver_gets_retries_with_the_same_webhook_id_until_it_recovers(
    receiver, module_settings
):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0, 0, 0, 0]
    endpoint_for(receiver)
    settle()
    receiver.fail_first = 5

    for _ in range(5):
        deliveries_run()

    ids = [h["webhook-id"] for h in receiver.headers]
    assert len(ids) == 7 and len(set(ids)) == 2  # 5 failures then 2 successes, 2 ids
    assert len(receiver.verified) == 2 and receiver.repeats == 0
    tries = list(WebhookAttempt.objects.order_by("id").values_list("status_code", flat=True))
    assert tries.count(500) == 5 and tries.count(200) == 2
    assert all(a.latency_ms >= 0 and a.response_head for a in WebhookAttempt.objects.all())
    assert WebhookEndpoint.objects.get().consecutive_failures == 0


def test_the_schedule_spent_leaves_the_delivery_failed(receiver, module_settings):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0]
    endpoint_for(receiver)
    settle()
    receiver.status = 503
    for _ in range(3):
        deliveries_run()
    assert set(WebhookDelivery.objects.values_list("status", flat=True)) == {DeliveryStatus.FAILED}
    assert WebhookAttempt.objects.count() == 4  # two events, each tried twice


def test_retry_delays_follow_the_schedule_with_jitter_for_about_three_days():
    delays = [retry_delay(n) for n in range(1, 13)]
    total = sum(d.total_seconds() for d in delays)
    assert 2.5 * 86400 < total < 4 * 86400
    assert all(
        0.8 * base <= d.total_seconds() <= 1.2 * base
        for d, base in zip(delays, [5, 300, 1800, 7200, 18000] + [36000] * 7, strict=True)
    )
    assert retry_delay(13) is None


def test_an_endpoint_failing_n_attempts_over_t_hours_is_disabled_with_an_alert_and_an_event(
    receiver, module_settings
):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0] * 10
    module_settings.WEBHOOK_DISABLE_AFTER_FAILURES = 3
    module_settings.WEBHOOK_DISABLE_AFTER_HOURS = 1
    endpoint = endpoint_for(receiver)
    receiver.status = 500
    alerts = []

    def listen(sender, **kwargs):
        alerts.append(kwargs)

    alert_raised.connect(listen)
    try:
        settle()
        for _ in range(2):
            deliveries_run()
        endpoint.refresh_from_db()
        assert endpoint.enabled and endpoint.consecutive_failures == 4  # not an hour yet
        WebhookEndpoint.objects.filter(id=endpoint.id).update(
            failing_since=timezone.now() - timedelta(hours=2)
        )
        deliveries_run()
    finally:
        alert_raised.disconnect(listen)

    endpoint.refresh_from_db()
    assert not endpoint.enabled and "failed attempts" in endpoint.disabled_reason
    assert [a["key"] for a in alerts] == ["webhook_endpoint_disabled"]
    assert endpoint.secret not in str(alerts)
    disabled = Event.objects.get(type="webhook_endpoint.disabled")
    assert disabled.data["object"]["id"] == str(endpoint.id)
    assert WebhookAction.objects.filter(kind="disable", endpoint=endpoint).count() == 1
    sent = receiver.requests
    deliveries_run()
    assert receiver.requests == sent  # a disabled endpoint is not called


def test_enabling_again_replays_everything_since_it_was_disabled(receiver, module_settings):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0] * 5
    module_settings.WEBHOOK_DISABLE_AFTER_FAILURES = 2
    module_settings.WEBHOOK_DISABLE_AFTER_HOURS = 0
    endpoint = endpoint_for(receiver)
    receiver.status = 500
    settle()
    deliveries_run()
    endpoint.refresh_from_db()
    assert not endpoint.enabled
    settle()  # two more events while it is disabled: no deliveries made for it
    events_dispatch()
    assert WebhookDelivery.objects.count() == 2

    receiver.status = 200
    replayed = webhook_endpoint_enable(endpoint=endpoint, actor="test", note="fixed")
    deliveries_run()

    # The two it failed, the two made while it was disabled, and its own disabling.
    assert replayed == 5
    types = sorted(body["type"] for body in receiver.verified)
    assert types == ["payment.confirmed"] * 2 + ["payment.submitted"] * 2 + [
        "webhook_endpoint.disabled"
    ]
    assert WebhookAction.objects.filter(kind="enable", deliveries=5).count() == 1


def test_an_event_committed_before_the_disabling_and_dispatched_after_it_is_replayed(
    receiver, module_settings
):
    """Events commit, then wait for a dispatch; the endpoint is disabled in between (by another
    event's failing delivery). They were made before it was disabled, but dispatched after it,
    when it got no delivery of them: enabling again replays them too."""
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0] * 5
    module_settings.WEBHOOK_DISABLE_AFTER_FAILURES = 2
    module_settings.WEBHOOK_DISABLE_AFTER_HOURS = 0
    endpoint = endpoint_for(receiver)
    receiver.status = 500
    settle()
    events_dispatch()
    settle()  # committed, not yet dispatched
    delivered_first = list(WebhookDelivery.objects.values_list("id", flat=True))
    for _ in range(2):  # the first two events' deliveries fail twice: the endpoint is disabled
        for delivery_id in delivered_first:
            delivery_attempt(delivery_id=delivery_id)
    endpoint.refresh_from_db()
    assert not endpoint.enabled
    events_dispatch()  # the two later events, dispatched while it is disabled
    assert WebhookDelivery.objects.count() == 2

    receiver.status = 200
    replayed = webhook_endpoint_enable(endpoint=endpoint, actor="test", note="fixed")
    deliveries_run()

    assert replayed == 5
    types = sorted(body["type"] for body in receiver.verified)
    assert types == ["payment.confirmed"] * 2 + ["payment.submitted"] * 2 + [
        "webhook_endpoint.disabled"
    ]


def test_a_host_resolving_to_loopback_is_refused_at_send_time(receiver, module_settings):
    endpoint_for(receiver)
    module_settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    settle()
    deliveries_run()
    assert receiver.requests == 0
    assert set(WebhookAttempt.objects.values_list("error", flat=True)) == {
        "refused: points at a private, loopback or link-local address"
    }


def test_a_redirect_is_not_followed_and_counts_as_a_failure(receiver):
    endpoint_for(receiver)
    receiver.redirect_to = "http://169.254.169.254/latest/meta-data/"
    settle()
    deliveries_run()
    assert receiver.requests == 2
    assert set(WebhookAttempt.objects.values_list("status_code", flat=True)) == {302}
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).count() == 2


def test_a_receiver_that_never_answers_times_out_and_is_retried(receiver, module_settings):
    module_settings.WEBHOOK_TIMEOUT_SECONDS = 0.3
    endpoint_for(receiver)
    receiver.hang_seconds = 1.0
    settle()
    started = time.monotonic()
    deliveries_run()
    assert time.monotonic() - started < 1.8
    assert set(WebhookAttempt.objects.values_list("error", flat=True)) == {"timeout"}
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).count() == 2


def test_concurrent_claimers_never_take_the_same_delivery(receiver):
    endpoint_for(receiver)
    for _ in range(10):
        settle()
    events_dispatch()
    claimed: list[list[int]] = []
    barrier = threading.Barrier(4)

    def claim():
        from django.db import connection

        barrier.wait()
        claimed.append(deliveries_claim(limit=8))
        connection.close()

    threads = [threading.Thread(target=claim) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    every = [i for ids in claimed for i in ids]
    assert len(every) == len(set(every)) == 20


def test_a_sender_killed_mid_delivery_loses_nothing(receiver, tmp_path):
    """A real process sends, the receiver holds the request, the process is SIGKILLed: the
    delivery's lease runs out and the next run sends it, with the same webhook-id."""
    from tests.callbacks.worker_support import worker_env

    endpoint_for(receiver)
    settle()
    events_dispatch()
    receiver.hang_seconds = 30
    log = open(tmp_path / "sender.log", "w")  # noqa: SIM115
    process = subprocess.Popen(
        [sys.executable, "manage.py", "webhooks_deliver", "--until-empty"],
        env=worker_env(WEBHOOK_ALLOW_HTTP="true", WEBHOOK_ALLOW_PRIVATE_ADDRESSES="true"),
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=os.getcwd(),
    )
    deadline = time.monotonic() + 30
    while receiver.requests == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert receiver.requests == 1, (tmp_path / "sender.log").read_text()
    process.send_signal(signal.SIGKILL)
    process.wait()
    log.close()
    receiver.hang_seconds = 0
    assert WebhookAttempt.objects.count() == 0  # nothing recorded: the process died mid-send

    assert deliveries_run() == 0  # both were claimed by the dead process: leased, not due
    later = timezone.now() + timedelta(minutes=10)
    claimed = deliveries_claim(now=later)
    for delivery_id in claimed:
        delivery_attempt(delivery_id=delivery_id)

    assert len(claimed) == 2
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.SUCCEEDED).count() == 2
    # The request the dead process had under way reached the receiver, and comes again with
    # the same webhook-id: the receiver drops it as a repeat.
    first_id = receiver.headers[0]["webhook-id"]
    assert receiver.ids[first_id] == 2 and receiver.repeats == 1
    assert len(receiver.verified) == 2


def test_the_beat_task_dispatches_and_hands_each_delivery_to_its_own_task(receiver):
    from payments import tasks

    app = tasks.webhook_deliver.app
    endpoint_for(receiver)
    settle()
    eager = app.conf.task_always_eager
    app.conf.task_always_eager = True
    try:
        handed = tasks.webhooks_dispatch()
    finally:
        app.conf.task_always_eager = eager
    assert handed == 2 and len(receiver.verified) == 2
    assert tasks.webhooks_dispatch() == 0  # nothing due twice


def test_a_2_gb_answer_is_read_only_to_its_first_bytes(receiver):
    endpoint_for(receiver)
    receiver.answer_bytes = 2 * 1024**3
    settle()
    started = time.monotonic()
    deliveries_run()
    assert time.monotonic() - started < 5
    heads = list(WebhookAttempt.objects.values_list("status_code", "response_head"))
    assert heads == [(200, "x" * 512)] * 2


def test_no_secret_or_signature_reaches_the_logs_or_the_attempts(receiver, caplog, module_settings):
    module_settings.WEBHOOK_RETRY_SCHEDULE = [0]
    endpoint = endpoint_for(receiver)
    old = endpoint.secret
    endpoint = webhook_endpoint_rotate_secret(endpoint=endpoint, actor="test")
    receiver.status = 500
    with caplog.at_level("DEBUG"):
        settle()
        deliveries_run()
        deliveries_run()
    signatures = [h["webhook-signature"] for h in receiver.headers]
    recorded = str(list(WebhookAttempt.objects.values())) + str(
        list(WebhookAction.objects.values())
    )
    for text in [caplog.text, recorded]:
        for secret in [old, endpoint.secret, old[6:], endpoint.secret[6:]]:
            assert secret not in text
        assert not any(part in text for sig in signatures for part in sig.split(" "))


def test_a_dns_name_resolving_to_loopback_is_refused_at_send_time(receiver, module_settings):
    """The URL's text names no address; its resolution is checked before every request."""
    port = receiver.url.split(":")[2].split("/")[0]
    endpoint_for(receiver, url=f"http://localhost:{port}/hooks")
    module_settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    settle()
    deliveries_run()
    assert receiver.requests == 0
    assert set(WebhookAttempt.objects.values_list("error", flat=True)) == {
        "refused: host resolves to a private, loopback or link-local address"
    }


def test_the_connection_itself_is_refused_when_its_peer_is_private(receiver, module_settings):
    """What DNS rebinding would slip past a check made before the request: the socket's peer
    is checked once connected, before a byte is sent."""
    from payments.webhooks.addresses import AddressRefused, guarded_session

    module_settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = False
    with pytest.raises(AddressRefused, match="connected to a private"):
        guarded_session().post(receiver.url, data=b"{}", timeout=2)
    assert receiver.requests == 0

    module_settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    assert guarded_session().post(receiver.url, data=b"{}", timeout=2).status_code == 401
    assert receiver.requests == 1


def test_a_receiver_trickling_its_headers_is_cut_at_the_deadline(receiver, module_settings):
    """Each header line comes within the read timeout; their sum is bounded all the same."""
    module_settings.WEBHOOK_TIMEOUT_SECONDS = 0.4
    endpoint_for(receiver)
    receiver.trickle_headers = 0.1
    settle()
    started = time.monotonic()
    deliveries_run()
    assert time.monotonic() - started < 4  # two requests of at most 0.8 s each
    assert set(WebhookAttempt.objects.values_list("error", flat=True)) == {
        "too slow: no answer within 0.8 s in all"
    }
    assert WebhookDelivery.objects.filter(status=DeliveryStatus.PENDING).count() == 2


def test_a_receiver_trickling_its_body_is_cut_at_the_deadline_keeping_its_status(
    receiver, module_settings
):
    module_settings.WEBHOOK_TIMEOUT_SECONDS = 0.4
    endpoint_for(receiver)
    receiver.trickle_body = 0.05
    settle()
    started = time.monotonic()
    deliveries_run()
    assert time.monotonic() - started < 4  # 512 bytes at one per 50 ms would take 25 s each
    heads = list(WebhookAttempt.objects.values_list("status_code", "response_head"))
    assert [code for code, _ in heads] == [200, 200]
    # Cut at the deadline: what had come of the body by then, never all of it (a starved
    # receiver on a loaded machine may have sent nothing of it yet).
    assert all(len(head) < 512 and set(head) <= {"x"} for _, head in heads), heads
