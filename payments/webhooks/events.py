"""Events are written in the transaction of what they report: they commit or roll back with
it, so an event exists exactly when the change it describes does."""

from payments.models import Payment, PaymentPurpose
from payments.object_shapes import (
    PaymentOutputSerializer,
    PayoutOutputSerializer,
    RefundOutputSerializer,
)
from payments.webhooks.catalogue import event_type_of_state
from payments.webhooks.models import Event

# One serializer per shape, its fields built once: a new ModelSerializer per transition cost
# about 2 ms of introspection, ten times the rendering itself. Rendered inside the transition,
# so nothing that reads more rows or calls out: a refund's double loss is never read (a refund
# that makes one is already sent, and the debit's return that finds it is not the refund's
# transition), a payout's last four digits are the backend's (a network call), so null.
_SHAPES = {
    PaymentPurpose.COLLECTION: PaymentOutputSerializer(),
    PaymentPurpose.REFUND: RefundOutputSerializer(context={"created": True}),
    PaymentPurpose.PAYOUT: PayoutOutputSerializer(context={"last4": {}}),
}


def payment_event_new(*, payment: Payment, state: str) -> Event:
    """The (unsaved) event of ``payment`` reaching ``state``, carrying it as the API shows it.
    A transition's ``Move`` writes it with its other rows (``payments.event_sql``: one more CTE
    of the event's single statement; ``writes.move_save``: one INSERT)."""
    return Event(
        type=event_type_of_state(payment.purpose, state),
        merchant_id=payment.merchant_id,
        object_id=str(payment.pk),
        data={"object": dict(_SHAPES[payment.purpose].to_representation(payment))},
    )


def merchant_event_record(*, merchant_id: str, type: str, object_id: str, data: dict) -> Event:
    """An event that is not a transition's (an endpoint disabled), in the caller's transaction."""
    return Event.objects.create(type=type, merchant_id=merchant_id, object_id=object_id, data=data)
