from django.apps import AppConfig


class TriageConfig(AppConfig):
    name = "triage"
    verbose_name = "Triage"

    def ready(self) -> None:
        from payments.signals import alert_cleared, alert_raised
        from triage import checks  # noqa: F401 - registers the settings checks
        from triage.operations.alerting import alert_cleared_receiver, alert_raised_receiver

        alert_raised.connect(alert_raised_receiver, dispatch_uid="triage.alerting.alert_raised")
        alert_cleared.connect(alert_cleared_receiver, dispatch_uid="triage.alerting.alert_cleared")
        # Alert history in the admin (also imported by triage/admin.py; importing twice is a no-op).
        from triage.operations import admin  # noqa: F401
