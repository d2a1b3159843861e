"""payment_submit and payment_status_check over real HTTP against the sandbox processor."""

import logging
import socket
import threading
import time
from dataclasses import replace
from decimal import Decimal

import pytest
from django.conf import settings
from django.db import connection
from django.test import override_settings

from payments.exceptions import (
    PaymentNotFound,
    ProcessorCircuitOpen,
    ProcessorRejected,
    ProcessorUnavailable,
)
from payments.models import (
    AttemptOutcome,
    EventKind,
    EventOutcome,
    PaymentEvent,
    PaymentState,
    ProcessorAttempt,
)
from payments.processor.backends.http import reset_client
from payments.services import payment_apply_event, payment_status_check, payment_submit
from payments.signals import alert_raised
from tests.factories import PaymentFactory, processor_event
from tests.payments.test_processor_client import ScriptedProcessor
from tests.waiting import wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def alerts():
    received = []

    def receiver(sender, **kwargs):
        received.append(kwargs)

    alert_raised.connect(receiver, weak=False)
    yield received
    alert_raised.disconnect(receiver)


def attempts_of(payment, operation="submit"):
    return list(
        ProcessorAttempt.objects.filter(payment=payment, operation=operation).order_by(
            "attempt_number"
        )
    )


def test_accepted_submission_moves_pending_to_submitted_and_records_everything(sandbox):
    payment = PaymentFactory(amount=Decimal("42.10"), source_token="tok_plain_0001")

    result = payment_submit(payment_id=payment.id, caused_by="sqs:m-1")

    assert result.outcome == "submitted"
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    debit = sandbox.debit(str(payment.idempotency_key))
    assert debit.payment_id == str(payment.id)
    assert debit.amount == "42.10"
    assert debit.currency == "USD"
    assert debit.source_token == "tok_plain_0001"
    assert payment.processor_id == debit.processor_id
    [attempt] = attempts_of(payment)
    assert attempt.attempt_number == 1
    assert attempt.outcome == AttemptOutcome.ACCEPTED
    assert attempt.http_status == 201
    assert attempt.idempotency_key == payment.idempotency_key
    assert attempt.latency_ms > 0
    assert debit.processor_id in attempt.response_body
    event = PaymentEvent.objects.get(payment=payment, kind=EventKind.SUBMISSION)
    assert (event.outcome, event.from_state, event.to_state) == ("applied", "pending", "submitted")
    assert event.caused_by == "sqs:m-1"
    assert event.payload["processor_id"] == debit.processor_id


def test_timeout_then_retry_with_same_key_charges_once_and_ends_submitted(sandbox):
    payment = PaymentFactory(source_token="tok_timeout_1_abc")

    with pytest.raises(ProcessorUnavailable) as excinfo:
        payment_submit(payment_id=payment.id)

    assert excinfo.value.retryable
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    [first] = attempts_of(payment)
    assert first.outcome == AttemptOutcome.RETRYABLE
    assert first.error_kind == "timeout"
    assert first.http_status is None
    assert first.latency_ms >= 300
    # The processor finishes the timed-out request after the client gave up: the charge exists.
    wait_for(lambda: sandbox.stats()["total_charges"] == 1)

    result = payment_submit(payment_id=payment.id)

    assert result.outcome == "submitted"
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    stats = sandbox.stats()
    assert stats["total_charges"] == 1
    assert stats["charges"] == {str(payment.idempotency_key): 1}
    assert stats["charges_by_payment"] == {str(payment.id): 1}
    first, second = attempts_of(payment)
    assert second.http_status == 200  # the original result, answered for the known key
    assert {first.idempotency_key, second.idempotency_key} == {payment.idempotency_key}
    assert payment.processor_id == sandbox.debit(str(payment.idempotency_key)).processor_id


def test_two_5xx_then_success_charges_once_with_three_attempt_rows(sandbox):
    payment = PaymentFactory(source_token="tok_fail5xx_2_abc")

    for _ in range(2):
        with pytest.raises(ProcessorUnavailable) as excinfo:
            payment_submit(payment_id=payment.id)
        assert excinfo.value.retry_after is None
        payment.refresh_from_db()
        assert payment.state == PaymentState.PENDING
    result = payment_submit(payment_id=payment.id)

    assert result.outcome == "submitted"
    attempts = attempts_of(payment)
    assert [a.attempt_number for a in attempts] == [1, 2, 3]
    assert [a.http_status for a in attempts] == [503, 503, 201]
    assert [a.outcome for a in attempts] == ["retryable", "retryable", "accepted"]
    assert [a.error_kind for a in attempts] == ["http", "http", ""]
    assert "temporarily unavailable" in attempts[0].error
    assert sandbox.stats()["total_charges"] == 1


def test_4xx_fails_the_payment_raises_a_medium_alert_and_is_not_retried(sandbox, alerts, caplog):
    payment = PaymentFactory(source_token="tok_reject_abc")

    with caplog.at_level(logging.ERROR, logger="payments.alerts"):
        result = payment_submit(payment_id=payment.id)

    assert result.outcome == "rejected"
    payment.refresh_from_db()
    assert payment.state == PaymentState.FAILED
    [attempt] = attempts_of(payment)
    assert (attempt.outcome, attempt.http_status, attempt.error_kind) == ("rejected", 400, "http")
    assert "account closed" in attempt.error
    event = PaymentEvent.objects.get(payment=payment, kind=EventKind.SUBMISSION)
    assert (event.event_type, event.outcome, event.to_state) == ("rejected", "applied", "failed")
    [alert] = alerts
    assert alert["severity"] == "medium"
    assert alert["payment_id"] == str(payment.id)
    assert alert["key"] == "payment.submission_rejected"
    assert "account closed" in alert["summary"]
    [record] = [
        r for r in caplog.records if r.name == "payments.alerts" and r.msg.startswith("ALERT")
    ]
    assert record.levelno == logging.ERROR
    assert record.payment_id == str(payment.id)
    requests_before = sandbox.stats()["requests"]

    again = payment_submit(payment_id=payment.id)

    assert again.outcome == "skipped"
    assert sandbox.stats()["requests"] == requests_before
    assert len(attempts_of(payment)) == 1
    assert sandbox.stats()["total_charges"] == 0


def test_429_raises_retryable_error_carrying_retry_after(sandbox):
    payment = PaymentFactory(source_token="tok_429_1_abc")

    with pytest.raises(ProcessorUnavailable) as excinfo:
        payment_submit(payment_id=payment.id)

    assert excinfo.value.retry_after == 2.0
    [attempt] = attempts_of(payment)
    assert (attempt.http_status, attempt.retry_after_seconds) == (429, 2.0)
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    # The Retry-After pauses every caller: a submission right away makes no call at all.
    with pytest.raises(ProcessorCircuitOpen) as paused:
        payment_submit(payment_id=payment.id)
    assert not paused.value.called and not paused.value.breaker_open
    assert len(attempts_of(payment)) == 1
    time.sleep(paused.value.retry_after)
    assert payment_submit(payment_id=payment.id).outcome == "submitted"
    assert sandbox.stats()["total_charges"] == 1


@pytest.mark.parametrize("state", ["submitted", "confirmed", "failed"])
def test_non_pending_payment_is_never_resubmitted(sandbox, state):
    payment = PaymentFactory(state=state)

    result = payment_submit(payment_id=payment.id)

    assert result.outcome == "skipped"
    assert result.payment.state == state
    assert sandbox.stats()["requests"] == {}
    assert not ProcessorAttempt.objects.filter(payment=payment).exists()


def test_connection_error_is_retryable_and_recorded(sandbox, module_settings):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    module_settings.PROCESSOR_BASE_URL = f"http://127.0.0.1:{closed_port}"
    reset_client()
    payment = PaymentFactory()

    with pytest.raises(ProcessorUnavailable):
        payment_submit(payment_id=payment.id)

    [attempt] = attempts_of(payment)
    assert attempt.outcome == AttemptOutcome.RETRYABLE
    assert attempt.error_kind == "connection"
    assert attempt.error
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


def test_wrong_api_key_keeps_the_payment_pending_and_raises_a_high_alert(
    sandbox, module_settings, alerts
):
    module_settings.PROCESSOR_API_KEY = "not-the-key"
    payment = PaymentFactory()

    with pytest.raises(ProcessorUnavailable, match="PROCESSOR_API_KEY"):
        payment_submit(payment_id=payment.id)

    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    [attempt] = attempts_of(payment)
    assert (attempt.outcome, attempt.http_status) == ("retryable", 401)
    [alert] = alerts
    assert (alert["severity"], alert["key"]) == ("high", "processor.auth_failed")
    module_settings.PROCESSOR_API_KEY = "test-processor-key"
    assert payment_submit(payment_id=payment.id).outcome == "submitted"


def test_submit_of_unknown_payment_raises_not_found(sandbox):
    with pytest.raises(PaymentNotFound):
        payment_submit(payment_id="6d0f3c5e-8a47-4b5e-9d7c-2a8b7e1f0c11")
    assert sandbox.stats()["requests"] == {}


def test_payment_moved_by_a_callback_during_the_call_is_recorded_not_failed(sandbox):
    """The processor's `submitted` callback overtakes its own HTTP answer."""
    sandbox.plan.config = replace(sandbox.plan.config, latency_median_ms=500, latency_sigma=0.001)
    payment = PaymentFactory(source_token="tok_slow_abcd")
    outcome = {}

    def submit():
        with override_settings(PAYMENTS={**settings.PAYMENTS, "PROCESSOR_TIMEOUT_SECONDS": 2}):
            try:
                outcome["result"] = payment_submit(payment_id=payment.id)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome["error"] = exc
            finally:
                connection.close()

    thread = threading.Thread(target=submit)
    thread.start()
    # The request is at the processor (its answer is 500 ms away) when the callback lands.
    wait_for(lambda: sandbox.plan.calls_for("tok_slow_abcd") == 1)
    applied = payment_apply_event(event=processor_event(payment, "submitted"))
    assert applied.outcome == EventOutcome.APPLIED
    thread.join(5)

    assert "error" not in outcome, outcome.get("error")
    assert outcome["result"].outcome == "submitted"
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    [attempt] = attempts_of(payment)
    assert attempt.http_status == 201
    submission = PaymentEvent.objects.get(payment=payment, kind=EventKind.SUBMISSION)
    assert submission.outcome == EventOutcome.STALE
    assert payment.processor_id == sandbox.debit(str(payment.idempotency_key)).processor_id


def test_two_workers_submitting_at_once_charge_once_with_distinct_attempt_numbers(sandbox):
    sandbox.plan.config = replace(sandbox.plan.config, latency_median_ms=300, latency_sigma=0.001)
    payment = PaymentFactory(source_token="tok_race_abcd")
    results, errors = [], []

    def submit():
        with override_settings(PAYMENTS={**settings.PAYMENTS, "PROCESSOR_TIMEOUT_SECONDS": 2}):
            try:
                results.append(payment_submit(payment_id=payment.id).outcome)
            except ProcessorUnavailable as exc:
                errors.append(exc)
            finally:
                connection.close()

    threads = [threading.Thread(target=submit) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)

    assert sandbox.stats()["total_charges"] == 1
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    assert sorted(a.attempt_number for a in attempts_of(payment)) == [1, 2]
    # Either both saw the one debit (201 and 200) or one was told the key was in flight (409).
    assert "submitted" in results
    assert len(results) + len(errors) == 2
    for exc in errors:
        assert "409" in str(exc)


def test_status_check_reports_the_processor_status_and_records_an_attempt(sandbox):
    payment = PaymentFactory()
    payment_submit(payment_id=payment.id)

    status = payment_status_check(payment_id=payment.id)

    payment.refresh_from_db()
    assert status.found
    assert status.processor_id == payment.processor_id
    assert status.processor_status in ("submitted", "settled")
    [attempt] = attempts_of(payment, "status")
    assert (attempt.attempt_number, attempt.http_status, attempt.outcome) == (1, 200, "accepted")
    wait_for(lambda: payment_status_check(payment_id=payment.id).processor_status == "settled")


def test_status_check_of_a_key_the_processor_never_saw_reports_not_found(sandbox):
    payment = PaymentFactory()

    status = payment_status_check(payment_id=payment.id)

    assert not status.found
    assert status.processor_status == ""
    [attempt] = attempts_of(payment, "status")
    assert attempt.http_status == 404
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


def test_status_check_auth_failure_is_recorded_alerted_and_raised(sandbox, module_settings, alerts):
    payment = PaymentFactory()
    module_settings.PROCESSOR_API_KEY = "not-the-key"

    with pytest.raises(ProcessorUnavailable):
        payment_status_check(payment_id=payment.id)

    [attempt] = attempts_of(payment, "status")
    assert (attempt.outcome, attempt.http_status) == ("retryable", 401)
    assert [a["key"] for a in alerts] == ["processor.auth_failed"]


def test_status_check_rejection_is_recorded_then_raised(module_settings):
    server = ScriptedProcessor([(400, {"error": "malformed key"}, {})])
    module_settings.PROCESSOR_BASE_URL = server.base_url
    reset_client()
    payment = PaymentFactory()
    try:
        with pytest.raises(ProcessorRejected, match="malformed key"):
            payment_status_check(payment_id=payment.id)
    finally:
        server.stop()
        reset_client()

    [attempt] = attempts_of(payment, "status")
    assert (attempt.outcome, attempt.http_status) == ("rejected", 400)
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING


def test_retry_overtaking_a_slow_first_attempt_is_retryable_and_still_charges_once(sandbox):
    payment = PaymentFactory(source_token="tok_timeout_1_fast")
    with pytest.raises(ProcessorUnavailable):
        payment_submit(payment_id=payment.id)

    # The processor is still working on the first request: the key is in flight.
    with pytest.raises(ProcessorUnavailable) as excinfo:
        payment_submit(payment_id=payment.id)

    assert excinfo.value.retry_after == 1.0
    payment.refresh_from_db()
    assert payment.state == PaymentState.PENDING
    assert attempts_of(payment)[1].http_status == 409
    wait_for(lambda: sandbox.stats()["total_charges"] == 1)
    assert payment_submit(payment_id=payment.id).outcome == "submitted"
    assert sandbox.stats()["total_charges"] == 1
    assert [a.attempt_number for a in attempts_of(payment)] == [1, 2, 3]


def test_status_check_connection_error_is_recorded_then_raised_as_retryable(
    sandbox, module_settings
):
    payment = PaymentFactory()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    module_settings.PROCESSOR_BASE_URL = f"http://127.0.0.1:{closed_port}"

    with pytest.raises(ProcessorUnavailable):
        payment_status_check(payment_id=payment.id)

    [attempt] = attempts_of(payment, "status")
    assert (attempt.outcome, attempt.error_kind) == ("retryable", "connection")


def test_status_check_of_unknown_payment_raises_not_found(sandbox):
    with pytest.raises(PaymentNotFound):
        payment_status_check(payment_id="not-a-uuid")
    assert sandbox.stats()["requests"] == {}


def _other_connection():
    import psycopg

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    params.pop("context", None)
    return psycopg.connect(**params, autocommit=False)


def test_a_mark_that_waited_on_the_row_lock_reads_the_breaker_again_before_the_call(sandbox):
    """The mark reads the breaker in its own statement, whose snapshot is taken before it waits
    on the payment's row lock: a breaker opened by another worker during that wait must still
    keep the call from going out (a stale "closed" once let one out)."""
    from payments.processor.breaker import processor_breaker_get
    from tests.factories import open_breaker

    processor_breaker_get()  # the row is there, closed, when the mark's statement starts
    payment = PaymentFactory()
    outcome: list = []

    def mark_waiting() -> bool:
        # On this test's connection: inside the holder's transaction the activity view would
        # keep the one snapshot it took first.
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE %s",
                ["%WITH prior AS%"],
            )
            return cursor.fetchone()[0] == 1

    def submit() -> None:
        try:
            payment_submit(payment_id=payment.id)
            outcome.append("called")
        except ProcessorCircuitOpen as exc:
            outcome.append(exc)
        finally:
            connection.close()

    with _other_connection() as holder:
        holder.execute("SELECT 1 FROM payments_payment WHERE id = %s FOR UPDATE", [payment.id])
        submitter = threading.Thread(target=submit)
        submitter.start()
        wait_for(mark_waiting, 30, "the mark to wait on the row lock")
        open_breaker()  # another worker's failures opened it while the mark waited
        time.sleep(0.05)
        holder.commit()
    submitter.join(timeout=30)

    [refused] = outcome
    assert isinstance(refused, ProcessorCircuitOpen)
    assert attempts_of(payment) == []  # no call, no attempt
    payment.refresh_from_db()
    assert (payment.state, payment.submission_started_at) == (PaymentState.PENDING, None)


def _record_waiting() -> bool:
    """A submission's one-statement record waits on the payment's row lock."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND query LIKE %s",
            ["%WITH locked AS%"],
        )
        return cursor.fetchone()[0] == 1


def test_an_attempt_committed_while_the_record_waited_on_the_row_lock_is_not_numbered_twice(
    sandbox,
):
    """The record's one statement counts the attempts in the snapshot it took before it waited
    on the row lock: an attempt another submission committed during that wait (it held the
    lock without writing the row, so the row is still the version the mark wrote) is not in
    that count. The number's unique constraint refuses the second number 1, the statement
    writes nothing, and the record is made again statement by statement after the lock."""
    sandbox.plan.config = replace(sandbox.plan.config, latency_median_ms=300, latency_sigma=0.001)
    payment = PaymentFactory(source_token="tok_slow_lock_abcd")
    outcome: list = []

    def submit() -> None:
        with override_settings(PAYMENTS={**settings.PAYMENTS, "PROCESSOR_TIMEOUT_SECONDS": 2}):
            try:
                outcome.append(payment_submit(payment_id=payment.id).outcome)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                outcome.append(exc)
            finally:
                connection.close()

    submitter = threading.Thread(target=submit)
    submitter.start()
    # Marked, its call at the processor: another submission's record holds the row lock now.
    wait_for(lambda: sandbox.plan.calls_for("tok_slow_lock_abcd") == 1)
    with _other_connection() as holder:
        holder.execute(
            "SELECT 1 FROM payments_payment WHERE id = %s FOR NO KEY UPDATE", [payment.id]
        )
        holder.execute(
            "INSERT INTO payments_processorattempt (payment_id, attempt_number, operation, "
            "idempotency_key, outcome, http_status, error_kind, error, response_body, "
            "latency_ms, started_at) VALUES (%s, 1, 'submit', %s, 'retryable', 503, 'http', "
            "'unavailable', '', 5, now())",
            [payment.id, payment.idempotency_key],
        )
        wait_for(_record_waiting, 30, "the record to wait on the row lock")
        holder.commit()
    submitter.join(timeout=30)

    assert outcome == ["submitted"]
    assert [(a.attempt_number, a.outcome) for a in attempts_of(payment)] == [
        (1, "retryable"),
        (2, "accepted"),
    ]
    payment.refresh_from_db()
    assert payment.state == PaymentState.SUBMITTED
    event = PaymentEvent.objects.get(payment=payment, kind=EventKind.SUBMISSION)
    assert (event.outcome, event.payload["attempt_number"]) == (EventOutcome.APPLIED, 2)
    assert sandbox.stats()["total_charges"] == 1


def test_a_record_in_one_statement_writes_what_the_record_statement_by_statement_writes(
    sandbox, monkeypatch
):
    """The same answer recorded both ways: the one statement's rows (the payment's row still
    the mark's) and those of the path after the row lock (the row written since the mark,
    here by a note an operator saved) differ in nothing but their ids and times."""
    from payments.models import Payment
    from payments.webhooks.models import Event

    def recorded(payment) -> dict:
        payment.refresh_from_db()
        [attempt] = attempts_of(payment)
        log = PaymentEvent.objects.get(payment=payment, kind=EventKind.SUBMISSION)
        [event] = Event.objects.filter(object_id=str(payment.pk), type="payment.submitted")
        processor_id = payment.processor_id
        return {
            "payment": (payment.state, bool(processor_id), payment.submission_started_at is None),
            "attempt": (
                attempt.attempt_number,
                attempt.outcome,
                attempt.http_status,
                attempt.started_at <= attempt.recorded_at,
            ),
            "log": (
                log.event_type,
                log.outcome,
                log.from_state,
                log.to_state,
                log.caused_by,
                {**log.payload, "processor_id": bool(log.payload["processor_id"])},
            ),
            "event": (
                event.data["object"]["state"],
                event.data["object"]["processor_id"] == processor_id,
            ),
        }

    sandbox.plan.config = replace(sandbox.plan.config, latency_median_ms=300, latency_sigma=0.001)
    one = PaymentFactory(source_token="tok_one_abcd")
    other = PaymentFactory(source_token="tok_other_abcd")

    def submit(payment) -> None:
        try:
            payment_submit(payment_id=payment.id, caused_by="sqs:m-1")
        finally:
            connection.close()

    from payments.services import submission

    by_statement = []
    record = submission._submission_record

    def record_by_statement(payment_id, *args):
        by_statement.append(str(payment_id))
        return record(payment_id, *args)

    monkeypatch.setattr(submission, "_submission_record", record_by_statement)
    with override_settings(PAYMENTS={**settings.PAYMENTS, "PROCESSOR_TIMEOUT_SECONDS": 2}):
        submit(one)
        submitter = threading.Thread(target=submit, args=(other,))
        submitter.start()
        wait_for(lambda: sandbox.plan.calls_for("tok_other_abcd") == 1)
        Payment.objects.filter(pk=other.pk).update(description="noted while it was sent")
        submitter.join(timeout=30)

    assert by_statement == [str(other.pk)]  # one's in one statement, other's after the lock
    assert recorded(one) == recorded(other)
    assert recorded(one)["payment"] == (PaymentState.SUBMITTED, True, False)
    assert recorded(one)["log"][5] == {
        "attempt_number": 1,
        "http_status": 201,
        "error_kind": "",
        "error": "",
        "processor_id": True,
        "processor_status": "submitted",
    }
