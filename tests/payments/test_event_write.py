"""The one write of a processor event's rows (``payments.services.writes``): declared once,
written alike by PostgreSQL's single statement and the portable ORM sequence."""

import pytest
from django.db import connection, connections, transaction
from django.forms.models import model_to_dict

from payments import event_sql
from payments.models import LedgerEntry, MerchantReturnDay, PaymentEvent, PaymentState
from payments.services import payment_apply_event, payment_lock
from payments.services.events import _event_row, _event_rows
from payments.services.transitions import transition_move
from payments.services.writes import Move
from tests.factories import PaymentFactory, processor_event

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize("shape", ["settlement", "return", "stale"])
def test_the_statement_has_a_parameter_for_every_placeholder(shape):
    """The statement and its parameters are built together, part by part: whatever the shape,
    the count and the order of one follow the other."""
    state = {"settlement": "submitted", "return": "confirmed", "stale": "confirmed"}[shape]
    payment = PaymentFactory(state=state)
    event = processor_event(payment, "returned" if shape == "return" else "settled")
    with transaction.atomic():
        locked = payment_lock(payment.pk)
        target = "returned" if shape == "return" else "confirmed"
        move = None if shape == "stale" else transition_move(locked, target)
        write = _event_rows(locked, event, move, _event_row(locked, event, "applied", "", "", ""))
    db = connections[connection.alias]
    sql, parts = event_sql._event_statement(
        db.vendor,
        moved=Move.FIELDS if move else None,
        ledger=move is not None and move.ledger is not None,
        counted=move is not None and move.counts is not None,
    )
    params = [value for part in parts for value in part(write, db)]

    assert sql.count("%s") == len(params)
    assert (" moved AS " in sql, " ledger AS " in sql) == (move is not None, move is not None)
    assert (" counted AS " in sql) == (shape == "settlement")


def test_the_statement_writes_the_fields_the_move_declares():
    db = connections[connection.alias]
    sql, _ = event_sql._event_statement(db.vendor, moved=Move.FIELDS, ledger=True, counted=True)
    update = sql[sql.index("UPDATE") : sql.index("WHERE")]

    assert [column.split(" = ")[0].strip(' "') for column in update.split("SET")[1].split(",")] == (
        list(Move.FIELDS)
    )


def _rows_of_a_settlement(monkeypatch, *, one_statement: bool) -> dict:
    monkeypatch.setattr("payments.services.writes._one_statement", lambda: one_statement)
    payment = PaymentFactory(state="submitted", merchant_id=f"merchant-{one_statement}")
    payment_apply_event(event=processor_event(payment, "settled"))
    payment.refresh_from_db()
    # What differs between two payments and two events, whoever writes them.
    ignore = {"id", "payment", "merchant_id", "processor_event_id", "payload"}

    def rows(model, **where):
        return [
            {k: v for k, v in model_to_dict(row).items() if k not in ignore}
            for row in model.objects.filter(**where)
        ]

    return {
        "state": payment.state,
        "ledger": rows(LedgerEntry, payment=payment),
        "log": rows(PaymentEvent, payment=payment, kind="processor_event"),
        "counters": rows(MerchantReturnDay, merchant_id=payment.merchant_id),
    }


def test_both_backends_write_the_same_rows_from_the_same_declaration(monkeypatch):
    one_statement = _rows_of_a_settlement(monkeypatch, one_statement=True)
    row_by_row = _rows_of_a_settlement(monkeypatch, one_statement=False)

    assert one_statement == row_by_row
    assert one_statement["state"] == PaymentState.CONFIRMED
    assert [row["kind"] for row in one_statement["ledger"]] == ["credit"]
    assert [row["debits"] for row in one_statement["counters"]] == [1]


def _rows_of_a_refund(monkeypatch, *, one_statement: bool, final: str) -> dict:
    """A refund made, then submitted and ``final`` (settled or failed) by the processor."""
    from decimal import Decimal

    from payments.services.refunds import refund_create

    monkeypatch.setattr("payments.services.writes._one_statement", lambda: one_statement)
    debit = PaymentFactory(state="confirmed", merchant_id=f"merchant-rf-{one_statement}")
    refund = refund_create(payment_id=debit.id, amount=Decimal("10.00"))
    for event_type in ("submitted", final):
        event = processor_event(refund, event_type, direction="credit")
        payment_apply_event(event=event)
    refund.refresh_from_db()
    ignore = {"id", "payment", "merchant_id", "processor_event_id", "payload"}
    ignore |= {"created_at", "posted_at"}

    def rows(model, **where):
        return [
            {k: v for k, v in model_to_dict(row).items() if k not in ignore}
            for row in model.objects.filter(**where)
        ]

    entries = LedgerEntry.objects.filter(payment=refund)
    return {
        "state": refund.state,
        "ledger": rows(LedgerEntry, payment=refund),
        "posted": [entry.posted_at is not None for entry in entries],
        "log": rows(PaymentEvent, payment=refund, kind="processor_event"),
    }


@pytest.mark.parametrize(
    ("final", "state", "status"),
    [("settled", "confirmed", "posted"), ("failed", "failed", "archived")],
)
def test_both_backends_move_a_refunds_entry_alike(monkeypatch, final, state, status):
    one_statement = _rows_of_a_refund(monkeypatch, one_statement=True, final=final)
    row_by_row = _rows_of_a_refund(monkeypatch, one_statement=False, final=final)

    assert one_statement == row_by_row
    assert one_statement["state"] == state
    assert [(row["kind"], row["status"]) for row in one_statement["ledger"]] == [("refund", status)]
    assert one_statement["posted"] == [status == "posted"]


def _rows_of_dishonor_answers(monkeypatch, *, one_statement: bool) -> dict:
    """A return, then a contest that overtakes its dishonor, and a redelivery of each."""
    from payments.models import ReturnDishonor

    monkeypatch.setattr("payments.services.writes._one_statement", lambda: one_statement)
    payment = PaymentFactory(state="submitted", merchant_id=f"merchant-dh-{one_statement}")
    for event_type, code in (
        ("settled", ""),
        ("returned", "R10"),
        ("dishonor_contested", "R76"),
        ("return_dishonored", "R61"),
    ):
        event = processor_event(payment, event_type, reason_code=code)
        payment_apply_event(event=event)
        payment_apply_event(event=event)
    payment.refresh_from_db()
    ignore = {"id", "payment", "merchant_id", "processor_event_id", "payload", "ach_return"}
    ignore |= {"idempotency_key", "dishonored_event_id", "contested_event_id"}

    def rows(model, **where):
        return [
            {k: v for k, v in model_to_dict(row).items() if k not in ignore}
            for row in model.objects.filter(**where)
        ]

    return {
        "state": payment.state,
        "ledger": rows(LedgerEntry, payment=payment),
        "log": rows(PaymentEvent, payment=payment, kind="processor_event"),
        "counters": rows(MerchantReturnDay, merchant_id=payment.merchant_id),
        "dishonor": rows(ReturnDishonor, payment=payment),
    }


def test_both_backends_write_the_same_rows_for_dishonor_answers(monkeypatch):
    one_statement = _rows_of_dishonor_answers(monkeypatch, one_statement=True)
    row_by_row = _rows_of_dishonor_answers(monkeypatch, one_statement=False)

    assert one_statement == row_by_row
    assert one_statement["state"] == PaymentState.RETURNED
    assert sorted(row["kind"] for row in one_statement["ledger"]) == [
        "credit",
        "recredit",
        "recredit_reversal",
        "reversal",
    ]
    assert [(row["event_type"], row["outcome"]) for row in one_statement["log"]][-4:] == [
        ("dishonor_contested", "recorded"),
        ("dishonor_contested", "duplicate"),
        ("return_dishonored", "recorded"),
        ("return_dishonored", "duplicate"),
    ]
    assert [(r["returns"], r["unauthorized_returns"]) for r in one_statement["counters"]] == [
        (1, 1)
    ]
