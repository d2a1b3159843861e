"""The payments API's routes, for a host project's URLconf under whatever prefix it includes them:
``payments/``, ``payments/<id>/``, ``payments/<id>/cancel/``, ``payments/<id>/reinitiate/``,
``payments/<id>/refunds/``, ``refunds/<id>/``, ``payouts/``, ``payouts/<id>/``,
``merchants/<id>/balance/``, ``merchants/<id>/limits/``, ``accounts/<token>/validation/`` and
``accounts/<token>/verify/`` (the bank app's
``bank.urls`` adds the books and the vault beside them)."""

from django.urls import path

from payments.api.accounts import AccountValidationApi, AccountVerifyApi
from payments.api.balances import MerchantBalanceApi
from payments.api.limits import MerchantLimitsApi
from payments.api.payments import PaymentCancelApi, PaymentDetailApi, PaymentListCreateApi
from payments.api.payouts import PayoutDetailApi, PayoutListCreateApi
from payments.api.refunds import RefundDetailApi, RefundListCreateApi
from payments.api.reinitiations import PaymentReinitiateApi
from payments.webhooks.apis import (
    EventListApi,
    WebhookEndpointDetailApi,
    WebhookEndpointEnableApi,
    WebhookEndpointListCreateApi,
    WebhookEndpointRotateSecretApi,
)

urlpatterns = [
    # One route for list (GET) and create (POST); the name predates the list.
    path("payments/", PaymentListCreateApi.as_view(), name="payment-create"),
    # Any text: the view answers an id that is not a UUID with the API's own 404.
    path("payments/<str:payment_id>/", PaymentDetailApi.as_view(), name="payment-detail"),
    path("payments/<str:payment_id>/cancel/", PaymentCancelApi.as_view(), name="payment-cancel"),
    path(
        "payments/<str:payment_id>/reinitiate/",
        PaymentReinitiateApi.as_view(),
        name="payment-reinitiate",
    ),
    path(
        "payments/<str:payment_id>/refunds/",
        RefundListCreateApi.as_view(),
        name="payment-refunds",
    ),
    path("refunds/<str:refund_id>/", RefundDetailApi.as_view(), name="refund-detail"),
    # One route for list (GET) and create (POST), as payments/.
    path("payouts/", PayoutListCreateApi.as_view(), name="payout-create"),
    path("payouts/<str:payout_id>/", PayoutDetailApi.as_view(), name="payout-detail"),
    path(
        "merchants/<str:merchant_id>/balance/",
        MerchantBalanceApi.as_view(),
        name="merchant-balance",
    ),
    path(
        "merchants/<str:merchant_id>/limits/",
        MerchantLimitsApi.as_view(),
        name="merchant-limits",
    ),
    # Any text: a malformed token is answered with the API's own 404 (a bank number: 400).
    path(
        "accounts/<str:account_token>/validation/",
        AccountValidationApi.as_view(),
        name="account-validation",
    ),
    path("accounts/<str:account_token>/verify/", AccountVerifyApi.as_view(), name="account-verify"),
    path("events/", EventListApi.as_view(), name="event-list"),
    path(
        "webhook_endpoints/", WebhookEndpointListCreateApi.as_view(), name="webhook-endpoint-list"
    ),
    path(
        "webhook_endpoints/<str:endpoint_id>/",
        WebhookEndpointDetailApi.as_view(),
        name="webhook-endpoint-detail",
    ),
    path(
        "webhook_endpoints/<str:endpoint_id>/rotate_secret/",
        WebhookEndpointRotateSecretApi.as_view(),
        name="webhook-endpoint-rotate-secret",
    ),
    path(
        "webhook_endpoints/<str:endpoint_id>/enable/",
        WebhookEndpointEnableApi.as_view(),
        name="webhook-endpoint-enable",
    ),
]
