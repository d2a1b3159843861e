"""Money out read back: ``GET /api/refunds/<id>/``, ``GET /api/payments/<id>/refunds/``,
``GET /api/payouts/<id>/`` and ``GET /api/payouts/``, each in the one shape its create answers
with (``object`` says which), lists in the payments list's cursor pages and filters.

A refund or a payout is read as its merchant's, exactly as a payment is: another merchant's,
an unknown id and a malformed one are the same 404, and a list never reads a merchant the
caller may not act for."""

from rest_framework.response import Response

from payments.apis import (
    ModuleApiView,
    PaymentPagination,
    PaymentRefundsApi,
    PayoutCreateApi,
    not_found,
    payment_of_user,
    payments_listed,
    payout_body,
    query_checked,
)
from payments.models import Payment, PaymentPurpose
from payments.selectors import payouts_last4
from payments.serializers import PayoutOutputSerializer, RefundOutputSerializer

__all__ = ["PayoutDetailApi", "PayoutListCreateApi", "RefundDetailApi", "RefundListCreateApi"]


def _page(view, request, payments, serializer_class, context_of=None) -> Response:
    paginator = PaymentPagination()
    page = paginator.paginate_queryset(payments, request, view=view)
    context = context_of(page) if context_of else {}
    data = serializer_class(page, many=True, context=context).data
    return paginator.get_paginated_response(data)


class RefundListCreateApi(PaymentRefundsApi):
    """``/api/payments/<id>/refunds/``: ``POST`` refunds (``PaymentRefundsApi``); ``GET`` lists
    the debit's refunds, newest first, filtered by ``state``, ``created_gte`` and
    ``created_lt``."""

    def get(self, request, payment_id):
        query = query_checked(request)
        payment = payment_of_user(request.user, payment_id)
        if payment is None or payment.purpose != PaymentPurpose.COLLECTION:
            return not_found("payment_id")
        refunds = payments_listed(
            request.user,
            query,
            Payment.objects.filter(refund_of=payment).select_related("double_loss"),
            PaymentPurpose.REFUND,
        )
        return _page(self, request, refunds, RefundOutputSerializer)


class RefundDetailApi(ModuleApiView):
    """``GET /api/refunds/<id>/``: one refund, as its create answered and its debit lists it."""

    def get(self, request, refund_id):
        refund = payment_of_user(request.user, refund_id)
        if refund is None or refund.purpose != PaymentPurpose.REFUND:
            return not_found("refund_id")
        return Response(RefundOutputSerializer(refund).data)


class PayoutListCreateApi(PayoutCreateApi):
    """``/api/payouts/``: ``POST`` pays out (``PayoutCreateApi``); ``GET`` lists the payouts of
    every merchant the caller may act for (or of ``merchant``), newest first, with the payments
    list's filters."""

    def get(self, request):
        query = query_checked(request)
        payouts = payments_listed(request.user, query, Payment.objects.all(), PaymentPurpose.PAYOUT)
        return _page(
            self,
            request,
            payouts,
            PayoutOutputSerializer,
            context_of=lambda page: {"last4": payouts_last4(page)},
        )


class PayoutDetailApi(ModuleApiView):
    """``GET /api/payouts/<id>/``: one payout, its destination as token and last four."""

    def get(self, request, payout_id):
        payout = payment_of_user(request.user, payout_id)
        if payout is None or payout.purpose != PaymentPurpose.PAYOUT:
            return not_found("payout_id")
        return Response(payout_body(payout))
