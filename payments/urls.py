from django.urls import path

from payments.apis import MerchantBalanceApi, PaymentDetailApi, PaymentListCreateApi

urlpatterns = [
    path("payments/", PaymentListCreateApi.as_view(), name="payment-create"),
    path("payments/<uuid:payment_id>/", PaymentDetailApi.as_view(), name="payment-detail"),
    path(
        "merchants/<str:merchant_id>/balance/",
        MerchantBalanceApi.as_view(),
        name="merchant-balance",
    ),
]
