"""The invariant checker passes a clean history and names each kind of corruption."""

import json
import uuid

import pytest
from django.db import transaction

from callbacks.models import QueueMessageStatus
from chaos.invariants import check_invariants
from chaos.invariants.cli import main
from payments.models import (
    EventKind,
    EventOutcome,
    LedgerEntry,
    Payment,
    PaymentEvent,
    PaymentState,
)
from payments.services import payment_transition
from tests.chaos.histories import check, deliver, failed_checks, new_payment, queue_message
from triage.models import DeadLetter, DeadLetterSource

pytestmark = pytest.mark.django_db


def test_a_clean_history_passes_every_check(history):
    report = check(history)

    assert report.ok, report.render()
    assert report.checked["callbacks_accounted"]["missing"] == 0
    assert report.checked["callbacks_accounted"]["duplicate"] == 0  # its first copy applied
    assert report.checked["callbacks_accounted"]["stale"] == 1
    assert report.checked["callbacks_accounted"]["parked"] == 1
    assert report.checked["callbacks_accounted"]["dead letter"] == 1
    # The money-out debits too: one refunded and kept, one refunded and returned, one paid out.
    assert report.checked["ledger_matches_confirmed"]["credits"] == 6
    assert report.checked["returns_reversed"]["reversals"] == 2
    # 10.00 + 3.10 + 20.00 + 3.10
    assert report.checked["returns_reversed"]["ledger net"] == "36.20"
    assert report.checked["credits_sent_at_most_once"] == {"credit keys sent": 2}
    assert report.checked["refunds_within_collected"] == {"debits refunded": 2}
    assert report.checked["double_losses_flagged"] == {"double losses": 1}
    assert report.checked["payouts_never_overdraw"] == {"payouts": 1}
    assert "invariants PASSED" in report.render()


def test_a_second_applied_row_for_one_event_id_fails(history):
    payment = history["payments"]["returned"]
    first = PaymentEvent.objects.get(payment=payment, event_type="returned")
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.APPLIED,
        event_type="returned",
        processor_event_id=first.processor_event_id,
        from_state=PaymentState.FAILED,
        to_state=PaymentState.FAILED,
    )

    report = check(history)

    assert not report.ok
    [violation] = report.violations_of("event_applied_at_most_once")
    assert first.processor_event_id in violation.ids
    assert "applied more than once" in violation.detail


def test_a_ledger_credit_without_confirmation_fails(history):
    payment = history["payments"]["held"]  # still pending
    LedgerEntry.objects.create(
        payment=payment,
        merchant_id=payment.merchant_id,
        kind="credit",
        amount=payment.amount,
        currency="USD",
    )

    report = check(history)

    details = [v.detail for v in report.violations_of("ledger_matches_confirmed")]
    assert any("not confirmed" in d for d in details), details
    assert any("differ from their confirmed total" in d for d in details), details
    assert failed_checks(report) == {"ledger_matches_confirmed"}


def test_a_credit_for_a_payment_confirmed_outside_the_log_fails(history):
    payment = history["payments"]["held"]
    Payment.objects.filter(pk=payment.pk).update(state=PaymentState.CONFIRMED)
    LedgerEntry.objects.create(
        payment=payment, merchant_id=payment.merchant_id, kind="credit", amount=payment.amount
    )

    report = check(history)

    details = [v.detail for v in report.violations_of("ledger_matches_confirmed")]
    assert any("no confirmation in the payment's event log" in d for d in details), details
    assert report.violations_of("transitions_valid")  # the log ends in pending


def test_a_pending_to_confirmed_transition_in_the_log_fails(history):
    payment = new_payment("m-4", "1.00")
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.APPLIED,
        event_type="settled",
        processor_event_id="evt_skipped_submission",
        from_state=PaymentState.PENDING,
        to_state=PaymentState.CONFIRMED,
    )
    Payment.objects.filter(pk=payment.pk).update(state=PaymentState.CONFIRMED)
    history["stats"]["charges"][str(payment.idempotency_key)] = 1

    report = check(history)

    [violation] = [
        v for v in report.violations_of("transitions_valid") if "does not allow" in v.detail
    ]
    assert str(payment.id) in violation.ids[0]
    assert "pending->confirmed" in violation.ids[0]


def test_an_applied_row_out_of_order_fails(history):
    payment = history["payments"]["returned"]
    # A second "settled" applied from submitted after the payment had already failed.
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.APPLIED,
        event_type="settled",
        processor_event_id="evt_late_settled",
        from_state=PaymentState.SUBMITTED,
        to_state=PaymentState.CONFIRMED,
    )

    report = check(history)

    details = [v.detail for v in report.violations_of("transitions_valid")]
    assert any("starts in another state" in d for d in details), details
    assert any("ends in another state" in d for d in details), details


def test_an_event_wrongly_marked_stale_fails(history):
    payment = new_payment("m-5", "2.00")
    deliver(history, payment, "submitted")
    PaymentEvent.objects.create(
        payment=payment,
        kind=EventKind.PROCESSOR_EVENT,
        outcome=EventOutcome.STALE,
        event_type="settled",
        processor_event_id="evt_dropped_settled",
        from_state=PaymentState.SUBMITTED,
        to_state=PaymentState.SUBMITTED,
    )
    history["stats"]["charges"][str(payment.idempotency_key)] = 1

    report = check(history)

    details = [v.detail for v in report.violations_of("transitions_valid")]
    assert any("marked stale that was not behind" in d for d in details), details


def test_a_key_charged_twice_fails(history):
    key = str(history["payments"]["confirmed"].idempotency_key)
    history["stats"]["charges"][key] = 2

    report = check(history)

    [violation] = report.violations_of("charged_at_most_once")
    assert violation.ids == (key,)
    assert failed_checks(report) == {"charged_at_most_once"}


def test_a_charge_for_a_payment_recorded_as_rejected_fails(history):
    payment = new_payment("m-6", "4.00")
    with transaction.atomic():
        locked = Payment.objects.select_for_update().get(pk=payment.pk)
        payment_transition(payment=locked, target=PaymentState.FAILED)
        PaymentEvent.objects.create(
            payment=locked,
            kind=EventKind.SUBMISSION,
            outcome=EventOutcome.APPLIED,
            event_type="rejected",
            from_state=PaymentState.PENDING,
            to_state=PaymentState.FAILED,
        )
    clean = check(history)
    assert clean.ok, clean.render()

    history["stats"]["charges"][str(payment.idempotency_key)] = 1

    report = check(history)

    [violation] = report.violations_of("charged_at_most_once")
    assert "charged by the processor but recorded as rejected" in violation.detail
    assert violation.ids == (str(payment.id),)


def test_a_confirmed_payment_the_processor_never_charged_fails(history):
    key = str(history["payments"]["second_merchant"].idempotency_key)
    del history["stats"]["charges"][key]

    report = check(history)

    [violation] = report.violations_of("charged_at_most_once")
    assert "never charged" in violation.detail
    assert violation.ids == (str(history["payments"]["second_merchant"].id),)


def test_a_charge_for_an_unknown_key_fails(history):
    stranger = str(uuid.uuid4())
    history["stats"]["charges"][stranger] = 1

    report = check(history)

    [violation] = report.violations_of("charged_at_most_once")
    assert "belong to no payment" in violation.detail
    assert violation.ids == (stranger,)


def test_a_delivered_callback_with_no_trace_fails(history):
    history["sent"].append({"processor_event_id": "evt_vanished"})

    report = check(history)

    [violation] = report.violations_of("callbacks_accounted")
    assert violation.ids == ("evt_vanished",)
    assert "lost" in violation.detail
    assert report.checked["callbacks_accounted"]["missing"] == 1


def test_a_dropped_callback_the_pull_recovered_passes(history):
    payment = history["payments"]["confirmed"]
    settled = PaymentEvent.objects.get(payment=payment, event_type="settled", outcome="applied")
    dropped = [{**settled.payload, "processor_event_id": settled.processor_event_id}]

    report = check_invariants(
        sandbox_stats=history["stats"], callbacks_sent=history["sent"], callbacks_dropped=dropped
    )

    assert report.ok, report.render()
    assert report.checked["dropped_callbacks_recovered"] == {
        "dropped": 1,
        "recovered": 1,
        "applied": 1,
        "missing": 0,
    }


def test_a_dropped_callback_never_recovered_fails(history):
    dropped = [{"processor_event_id": "evt_never_pulled"}]

    report = check_invariants(
        sandbox_stats=history["stats"], callbacks_sent=history["sent"], callbacks_dropped=dropped
    )

    [violation] = report.violations_of("dropped_callbacks_recovered")
    assert violation.ids == ("evt_never_pulled",)
    assert "not recovered by the events pull" in violation.detail


def test_a_reused_event_id_with_another_amount_and_no_trace_of_its_own_fails(history):
    payment = history["payments"]["confirmed"]
    settled = PaymentEvent.objects.get(payment=payment, event_type="settled", outcome="applied")
    history["sent"].append(
        {
            "payment_id": str(payment.id),
            "event_type": "settled",
            "processor_event_id": settled.processor_event_id,
            "amount": "99.00",
        }
    )

    report = check(history)

    [violation] = report.violations_of("callbacks_accounted")
    assert "conflict dropped" in violation.detail
    assert violation.ids[0].startswith(settled.processor_event_id)
    assert report.checked["callbacks_accounted"]["conflicts dropped"] == 1


def test_a_reused_event_id_with_another_amount_in_triage_passes(history):
    payment = history["payments"]["confirmed"]
    settled = PaymentEvent.objects.get(payment=payment, event_type="settled", outcome="applied")
    conflict = {
        "payment_id": str(payment.id),
        "event_type": "settled",
        "processor_event_id": settled.processor_event_id,
        "amount": "99.00",
    }
    history["sent"].append(conflict)
    DeadLetter.objects.create(
        original_message_id=f"msg-{uuid.uuid4()}",
        dlq_message_id="dlq-3",
        payment_id=payment.id,
        kind="processor_event",
        group_id=str(payment.id),
        processor_event_id=settled.processor_event_id,
        body={"kind": "processor_event", **conflict},
        source=DeadLetterSource.WORKER,
        last_error_class="payments.exceptions.EventConflict",
    )

    report = check(history)

    assert report.ok, report.render()
    assert report.checked["callbacks_accounted"]["dead letter"] == 2


def test_a_delivered_callback_a_worker_is_still_retrying_is_in_flight_not_lost(history):
    payment = history["payments"]["held"]
    queue_message(payment, "evt_retrying", QueueMessageStatus.RETRYING)
    history["sent"].append({"processor_event_id": "evt_retrying"})

    report = check(history)

    assert report.ok, report.render()
    assert report.checked["callbacks_accounted"]["in flight"] == 1
    assert any("still in progress or retrying" in note for note in report.notes)


def test_callbacks_are_accounted_by_count_when_no_list_is_given(history):
    clean = check_invariants(sandbox_stats=history["stats"], callbacks_sent=None)
    assert clean.ok, clean.render()

    history["stats"]["debits"] = 20  # 40 events promised, far fewer traced

    report = check_invariants(sandbox_stats=history["stats"], callbacks_sent=None)

    [violation] = report.violations_of("callbacks_accounted")
    assert "lost" in violation.detail


def test_the_stats_list_of_delivered_callbacks_is_used_when_present(history):
    history["stats"]["callbacks_delivered"] = [*history["sent"], {"processor_event_id": "evt_x"}]

    report = check_invariants(sandbox_stats=history["stats"], callbacks_sent=None)

    assert report.violations_of("callbacks_accounted")[0].ids == ("evt_x",)


def test_a_dead_letter_without_error_history_fails(history):
    held = history["payments"]["held"]
    message_id = f"msg-{uuid.uuid4()}"
    DeadLetter.objects.create(
        original_message_id=message_id,
        dlq_message_id="dlq-1",
        payment_id=held.id,
        kind="processor_event",
        group_id=str(held.id),
        body={"kind": "processor_event"},
        source=DeadLetterSource.REDRIVE_POLICY,
    )

    report = check(history)

    [violation] = report.violations_of("dead_letters_have_history")
    assert message_id in violation.ids[0]
    [violation] = report.violations_of("dead_letters_have_error_rows")
    assert message_id in violation.ids[0]


def test_a_dead_letter_the_redrive_policy_moved_without_an_error_row_fails(history):
    held = history["payments"]["held"]
    message_id = f"msg-{uuid.uuid4()}"
    # The worker's history names an error class (it was deferred, say), but no error row of
    # its own exists: SQS moved it after receives that did no work.
    DeadLetter.objects.create(
        original_message_id=message_id,
        dlq_message_id="dlq-3",
        payment_id=held.id,
        kind="submit_payment",
        group_id=str(held.id),
        body={"kind": "submit_payment"},
        source=DeadLetterSource.REDRIVE_POLICY,
        last_error_class="payments.exceptions.ProcessorCircuitOpen",
    )

    report = check(history)

    assert report.violations_of("dead_letters_have_history") == []
    [violation] = report.violations_of("dead_letters_have_error_rows")
    assert message_id in violation.ids[0]


def test_a_dead_letter_with_the_envelope_error_only_passes(history):
    held = history["payments"]["held"]
    DeadLetter.objects.create(
        original_message_id=f"msg-{uuid.uuid4()}",
        dlq_message_id="dlq-2",
        payment_id=held.id,
        kind="processor_event",
        group_id=str(held.id),
        body={"kind": "processor_event", "dead_letter": {"error_class": "X", "error": "boom"}},
        source=DeadLetterSource.WORKER,
    )

    assert check(history).ok


def test_a_missing_stats_charges_map_is_a_violation_not_a_pass(history):
    report = check_invariants(sandbox_stats={}, callbacks_sent=history["sent"])

    [violation] = report.violations_of("charged_at_most_once")
    assert "no 'charges' map" in violation.detail


def test_the_command_exits_non_zero_and_prints_the_violation(history, tmp_path, capsys):
    history["stats"]["charges"][str(history["payments"]["returned"].idempotency_key)] = 3
    stats = tmp_path / "stats.json"
    sent = tmp_path / "sent.json"
    stats.write_text(json.dumps(history["stats"]))
    sent.write_text(json.dumps(history["sent"]))

    code = main(["--sandbox-stats", str(stats), "--callbacks-sent", str(sent)])

    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL charged_at_most_once" in out
    assert "invariants FAILED" in out


def test_the_command_exits_zero_on_a_clean_history(history, tmp_path, capsys):
    stats = tmp_path / "stats.json"
    stats.write_text(json.dumps(history["stats"]))
    sent = tmp_path / "sent.json"
    sent.write_text(json.dumps(history["sent"]))

    assert main(["--sandbox-stats", str(stats), "--callbacks-sent", str(sent)]) == 0
    assert "invariants PASSED" in capsys.readouterr().out


# --- final states against the processor's own events ---------------------------------------------


def test_every_final_state_agrees_with_the_processors_events_on_a_clean_run(history):
    held = history["payments"]["held"]  # pending behind its dead letter: a person's to decide
    settled = {
        "payment_id": str(held.id),
        "event_type": "settled",
        "amount": "5.00",
        "timestamp": "2026-11-02T12:00:00+00:00",
    }

    report = check_invariants(
        sandbox_stats=history["stats"],
        callbacks_sent=history["sent"],
        processor_events=[*history["sent"], settled],
    )

    assert report.ok, report.render()
    checked = report.checked["final_states_match_processor"]
    # The four debits of the first merchants, the two refunded ones and their two refunds sent,
    # the one paid out.
    assert (checked["compared"], checked["with a person or in hand"]) == (9, 1)


def test_a_payment_left_behind_a_settlement_the_processor_made_fails(history):
    payment = history["payments"]["second_merchant"]
    Payment.objects.filter(pk=payment.pk).update(state="submitted")

    report = check_invariants(
        sandbox_stats=history["stats"],
        callbacks_sent=history["sent"],
        processor_events=history["sent"],
    )

    [violation] = report.violations_of("final_states_match_processor")
    assert violation.ids == (f"{payment.id} (submitted, the processor says confirmed)",)


def test_a_settlement_only_the_processor_knows_of_fails_until_it_is_applied(history):
    payment = history["payments"]["second_merchant"]
    late_return = {
        "payment_id": str(payment.id),
        "event_type": "returned",
        "processor_event_id": "evt_return_never_applied",
        "timestamp": "2026-11-03T12:00:00Z",
        "amount": "3.10",
    }

    report = check_invariants(
        sandbox_stats=history["stats"],
        callbacks_sent=history["sent"],
        processor_events=[*history["sent"], late_return],
    )

    [violation] = report.violations_of("final_states_match_processor")
    assert "the processor says returned" in violation.ids[0]


def test_without_the_processors_events_the_final_states_are_not_compared(history):
    report = check_invariants(sandbox_stats=history["stats"], callbacks_sent=history["sent"])

    assert report.checked["final_states_match_processor"] == {"processor events": "not recorded"}
