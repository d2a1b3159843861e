"""The host's own API authentication: a shared key in a header, for its back-office scripts."""

from django.contrib.auth import get_user_model
from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed


class ShopKeyAuthentication(BaseAuthentication):
    def authenticate(self, request):
        key = request.headers.get("X-Shop-Key")
        if key is None:
            return None
        if key != "shop-admin-key":
            raise AuthenticationFailed("bad shop key")
        return get_user_model().objects.get(email="ops@shop.example"), None

    def authenticate_header(self, request):
        return "ShopKey"
