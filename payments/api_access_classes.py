"""Which DRF authentication and permission classes guard the payments API, as a host names
them (``PAYMENTS["API_AUTHENTICATION_CLASSES"]``, ``PAYMENTS["API_PERMISSION_CLASSES"]``):
dotted paths, each imported and checked to be a class of the right kind, by the start-up check
and at run time alike (``payments.conf``'s specs call these parsers)."""

from functools import cache

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from rest_framework.authentication import BaseAuthentication
from rest_framework.permissions import BasePermission

AUTHENTICATION_ACCEPTED = (
    "a non-empty list of dotted paths of rest_framework.authentication.BaseAuthentication "
    "subclasses"
)
PERMISSION_ACCEPTED = (
    "a non-empty list of dotted paths of rest_framework.permissions.BasePermission subclasses"
)


def authentication_classes(paths) -> tuple[type, ...]:
    """The authentication classes ``paths`` names; ``ImproperlyConfigured`` naming the path
    that does not import or is not one."""
    return _classes(_paths(paths), BaseAuthentication)


def permission_classes(paths) -> tuple[type, ...]:
    """The permission classes ``paths`` names; ``ImproperlyConfigured`` as above. A DRF
    permission composed with ``&``/``|`` is a class too: name the module-level result."""
    return _classes(_paths(paths), BasePermission)


def _paths(paths) -> tuple:
    if not isinstance(paths, list | tuple) or not paths:
        raise ImproperlyConfigured("must be a non-empty list of dotted paths")
    return tuple(paths)


@cache
def _classes(paths: tuple, base: type) -> tuple[type, ...]:
    classes = []
    for path in paths:
        if not isinstance(path, str):
            raise ImproperlyConfigured(f"{path!r} is not a dotted path")
        try:
            found = import_string(path)
        except ImportError as exc:
            raise ImproperlyConfigured(f"{path!r} cannot be imported: {exc}") from None
        if not _is_kind(found, base):
            raise ImproperlyConfigured(f"{path!r} is not a {base.__module__}.{base.__name__}")
        classes.append(found)
    return tuple(classes)


def _is_kind(found, base: type) -> bool:
    # DRF's composed permissions (IsAuthenticated & IsAdminUser) are OperandHolder instances
    # that build a permission when called, as a class does.
    if isinstance(found, type):
        return issubclass(found, base)
    return base is BasePermission and type(found).__name__ == "OperandHolder"
