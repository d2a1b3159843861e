"""Events are written in the transaction of what they report: they commit or roll back with
it, so an event exists exactly when the change it describes does.

Each event's ``data.object`` is the object it is about, with its ``id``, its kind
(``object``) and its ``created_at``: a money movement as the API shows it, or a fact about one
(a notification of change, a dishonor, a double loss) in the few fields a merchant needs, never
bank details. It is stored in the latest API version's shape; ``versions`` renders it in the
version each reader asks for.
``Event.object_id`` is the payment the event concerns, the key an endpoint's deliveries are
ordered by (``delivery.deliveries_claim``)."""

from django.core.exceptions import ImproperlyConfigured

from payments.models import (
    AccountValidation,
    DoubleLoss,
    NotificationOfChange,
    Payment,
    PaymentPurpose,
    ReturnDishonor,
)
from payments.object_shapes import (
    AccountValidationOutputSerializer,
    PaymentOutputSerializer,
    PayoutOutputSerializer,
    RefundOutputSerializer,
)
from payments.webhooks.catalogue import EVENT_TYPES, event_type_of_review, event_type_of_state
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


_VALIDATION_SHAPE = AccountValidationOutputSerializer()


def validation_shape(validation: AccountValidation) -> dict:
    """An account's validation as ``GET /api/accounts/<token>/validation/`` shows it."""
    return dict(_VALIDATION_SHAPE.to_representation(validation))


def payment_shape(payment: Payment) -> dict:
    return dict(_SHAPES[payment.purpose].to_representation(payment))


def payment_event_new(*, payment: Payment, state: str) -> Event:
    """The (unsaved) event of ``payment`` made (``state`` pending) or reaching ``state``,
    carrying it as the API shows it. A transition's ``Move`` writes it with its other rows
    (``payments.event_sql``: one more CTE of the event's single statement; ``writes.move_save``:
    one INSERT)."""
    return Event(
        type=event_type_of_state(payment.purpose, state),
        merchant_id=payment.merchant_id,
        object_id=str(payment.pk),
        data={"object": payment_shape(payment)},
    )


def event_record(*, type: str, merchant_id: str, obj: dict, object_id: str = "") -> Event:
    """Write an event of ``type`` (from the catalogue) about ``obj`` in the caller's
    transaction: the one call every source outside a transition makes (an endpoint disabled,
    an account validated). ``obj`` carries its ``id`` and ``object`` (its kind: what a thin
    delivery keeps); ``object_id`` is the payment it concerns, else the object's own id."""
    if type not in EVENT_TYPES:
        raise ImproperlyConfigured(f"{type!r} is not an event type of payments.webhooks.catalogue")
    if not obj.get("id") or not obj.get("object"):
        raise ImproperlyConfigured(f"the object of a {type} event needs its id and object")
    return Event.objects.create(
        type=type,
        merchant_id=merchant_id,
        object_id=str(object_id or obj["id"])[:64],
        data={"object": obj},
    )


def review_event_record(*, payment: Payment, decision: str) -> Event:
    """A person's decision on a held payment (``approved``, ``rejected``): the payment as it is
    after it, and why it was held; never the reviewer's note, which is for operators."""
    return Event.objects.create(
        type=event_type_of_review(payment.purpose, decision),
        merchant_id=payment.merchant_id,
        object_id=str(payment.pk),
        data={"object": payment_shape(payment), "review_reason": payment.review_reason},
    )


def noc_shape(noc: NotificationOfChange) -> dict:
    """A notification of change without its corrected data (the processor holds the account's
    details): what a merchant needs to know that one is due, and by when. A prenote's NOC
    names no payment (``payment_id`` null) but the account it answered (``account_token``)."""
    return {
        "id": str(noc.pk),
        "object": "notification_of_change",
        "payment_id": str(noc.payment_id) if noc.payment_id is not None else None,
        "account_token": noc.source_token,
        "change_code": noc.change_code,
        "change_title": noc.change_title,
        "status": noc.status,
        "received_at": _iso(noc.received_at),
        "deadline": _iso(noc.deadline),
        "created_at": _iso(noc.created_at),
    }


def dishonor_shape(dishonor: ReturnDishonor) -> dict:
    return {
        "id": str(dishonor.pk),
        "object": "return_dishonor",
        "payment_id": str(dishonor.payment_id),
        "reason_code": dishonor.reason_code,
        "contest_reason_code": dishonor.contest_reason_code,
        "dishonored_at": _iso(dishonor.dishonored_at),
        "contested_at": _iso(dishonor.contested_at),
        "created_at": _iso(dishonor.created_at),
    }


def double_loss_shape(loss: DoubleLoss) -> dict:
    return {
        "id": str(loss.pk),
        "object": "double_loss",
        "payment_id": str(loss.payment_id),
        "refund_id": str(loss.refund_id),
        "amount": f"{loss.amount:.2f}",
        "currency": loss.currency,
        "status": loss.status,
        "detected_at": _iso(loss.detected_at),
        "created_at": _iso(loss.detected_at),
    }


def _iso(moment) -> str | None:
    return moment.isoformat().replace("+00:00", "Z") if moment is not None else None
