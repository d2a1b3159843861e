"""The bank app's operations as the OpenAPI schema describes them, in the payments API's one
envelope (``payments.api.schema``): a merchant's banking day as the books closed it, and the
vault's one request that takes bank numbers. Imported by ``BankConfig.ready``."""

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_view,
)

from bank.books.apis import MerchantBooksApi, MerchantBooksOutputSerializer
from bank.vault.apis import (
    VaultAccountCreateApi,
    VaultAccountInputSerializer,
    VaultAccountOutputSerializer,
)
from payments.api.schema import COMMON_ANSWERS, REQUEST_HEADERS, error_answer


def describe() -> None:
    extend_schema_view(
        get=extend_schema(
            operation_id="merchant_books",
            parameters=[
                *REQUEST_HEADERS,
                OpenApiParameter(
                    "date",
                    OpenApiTypes.DATE,
                    OpenApiParameter.QUERY,
                    required=True,
                    description="The banking day, YYYY-MM-DD.",
                ),
            ],
            responses={
                200: OpenApiResponse(
                    MerchantBooksOutputSerializer,
                    description="Per currency: expected, settled, returned, and the count of "
                    "unexplained variances.",
                ),
                400: error_answer("The merchant id or the date is not of the accepted form."),
                404: error_answer("A merchant you may not act for."),
                **COMMON_ANSWERS,
            },
        )
    )(MerchantBooksApi)
    extend_schema_view(
        post=extend_schema(
            operation_id="vault_account_create",
            request=VaultAccountInputSerializer,
            parameters=REQUEST_HEADERS,
            responses={
                201: VaultAccountOutputSerializer,
                400: error_answer("What was refused, by field; a refused value is never echoed."),
                403: error_answer("You may not act for merchant_id."),
                **COMMON_ANSWERS,
            },
        )
    )(VaultAccountCreateApi)
