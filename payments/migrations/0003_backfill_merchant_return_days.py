"""Count the debits settled before the return-rate counters existed, so the rates of the first
window after the upgrade are not computed against too few debits.

Confirmed payments count on the day (UTC, as the counters do) they were confirmed
(``state_changed_at``: nothing moves a confirmed payment but a return). Returns from before the upgrade carry no reason code in a
table, so they cannot be categorised and are not counted.
"""

from datetime import UTC, timedelta

from django.db import migrations
from django.db.models import Count
from django.db.models.functions import TruncDate
from django.utils import timezone

# The longest window worth backfilling: older days never enter a rate.
BACKFILL_DAYS = 120


def backfill(apps, schema_editor):
    payment = apps.get_model("payments", "Payment")
    day_model = apps.get_model("payments", "MerchantReturnDay")
    if day_model.objects.exists():
        return
    since = timezone.now() - timedelta(days=BACKFILL_DAYS)
    rows = (
        payment.objects.filter(state="confirmed", state_changed_at__gte=since)
        .annotate(day=TruncDate("state_changed_at", tzinfo=UTC))
        .values("merchant_id", "day")
        .annotate(n=Count("id"))
        .order_by()
    )
    day_model.objects.bulk_create(
        (day_model(merchant_id=r["merchant_id"], day=r["day"], debits=r["n"]) for r in rows),
        batch_size=1000,
    )


class Migration(migrations.Migration):
    dependencies = [("payments", "0002_ach_returns_ledger_reversal_return_rate_counters")]

    operations = [migrations.RunPython(backfill, migrations.RunPython.noop)]
