"""What an outage's parking cost, read after a run: ``python -m bench.outage_counts``.

Reads the demo's database by default (``var/demo.sqlite3``; ``DATABASE_URL`` names another) and
prints, for the submissions that waited out the processor's outage: the outage holds, the parked
rows, the copies the holds' releases sent (each received copy is a queue record whose
deduplication id carries the release mark; a copy SQS dropped as a repeat is not one, and each
round's copies carry an id of their own), how many of those copies were parked again, and the
breaker's transitions by kind. docs/benchmarks.md ("The outage's parking") has the figures.
"""

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.test")
os.environ.setdefault("DATABASE_URL", f"sqlite:///{ROOT / 'var' / 'demo.sqlite3'}")

import django  # noqa: E402

django.setup()

from django.db.models import Count  # noqa: E402

from callbacks.models import HoldKind, ParkedMessage, PaymentHold, QueueMessage  # noqa: E402
from callbacks.services.republish import RELEASE_MARK  # noqa: E402
from payments.models import CircuitBreakerTransition, ProcessorAttempt  # noqa: E402


def outage_counts() -> dict[str, object]:
    outage = PaymentHold.objects.filter(kind=HoldKind.OUTAGE)
    copies = QueueMessage.objects.filter(deduplication_id__contains=RELEASE_MARK)
    submissions = QueueMessage.objects.filter(kind="submit_payment")
    return {
        "payments held for the outage": outage.values("payment_id").distinct().count(),
        "outage holds": outage.count(),
        "parked rows (outage holds)": ParkedMessage.objects.filter(
            hold__kind=HoldKind.OUTAGE
        ).count(),
        "release copies received": copies.count(),
        "release copies parked again": copies.filter(status="parked").count(),
        "submission records parked": submissions.filter(status="parked").count(),
        "processor calls": ProcessorAttempt.objects.count(),
        "breaker transitions": dict(
            CircuitBreakerTransition.objects.values_list("kind")
            .annotate(n=Count("id"))
            .order_by("kind")
        ),
    }


def main() -> None:
    for name, value in outage_counts().items():
        print(f"{name:<32} {value}")


if __name__ == "__main__":
    main()
