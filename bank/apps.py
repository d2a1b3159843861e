from django.apps import AppConfig


class BankConfig(AppConfig):
    name = "bank"
    verbose_name = "Bank"

    def ready(self) -> None:
        from bank import (
            checks,  # noqa: F401 - registers the settings checks
            openapi,
        )

        openapi.describe()
