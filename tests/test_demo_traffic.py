"""The demo waits for promised returns and its summary checks the reversals."""

from decimal import Decimal

import pytest

from demo.traffic import _summary, _unfinished
from payments.models import LedgerEntry, PaymentState
from payments.services import payment_apply_event
from tests.factories import LedgerEntryFactory, PaymentFactory, processor_event

pytestmark = pytest.mark.django_db


def _settled(token: str):
    payment = PaymentFactory(state=PaymentState.SUBMITTED, source_token=token)
    payment_apply_event(event=processor_event(payment, "settled"))
    return payment


def test_a_settled_payment_whose_token_promises_a_return_is_still_moving():
    _settled("tok_demo_00001x")
    nsf = _settled("tok_nsf_00002x")
    assert _unfinished() == 1

    payment_apply_event(event=processor_event(nsf, "returned", reason_code="R01"))

    assert _unfinished() == 0


def _processor_outage_story(capture_on_commit) -> None:
    """The breaker's history of a demo run: opened by failures, closed by a successful trial,
    the incident over after its cool-down (the demo's summary checks the story of its processor
    outage too)."""
    from datetime import timedelta

    from django.db.models.functions import Now

    from payments.models import CircuitBreaker
    from payments.processor.breaker import (
        PROCESSOR,
        CallOutcome,
        processor_breaker_admit,
        processor_breaker_incident_end,
        processor_breaker_record,
        trial_calls,
    )

    with capture_on_commit(execute=True):
        for _ in range(5):
            processor_breaker_record(
                admission=processor_breaker_admit(),
                outcome=CallOutcome.FAILURE,
                error="503 Service Unavailable",
            )
        CircuitBreaker.objects.filter(name=PROCESSOR).update(open_until=Now())
        for _ in range(trial_calls()):
            trial = processor_breaker_admit()
            assert trial.trial
            processor_breaker_record(admission=trial, outcome=CallOutcome.SUCCESS)
        CircuitBreaker.objects.filter(name=PROCESSOR).update(closed_at=Now() - timedelta(days=1))
        assert processor_breaker_incident_end()


def test_the_summary_shows_returns_and_passes_when_each_is_reversed_once(
    sqs_queues, sandbox, capsys, django_capture_on_commit_callbacks
):
    _processor_outage_story(django_capture_on_commit_callbacks)
    returned = _settled("tok_unauth_00003x")
    _settled("tok_demo_00004x")
    payment_apply_event(event=processor_event(returned, "returned", reason_code="R10"))

    assert _summary(sandbox.base_url, 0) is True
    out = capsys.readouterr().out
    assert "returned after settlement (reversed)" in out
    assert "R10: 1" in out
    assert "[PASS] every returned payment reversed exactly once (1 returned)" in out

    LedgerEntry.objects.filter(kind="reversal").delete()
    assert _summary(sandbox.base_url, 0) is False
    assert "[FAIL] every returned payment reversed exactly once" in capsys.readouterr().out


def test_the_summary_fails_a_credit_for_an_unsettled_payment(
    sqs_queues, sandbox, capsys, django_capture_on_commit_callbacks
):
    _processor_outage_story(django_capture_on_commit_callbacks)
    payment = PaymentFactory(state=PaymentState.SUBMITTED, amount=Decimal("3.00"))
    LedgerEntryFactory(payment=payment)

    assert _summary(sandbox.base_url, 0) is False
    assert "[FAIL] no ledger credit without a confirmed payment" in capsys.readouterr().out


def test_the_summary_counts_one_resolved_alert_per_breaker_incident(
    sqs_queues, sandbox, capsys, django_capture_on_commit_callbacks
):
    """Injected 5xx may open the breaker again after the outage: a second, short incident with
    its own alert, which passes when it too is resolved."""

    from payments.processor.breaker import ALERT_KEY
    from triage.models import Alert

    _processor_outage_story(django_capture_on_commit_callbacks)
    _processor_outage_story(django_capture_on_commit_callbacks)

    assert _summary(sandbox.base_url, 0) is True
    out = capsys.readouterr().out
    assert "1 more short incident(s) from injected 5xx" in out
    assert "[PASS] one 'processor unavailable' alert per breaker incident, each resolved " in out
    assert "(2 alert(s), 2 incident(s))" in out

    latest = Alert.objects.filter(key=ALERT_KEY).order_by("-id").values_list("pk", flat=True)[:1]
    Alert.objects.filter(pk__in=list(latest)).update(status="firing", resolved_at=None)
    assert _summary(sandbox.base_url, 0) is False
    assert "[FAIL] one 'processor unavailable' alert per breaker incident" in (
        capsys.readouterr().out
    )


def test_the_demo_checks_one_dishonor_re_credited_and_one_contest_reversed():
    from demo.dishonors import dishonor_story

    def returned():
        payment = _settled("tok_nsf_demo_dishonor0")
        payment_apply_event(event=processor_event(payment, "returned", reason_code="R01"))
        return payment

    dishonored, contested = returned(), returned()
    assert [passed for _, passed in dishonor_story(dishonored.id, contested.id)] == [False, False]

    payment_apply_event(event=processor_event(dishonored, "return_dishonored", reason_code="R61"))
    payment_apply_event(event=processor_event(contested, "return_dishonored", reason_code="R61"))
    payment_apply_event(event=processor_event(contested, "dishonor_contested", reason_code="R76"))
    checks = dishonor_story(dishonored.id, contested.id)

    assert [passed for _, passed in checks] == [True, True]
    assert "dishonored: the return is undone" in checks[0][0]
    assert "contested: the return stands, net 0.00" in checks[1][0]
