from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        from payments import checks  # noqa: F401 - registers the settings checks
        from payments.api import schema  # noqa: F401 - registers the schema of shared fields
        from payments.webhooks import openapi

        openapi.describe()
