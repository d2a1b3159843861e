"""The bank app's routes, included beside the payments API's under the same prefix:
``merchants/<id>/books/`` and the vault's ``vault/accounts/``."""

from django.urls import path

from bank.books.apis import MerchantBooksApi
from bank.vault.apis import VaultAccountCreateApi

urlpatterns = [
    path("merchants/<str:merchant_id>/books/", MerchantBooksApi.as_view(), name="merchant-books"),
    # The one request that takes bank numbers: the vault seals them and answers a token.
    path("vault/accounts/", VaultAccountCreateApi.as_view(), name="vault-account-create"),
]
