from django.apps import AppConfig


class ShopConfig(AppConfig):
    name = "tests.host.shop"
    label = "host_shop"

    def ready(self) -> None:
        from payments.signals import payment_transitioned
        from tests.host.shop.receivers import payment_moved

        payment_transitioned.connect(payment_moved, dispatch_uid="host_shop.payment_moved")
