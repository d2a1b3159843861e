"""The merchants' day totals the database keeps (``MerchantDayTotal`` and its adjustments, a
trigger on the payments' table, migration 0045) always add up to what the payments that count
add up to, per merchant, direction, currency and Eastern day: through creates, every way a
payment stops counting, rows moved in time, deletes, concurrent creates and the migration's
fill of the payments already there; and the limits and the fraud rules read the same figures
from them as from the payments."""

import threading
from datetime import timedelta
from decimal import Decimal

import pytest
from django.db import connection, connections
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

from payments.banking_days import ACH_TIME_ZONE
from payments.models import (
    MerchantDayAdjustment,
    MerchantDayTotal,
    Payment,
    PaymentDirection,
    PaymentPurpose,
    PaymentState,
)
from payments.services.limits import (
    NOT_COUNTED,
    counted_since,
    counted_sums,
    effective_banking_day,
)
from tests.factories import PaymentFactory, account_validated

pytestmark = pytest.mark.django_db


def from_totals() -> dict:
    """Each (merchant, direction, currency, day)'s amount and entries from the totals and
    their adjustments, days that net to nothing left out."""
    figures: dict = {}
    for model in (MerchantDayTotal, MerchantDayAdjustment):
        for row in model.objects.all():
            key = (row.merchant_id, row.direction, row.currency, row.day)
            amount, entries = figures.get(key, (Decimal("0.00"), 0))
            figures[key] = (amount + row.amount, entries + row.entries)
    return {key: value for key, value in figures.items() if value != (Decimal("0.00"), 0)}


def from_payments() -> dict:
    """The same figures summed over the payments that count."""
    figures: dict = {}
    counted = Payment.objects.exclude(state__in=NOT_COUNTED).exclude(
        purpose=PaymentPurpose.MICRO_ENTRY
    )
    for payment in counted:
        day = payment.created_at.astimezone(ACH_TIME_ZONE).date()
        key = (payment.merchant_id, payment.direction, payment.currency, day)
        amount, entries = figures.get(key, (Decimal("0.00"), 0))
        figures[key] = (amount + payment.amount, entries + 1)
    return figures


def test_new_entries_add_to_their_day_and_micro_entries_do_not():
    PaymentFactory(merchant_id="m-a", amount=Decimal("10.00"))
    PaymentFactory(merchant_id="m-a", amount=Decimal("2.50"))
    PaymentFactory(
        merchant_id="m-a",
        amount=Decimal("7.00"),
        direction=PaymentDirection.CREDIT,
        purpose=PaymentPurpose.PAYOUT,
    )
    PaymentFactory(merchant_id="m-b", amount=Decimal("1.00"))
    PaymentFactory(
        merchant_id="m-a",
        amount=Decimal("0.07"),
        purpose=PaymentPurpose.MICRO_ENTRY,
        account_validation=account_validated("tok_validated_0001", "m-a"),
    )

    totals = from_totals()

    assert totals == from_payments()
    today = timezone.now().astimezone(ACH_TIME_ZONE).date()
    assert totals[("m-a", "debit", "USD", today)] == (Decimal("12.50"), 2)
    assert totals[("m-a", "credit", "USD", today)] == (Decimal("7.00"), 1)
    # The creates only append: no total's row is written, so none is waited on.
    assert not MerchantDayTotal.objects.exists()
    assert MerchantDayAdjustment.objects.count() == 5 - 1  # not the micro-entry


def test_a_read_under_the_exposure_lock_folds_its_own_changes_into_the_totals():
    from django.db import transaction

    from payments.kernel.locks import exposure_lock

    now = timezone.now()
    today = effective_banking_day(now)
    day_starts = counted_since(today, 1)
    for amount in ("10.00", "2.50", "1.00"):
        PaymentFactory(merchant_id="m-a", amount=Decimal(amount))
    PaymentFactory(merchant_id="m-b", amount=Decimal("4.00"))
    sums = {
        "merchant_id": "m-a",
        "direction": "debit",
        "currency": "USD",
        "today": today,
        "day_starts": day_starts,
        "since": counted_since(today, 31),
    }
    unlocked = counted_sums(**sums)

    with transaction.atomic():
        exposure_lock("m-a", "debit", "USD")
        folding = counted_sums(**sums, locked=True)
    after = counted_sums(**sums, locked=True)

    assert unlocked == folding == after == (Decimal("13.50"), Decimal("0.00"))
    assert MerchantDayTotal.objects.get(merchant_id="m-a").entries == 3
    # Only that merchant's, direction's and currency's changes are folded.
    assert list(MerchantDayAdjustment.objects.values_list("merchant_id", flat=True)) == ["m-b"]
    assert from_totals() == from_payments()


@pytest.mark.parametrize("state", [PaymentState.FAILED, PaymentState.CANCELED])
def test_an_entry_that_stops_counting_is_taken_off_its_day(state):
    kept = PaymentFactory(merchant_id="m-a", amount=Decimal("10.00"))
    gone = PaymentFactory(merchant_id="m-a", amount=Decimal("4.00"))

    Payment.objects.filter(pk=gone.pk).update(state=state)
    kept.submit()  # a transition and a whole row's save, as the services make them
    kept.save()

    assert from_totals() == from_payments()
    assert from_totals()[
        ("m-a", "debit", "USD", kept.created_at.astimezone(ACH_TIME_ZONE).date())
    ] == (
        Decimal("10.00"),
        1,
    )
    # The worker's failure appends; it never waits on a total's row.
    assert MerchantDayAdjustment.objects.filter(amount__lt=0).get().amount == Decimal("-4.00")


def test_a_returned_entry_still_counts():
    payment = PaymentFactory(merchant_id="m-a", amount=Decimal("10.00"))

    for state in (PaymentState.SUBMITTED, PaymentState.CONFIRMED, PaymentState.RETURNED):
        Payment.objects.filter(pk=payment.pk).update(state=state)

    assert from_totals() == from_payments() != {}
    assert MerchantDayAdjustment.objects.count() == 1  # the create's, nothing for the moves


def test_rows_moved_in_time_changed_or_deleted_keep_the_totals_true():
    moved = PaymentFactory(merchant_id="m-a", amount=Decimal("10.00"))
    changed = PaymentFactory(merchant_id="m-a", amount=Decimal("3.00"))
    deleted = PaymentFactory(merchant_id="m-b", amount=Decimal("5.00"))
    failed_then_moved = PaymentFactory(merchant_id="m-a", amount=Decimal("8.00"))

    # What tests and data fixes do: a row put days back, another's amount or merchant changed.
    Payment.objects.filter(pk=moved.pk).update(created_at=timezone.now() - timedelta(days=3))
    Payment.objects.filter(pk=changed.pk).update(amount=Decimal("30.00"), merchant_id="m-c")
    Payment.objects.filter(pk=failed_then_moved.pk).update(state=PaymentState.FAILED)
    Payment.objects.filter(pk=failed_then_moved.pk).update(
        created_at=timezone.now() - timedelta(days=1)
    )
    Payment.objects.filter(pk=deleted.pk).delete()

    assert from_totals() == from_payments()


def test_the_limits_and_the_rules_read_the_same_sums_as_the_payments_give(settings):
    now = timezone.now()
    today = effective_banking_day(now)
    day_starts, since = counted_since(today, 1), counted_since(today, 31)
    for days_back, amount in ((0, "10.00"), (0, "5.00"), (2, "7.00"), (9, "1.25"), (60, "99.00")):
        payment = PaymentFactory(merchant_id="m-a", amount=Decimal(amount))
        Payment.objects.filter(pk=payment.pk).update(created_at=now - timedelta(days=days_back))
    failed = PaymentFactory(merchant_id="m-a", amount=Decimal("50.00"))
    Payment.objects.filter(pk=failed.pk).update(state=PaymentState.FAILED)

    on_day, before = counted_sums(
        merchant_id="m-a",
        direction="debit",
        currency="USD",
        today=today,
        day_starts=day_starts,
        since=since,
    )

    counted = Payment.objects.filter(merchant_id="m-a").exclude(state__in=NOT_COUNTED)
    assert on_day == sum((p.amount for p in counted if p.created_at > day_starts), Decimal("0.00"))
    assert before == sum(
        (p.amount for p in counted if since < p.created_at <= day_starts), Decimal("0.00")
    )
    assert on_day >= Decimal("15.00")


@pytest.mark.django_db(transaction=True)
def test_concurrent_creates_of_one_merchant_keep_its_total_true():
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def create(offset: int) -> None:
        try:
            start.wait(10)
            for n in range(40):
                PaymentFactory(
                    merchant_id="m-busy",
                    amount=Decimal("1.00") + Decimal(offset) / 100,
                    source_token=f"tok_busy_{offset}_{n:04d}",
                )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    def fold() -> None:
        # A create's read under the lock, folding what the others append meanwhile.
        from django.db import transaction

        from payments.kernel.locks import exposure_lock

        try:
            start.wait(10)
            today = effective_banking_day(timezone.now())
            for _ in range(20):
                with transaction.atomic():
                    exposure_lock("m-busy", "debit", "USD")
                    counted_sums(
                        merchant_id="m-busy",
                        direction="debit",
                        currency="USD",
                        today=today,
                        day_starts=counted_since(today, 1),
                        since=counted_since(today, 31),
                        locked=True,
                    )
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=create, args=(offset,)) for offset in (0, 1)]
    threads.append(threading.Thread(target=fold))
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)

    assert not errors
    totals = from_totals()
    assert totals == from_payments()
    ((amount, entries),) = totals.values()
    assert (amount, entries) == (Decimal("80.40"), 80)


@pytest.mark.django_db(transaction=True)
def test_the_migration_fills_the_totals_from_the_payments_already_there():
    before = [("payments", "0044_micro_entry_payments")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        old = executor.loader.project_state(before).apps.get_model("payments", "Payment")
        now = timezone.now()
        for days_back, amount, state in (
            (0, "10.00", "pending"),
            (0, "2.00", "failed"),
            (1, "4.00", "confirmed"),
            (40, "6.00", "returned"),
        ):
            payment = old.objects.create(
                merchant_id="m-old",
                amount=Decimal(amount),
                currency="USD",
                source_token="tok_old_account_0001",
                state=state,
            )
            old.objects.filter(pk=payment.pk).update(created_at=now - timedelta(days=days_back))
    finally:
        MigrationExecutor(connection).migrate(
            MigrationExecutor(connection).loader.graph.leaf_nodes()
        )

    assert from_totals() == from_payments()
    assert sum(entries for _, entries in from_totals().values()) == 3
    # And the trigger runs from there on.
    PaymentFactory(merchant_id="m-old", amount=Decimal("1.00"))
    assert from_totals() == from_payments()
