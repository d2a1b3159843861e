"""``manage.py available_totals_rebuild``: the merchants' available totals, which a payout reads,
rebuilt from the ledger (``payments.services.available.available_totals_rebuild``), after
maintenance that wrote to the ledger with its triggers off."""

from django.core.management.base import BaseCommand
from django.db import connection

from payments.services.available import available_totals_rebuild


class Command(BaseCommand):
    help = (
        "Rebuild the available totals payouts read from every ledger entry, under a lock that "
        "holds the ledger's writers (and payouts) until it is done. Run it after maintenance in a "
        "session with session_replication_role = replica, which fires no trigger."
    )

    def handle(self, *args, **options):
        if connection.vendor != "postgresql":
            self.stdout.write("nothing to rebuild: the totals are kept on PostgreSQL only")
            return
        rows = available_totals_rebuild()
        self.stdout.write(f"available totals rebuilt: {rows} rows from the ledger")
