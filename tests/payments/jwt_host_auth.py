"""A host's own API authentication: a bearer JWT (HS256) naming a user, as a host on OAuth or
JWT would write it. Named by dotted path in ``PAYMENTS["API_AUTHENTICATION_CLASSES"]`` in the
tests of that setting."""

import jwt
from django.contrib.auth import get_user_model
from rest_framework.authentication import BaseAuthentication, get_authorization_header
from rest_framework.exceptions import AuthenticationFailed

SECRET = "host-jwt-secret-for-tests-only-32b"


def token_for(username: str) -> str:
    return jwt.encode({"sub": username}, SECRET, algorithm="HS256")


class HostJwtAuthentication(BaseAuthentication):
    def authenticate(self, request):
        scheme, _, token = get_authorization_header(request).decode("latin-1").partition(" ")
        if scheme != "Bearer" or not token:
            return None
        try:
            claims = jwt.decode(token, SECRET, algorithms=["HS256"])
        except jwt.InvalidTokenError as exc:
            raise AuthenticationFailed(f"bad token: {exc}") from None
        user = get_user_model().objects.filter(username=claims.get("sub")).first()
        if user is None:
            raise AuthenticationFailed("no such user")
        return user, token

    def authenticate_header(self, request):
        return "Bearer"


class NotAClass:
    pass
