"""``GET /api/merchants/<id>/books/``: a merchant's banking day as the books closed it, in the
payments API's envelope and access rules (``payments.api.base``)."""

from rest_framework import serializers
from rest_framework.response import Response

from bank.books.days import books_day_parse
from bank.books.selectors import books_day_figures, day_reported
from payments.api.base import ModuleApiView, merchant_refused, query_checked
from payments.api.fields import StrictInputSerializer


class BooksQuerySerializer(StrictInputSerializer):
    """The query of ``GET /api/merchants/<id>/books/``: one banking day, ``YYYY-MM-DD`` in
    digits 0-9, from 2000-01-01 to the bank's tomorrow (``bank.books.days``)."""

    numeric_fields = ("date",)

    date = serializers.CharField(
        max_length=10,
        trim_whitespace=False,
        help_text="YYYY-MM-DD, 2000-01-01 to the second banking day ahead",
    )

    def validate_date(self, value: str):
        try:
            return books_day_parse(value)
        except ValueError as exc:
            raise serializers.ValidationError(str(exc)) from None


class BooksDayCurrencyOutputSerializer(serializers.Serializer):
    currency = serializers.CharField()
    expected = serializers.DecimalField(max_digits=18, decimal_places=2)
    settled = serializers.DecimalField(max_digits=18, decimal_places=2)
    returned = serializers.DecimalField(max_digits=18, decimal_places=2)
    variances = serializers.IntegerField(help_text="unexplained variances")


class MerchantBooksOutputSerializer(serializers.Serializer):
    merchant_id = serializers.CharField()
    date = serializers.DateField()
    reported_by_bank = serializers.BooleanField(
        help_text="whether the bank's statement of the day has come: until it has, nothing "
        "can be missing at the bank yet"
    )
    currencies = BooksDayCurrencyOutputSerializer(many=True)


class MerchantBooksApi(ModuleApiView):
    """A merchant's banking day as the books closed it: expected, settled, returned and the
    unexplained variances, per currency."""

    def get(self, request, merchant_id):
        if (refused := merchant_refused(request, merchant_id)) is not None:
            return refused
        day = query_checked(request, BooksQuerySerializer)["date"]
        figures = books_day_figures(day=day, merchant_id=merchant_id)
        return Response(
            MerchantBooksOutputSerializer(
                {
                    "merchant_id": merchant_id,
                    "date": day,
                    "reported_by_bank": day_reported(day),
                    "currencies": [vars(f) for f in figures],
                }
            ).data
        )
