from tests.host.shop.models import Order, PaymentNotice


def payment_moved(sender, payment, from_state, to_state, event, **kwargs) -> None:
    """Inside the transition's transaction: these rows exist exactly once per transition."""
    PaymentNotice.objects.create(
        payment_id=payment.pk, from_state=from_state, to_state=to_state, event_row_id=event.pk
    )
    if to_state == "confirmed":
        Order.objects.filter(payment_id=payment.pk).update(paid=True)
