from django.apps import AppConfig


class CallbacksConfig(AppConfig):
    name = "callbacks"
    verbose_name = "Callbacks"

    def ready(self) -> None:
        from callbacks import (
            checks,  # noqa: F401 - registers the settings checks
            openapi,  # noqa: F401 - registers the signature scheme
        )
        from callbacks.receivers import publish_committed_outbox
        from payments.models import OutboxMessage
        from payments.signals import outbox_committed

        outbox_committed.connect(
            publish_committed_outbox,
            sender=OutboxMessage,
            dispatch_uid="callbacks.publish_committed_outbox",
        )

        # The payment detail (API, admin) shows this app's processing errors and active hold.
        from callbacks.selectors import payment_queue_detail
        from payments.selectors import payment_detail_extensions

        if payment_queue_detail not in payment_detail_extensions:
            payment_detail_extensions.append(payment_queue_detail)
