"""One service builds a payment of any direction and purpose (``payment_build``), in the
caller's transaction without a savepoint (``create_transaction``), after its checks read in one
statement (``payments.kernel.reads``)."""

import uuid
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections, transaction
from django.db.models import Sum
from django.utils import timezone

from payments.exceptions import MoneyOutRefused
from payments.kernel.locks import exposure_lock_sql
from payments.kernel.reads import PreparedRead, querysets_read
from payments.models import (
    AccountBlock,
    AccountBlockScope,
    ExposureLimit,
    LedgerEntry,
    LedgerEntryKind,
    LedgerEntryStatus,
    NocStatus,
    NotificationOfChange,
    OriginatorProfile,
    OutboxMessage,
    Payment,
    PaymentDirection,
    PaymentEvent,
    PaymentPurpose,
)
from payments.services.create import payment_build
from payments.services.fraud import account_blocks_queryset
from payments.services.limits import exposure_limits_queryset
from payments.services.refunds import refund_create
from payments.webhooks.models import Event
from tests.factories import PaymentFactory

pytestmark = pytest.mark.django_db

TOKEN = "tok_build_000001"


def _build(**fields) -> Payment:
    values = {
        "merchant_id": "m-build",
        "amount": Decimal("12.50"),
        "currency": "USD",
        "account_token": TOKEN,
        "sec_code": "PPD",
        "entry_description": "",
    }
    values.update(fields)
    return payment_build(**values)


def test_a_debit_is_built_with_its_rows_and_no_ledger_entry():
    payment = _build(audit={"sec_code": "PPD"})

    event = PaymentEvent.objects.get(payment=payment)
    assert event.payload == {
        "amount": "12.50",
        "currency": "USD",
        "merchant_id": "m-build",
        "sec_code": "PPD",
    }
    assert OutboxMessage.objects.filter(group_id=str(payment.id)).count() == 1
    assert Event.objects.get(object_id=str(payment.id)).type == "payment.created"
    assert not LedgerEntry.objects.filter(payment=payment).exists()


@pytest.mark.parametrize(
    ("purpose", "kind"),
    [
        (PaymentPurpose.PAYOUT, LedgerEntryKind.PAYOUT),
        (PaymentPurpose.REFUND, LedgerEntryKind.REFUND),
    ],
)
def test_a_credit_is_built_with_its_pending_entry_of_its_purpose(purpose, kind):
    refund_of = PaymentFactory(merchant_id="m-build") if purpose == PaymentPurpose.REFUND else None
    payment = _build(direction=PaymentDirection.CREDIT, purpose=purpose, refund_of=refund_of)

    entry = LedgerEntry.objects.get(payment=payment)
    assert (entry.kind, entry.status, entry.amount) == (
        kind,
        LedgerEntryStatus.PENDING,
        Decimal("-12.50"),
    )
    assert Event.objects.get(object_id=str(payment.id)).type == f"{purpose}.created"


def test_a_payment_held_until_later_is_built_without_its_submit_command():
    until = timezone.now() + timedelta(days=2)
    payment = _build(hold_until=until)

    assert Payment.objects.get(pk=payment.pk).hold_until == until
    assert PaymentEvent.objects.get(payment=payment).payload["hold_until"] == until.isoformat()
    assert not OutboxMessage.objects.filter(group_id=str(payment.id)).exists()


def test_a_refused_create_leaves_the_callers_transaction_usable_and_writes_nothing():
    debit = PaymentFactory(merchant_id="m-build")  # pending: not refundable
    with transaction.atomic():
        with pytest.raises(MoneyOutRefused):
            refund_create(payment_id=debit.id, amount=Decimal("1.00"))
        # No savepoint was rolled back to: the caller's transaction goes on.
        assert Payment.objects.filter(refund_of=debit).count() == 0
        PaymentFactory(merchant_id="m-build")

    assert Payment.objects.filter(merchant_id="m-build").count() == 2


# --- several reads in one statement -------------------------------------------------------------


def test_querysets_read_gives_the_rows_the_orm_gives_in_one_statement(django_assert_num_queries):
    OriginatorProfile.objects.create(
        merchant_id="m-build",
        company_name="BUILD CO",
        company_identification="1234567890",
        allowed_sec_codes=["PPD", "WEB"],
    )
    payment = PaymentFactory(merchant_id="m-build", amount=Decimal("1234.56"), metadata={"n": 1.5})
    querysets = [
        OriginatorProfile.objects.filter(merchant_id="m-build").only("allowed_sec_codes"),
        Payment.objects.filter(pk=payment.pk),
        NotificationOfChange.objects.filter(source_token=TOKEN, status=NocStatus.OPEN),
    ]
    expected = [list(queryset) for queryset in querysets]

    with django_assert_num_queries(1):
        profiles, payments, nocs = querysets_read(querysets)

    assert [profiles, payments, nocs] == expected
    assert profiles[0].allowed_sec_codes == ["PPD", "WEB"]
    assert profiles[0].get_deferred_fields() == expected[0][0].get_deferred_fields()
    read, orm = payments[0], expected[1][0]
    for field in Payment._meta.concrete_fields:
        assert getattr(read, field.attname) == getattr(orm, field.attname), field.name
    assert read.metadata == {"n": 1.5} and isinstance(read.amount, Decimal)


def test_querysets_read_gives_a_values_reads_rows_as_the_orm_gives_them():
    for amount in ("1.25", "2.50", "3.75"):
        PaymentFactory(merchant_id="m-sums", amount=Decimal(amount))
    PaymentFactory(merchant_id="m-other", amount=Decimal("99.00"))
    summed = (
        Payment.objects.filter(merchant_id="m-sums")
        .order_by()
        .values("merchant_id")
        .annotate(total=Sum("amount"))
        .values("total")
    )
    none = summed.filter(currency="EUR")

    payments, totals, nothing = querysets_read(
        [Payment.objects.filter(merchant_id="m-other"), summed, none]
    )

    assert totals == list(summed) == [{"total": Decimal("7.50")}]
    assert nothing == list(none) == []
    assert [payment.amount for payment in payments] == [Decimal("99.00")]


@pytest.mark.django_db(transaction=True)
def test_querysets_read_takes_its_locks_for_the_transaction():
    lock = exposure_lock_sql("m-build", "debit", "USD")
    other = connections.create_connection("default")
    try:
        with transaction.atomic():
            querysets_read([Payment.objects.filter(merchant_id="m-build")], locks=[lock])
            with other.cursor() as cursor:
                cursor.execute(f"SELECT pg_try_advisory_lock({lock.params[0]})")
                held_elsewhere = not cursor.fetchone()[0]
        with other.cursor() as cursor:
            cursor.execute(f"SELECT pg_try_advisory_xact_lock({lock.params[0]})")
            free_after = cursor.fetchone()[0]
    finally:
        other.close()

    assert (held_elsewhere, free_after) == (True, True)
    assert connection.in_atomic_block is False


# --- reads compiled once per shape -------------------------------------------------------------


def _blocks(*, merchant_id: str, account_token: str, new_authorization: bool):
    built.append(new_authorization)
    return account_blocks_queryset(
        merchant_id=merchant_id, account_token=account_token, new_authorization=new_authorization
    )


built: list[bool] = []


def test_a_prepared_read_gives_its_querysets_rows_building_each_shape_once():
    built.clear()
    read = PreparedRead(_blocks, slots=("merchant_id", "account_token"))
    AccountBlock.objects.create(
        merchant_id="m-build", account_token=TOKEN, scope=AccountBlockScope.MERCHANT, reason="R10"
    )
    AccountBlock.objects.create(
        merchant_id="m-other",
        account_token="tok_build_000002",
        scope=AccountBlockScope.ALL_MERCHANTS,
        reason="R17",
    )
    calls = [
        ("m-build", TOKEN, False),
        ("m-build", TOKEN, True),
        ("m-other", TOKEN, False),
        ("m-build", "tok_build_000002", False),
        ("m-build", "tok_build_000002", True),
    ]
    reads = [
        read.read(merchant_id=merchant, account_token=token, new_authorization=new)
        for merchant, token, new in calls
    ]

    rows = querysets_read(reads)
    compiled = list(built)
    expected = [list(item.queryset()) for item in reads]

    assert [[block.pk for block in found] for found in rows] == [
        [block.pk for block in found] for found in expected
    ]
    assert [len(found) for found in rows] == [1, 0, 0, 1, 1]
    # One build per shape (new_authorization), whatever the values.
    assert compiled == [False, True]


def test_a_prepared_read_takes_uuid_slots_and_gives_each_call_its_own_rows():
    first, second = PaymentFactory(amount=Decimal("1.00")), PaymentFactory(amount=Decimal("2.00"))
    read = PreparedRead(
        lambda *, payment_id: Payment.objects.filter(pk=payment_id).only("amount"),
        uuid_slots=("payment_id",),
    )

    rows = querysets_read(
        [read.read(payment_id=payment_id) for payment_id in (first.pk, second.pk, uuid.uuid4())]
    )

    assert [[payment.pk for payment in found] for found in rows] == [[first.pk], [second.pk], []]
    assert [payment.amount for payment in rows[0] + rows[1]] == [Decimal("1.00"), Decimal("2.00")]
    assert len(read._compiled) == 1


def test_a_prepared_read_reads_in_the_statement_of_the_other_reads(django_assert_num_queries):
    read = PreparedRead(exposure_limits_queryset, slots=("merchant_id", "direction", "currency"))
    ExposureLimit.objects.create(
        merchant_id="m-build", direction="debit", currency="USD", daily_limit=Decimal("9.00")
    )

    with django_assert_num_queries(1):
        limits, payments = querysets_read(
            [
                read.read(merchant_id="m-build", direction="debit", currency="USD"),
                Payment.objects.filter(merchant_id="m-build"),
            ]
        )

    assert [row.daily_limit for row in limits] == [Decimal("9.00")]
    assert payments == []


def test_a_prepared_read_whose_lookup_rewrites_a_slot_is_refused():
    read = PreparedRead(
        lambda *, token: Payment.objects.filter(source_token__startswith=token), slots=("token",)
    )

    with pytest.raises(ValueError, match="slots as given"):
        querysets_read([read.read(token="tok_")])
