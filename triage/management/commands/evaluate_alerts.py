from django.core.management.base import BaseCommand

from triage.operations.alert_conditions import alerts_evaluate


class Command(BaseCommand):
    help = (
        "Check the alert conditions once (DLQ depth, open dead letters, backlog, queue "
        "reachability): fire what holds, resolve what cleared. Beat runs this every minute."
    )

    def handle(self, *args, **options):
        result = alerts_evaluate()
        for key, decision in sorted(result.fired.items()):
            self.stdout.write(f"{key}: {decision}")
        for key in result.resolved:
            self.stdout.write(f"{key}: resolved")
        if not result.fired and not result.resolved:
            self.stdout.write("no alert condition holds")
