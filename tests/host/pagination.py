"""The host's own page format, which the module's list must not take."""

from rest_framework.pagination import PageNumberPagination
from rest_framework.response import Response


class ShopPagination(PageNumberPagination):
    page_size = 2

    def get_paginated_response(self, data):
        return Response({"shop_page": self.page.number, "items": data})
