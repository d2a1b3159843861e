"""``manage.py webhooks_deliver``: dispatch events and send due deliveries in this process,
without Celery (development, demos, tests); ``--until-empty`` stops when nothing is due."""

import time

from django.core.management.base import BaseCommand
from django.db import DatabaseError, connection

from payments.webhooks.delivery import deliveries_run


class Command(BaseCommand):
    help = "Send due webhook deliveries in this process (Celery's beat does it in production)."

    def add_arguments(self, parser):
        parser.add_argument("--until-empty", action="store_true")
        parser.add_argument("--interval", type=float, default=1.0)

    def handle(self, *args, until_empty: bool, interval: float, **options):
        total = 0
        while True:
            try:
                sent = deliveries_run()
            except DatabaseError as exc:
                if until_empty:
                    raise
                # A process that keeps running outlives the database's outage: what it had
                # claimed is sent again once its lease ends.
                self.stderr.write(f"round failed, trying again: {exc}")
                connection.close()
                sent = 0
            total += sent
            if sent == 0 and until_empty:
                break
            if sent == 0:
                time.sleep(interval)
        self.stdout.write(f"sent {total} deliveries")
