"""``manage.py totals_rebuild``: the totals PostgreSQL keeps by trigger, rebuilt from the rows
they total, after maintenance that wrote with the triggers off: the merchants' day totals the
exposure limits and the fraud rules read, from the payments
(``payments.services.limits.day_totals_rebuild``), and the available totals a payout reads, from
the ledger (``payments.services.available.available_totals_rebuild``)."""

from django.core.management.base import BaseCommand
from django.db import connection

from payments.services.available import available_totals_rebuild
from payments.services.limits import day_totals_rebuild


class Command(BaseCommand):
    help = (
        "Rebuild the totals the database keeps by trigger: the merchants' day totals the "
        "exposure limits read (from the payments) and the available totals payouts read (from "
        "the ledger), each under a lock that holds that table's writers until it is done. Run "
        "it after maintenance in a session with session_replication_role = replica, which "
        "fires no trigger."
    )

    def handle(self, *args, **options):
        if connection.vendor != "postgresql":
            self.stdout.write("nothing to rebuild: the totals are kept on PostgreSQL only")
            return
        days = day_totals_rebuild()
        self.stdout.write(f"day totals rebuilt: {days} rows from the payments")
        available = available_totals_rebuild()
        self.stdout.write(f"available totals rebuilt: {available} rows from the ledger")
