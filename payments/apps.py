from django.apps import AppConfig


class PaymentsConfig(AppConfig):
    name = "payments"
    verbose_name = "Payments"

    def ready(self) -> None:
        from payments import (
            checks,  # noqa: F401 - registers the settings checks
            openapi,
        )

        openapi.describe()
