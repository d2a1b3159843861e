"""``manage.py webhooks_deliver``: dispatch events and send due deliveries in this process,
without Celery (development, demos, tests); ``--until-empty`` stops when nothing is due."""

import time

from django.core.management.base import BaseCommand

from payments.webhooks.delivery import deliveries_run


class Command(BaseCommand):
    help = "Send due webhook deliveries in this process (Celery's beat does it in production)."

    def add_arguments(self, parser):
        parser.add_argument("--until-empty", action="store_true")
        parser.add_argument("--interval", type=float, default=1.0)

    def handle(self, *args, until_empty: bool, interval: float, **options):
        total = 0
        while True:
            sent = deliveries_run()
            total += sent
            if sent == 0 and until_empty:
                break
            if sent == 0:
                time.sleep(interval)
        self.stdout.write(f"sent {total} deliveries")
