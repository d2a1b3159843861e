"""The demo's banking days, compressed into seconds (``DEMO_BACKEND=nacha make demo``).

ACH settles on an entry's effective entry date, hours or a day after its file went out, and a
bank's returns and NOCs come after that. The demo cannot wait for the calendar, so this
process lets the day pass as soon as a file is delivered, each round:

1. settle: the module's own step (``nacha_entries_settle``), told the time is the end of the
   latest effective entry date of a delivered file, promises each delivered entry's
   ``settled`` event (through the outbox, applied by the workers as ever);
2. answer: the sandbox bank (``sandbox.bank``) answers a delivered file by its rules once every
   payment of it has been applied as settled (or failed), the bank's clock set to the morning
   after the file's effective date, as a return or NOC of the next banking day would be.

So a return reverses a confirmed payment's credit, as a return after settlement does. Nothing
here is the module's: a host lets the days pass by themselves (``nacha_send`` settles by the
calendar). Run as ``python demo/bank_day.py --every 2`` with the demo's environment.
"""

import argparse
import os
import sys
import time
from datetime import datetime, timedelta
from datetime import time as clock
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# The bank's answers are written at this hour of the day after the effective entry date.
ANSWER_HOUR = 9


def settle_round() -> int:
    """Promise the settlement of every delivered entry, as if its effective date had passed."""
    from bank.nacha.models import NachaFile
    from bank.nacha.services import SETTLED_AT, nacha_entries_settle
    from bank.nacha.windows import EASTERN

    latest = (
        NachaFile.objects.filter(delivered_at__isnull=False, entries__settled_event_at__isnull=True)
        .order_by("-effective_entry_date")
        .values_list("effective_entry_date", flat=True)
        .first()
    )
    if latest is None:
        return 0
    end_of_day = datetime.combine(latest, SETTLED_AT, tzinfo=EASTERN) + timedelta(minutes=1)
    return nacha_entries_settle(now=end_of_day)


def files_to_answer() -> dict[str, datetime]:
    """The delivered files each of whose payments the workers have taken past ``submitted``
    (settled, or failed), with the moment the bank answers them."""
    from bank.nacha.models import NachaFile
    from bank.nacha.windows import EASTERN
    from payments.models import PaymentState

    moving = (PaymentState.PENDING, PaymentState.SUBMITTED)
    ready = {}
    for cut in NachaFile.objects.filter(delivered_at__isnull=False).exclude(
        entries__payment__state__in=moving
    ):
        morning = datetime.combine(
            cut.effective_entry_date + timedelta(days=1), clock(ANSWER_HOUR), tzinfo=EASTERN
        )
        ready[cut.name] = morning
    return ready


def answer_round(outbound: str, inbound: str) -> list[str]:
    """Answer the files that are ready, each at its own morning (``files_to_answer``)."""
    from sandbox.bank import bank_answer_files

    written = []
    for name, morning in sorted(files_to_answer().items()):
        if (Path(outbound) / name).exists():
            written += bank_answer_files(
                outbound=outbound, inbound=inbound, now=morning, only={name}
            )
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--every", type=float, default=2.0, help="seconds between rounds")
    args = parser.parse_args(argv)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    import django

    django.setup()
    from django.db import DatabaseError

    from bank import conf
    from bank.nacha.transport_options import parse_transport

    transport = parse_transport(conf.NACHA_TRANSPORT)
    if transport is None or transport["kind"] != "directory":
        sys.exit("the demo's bank needs BANK['NACHA_TRANSPORT'] of kind directory")
    while True:
        try:
            settled = settle_round()
            written = answer_round(transport["outbound"], transport["inbound"])
        except DatabaseError as exc:  # SQLite busy under the demo's load: the next round
            print(f"bank day round failed, trying again: {exc}", flush=True)
        else:
            if settled or written:
                answered = ", ".join(written) or "nothing"
                print(f"settled {settled} entries; answered with {answered}", flush=True)
        time.sleep(args.every)


if __name__ == "__main__":
    sys.exit(main())
