"""Start-up checks (``manage.py check``, ``migrate``, ``runserver``): a host project learns of a
missing or broken setting of the payments app by its name, before the first request."""

from django.conf import settings
from django.core.checks import Error, register
from django.utils.module_loading import import_string

from payments import conf


@register()
def payments_settings_check(app_configs=None, **kwargs) -> list[Error]:
    errors = [
        Error(f"{name} is required by the payments app and is not set", id="payments.E001")
        for name in conf.REQUIRED
        if not getattr(settings, name, None)
    ]
    path = conf.PAYMENTS_MERCHANT_ACCESS_POLICY
    try:
        policy = import_string(path)
    except ImportError as exc:
        errors.append(
            Error(
                f"PAYMENTS_MERCHANT_ACCESS_POLICY {path!r} cannot be imported: {exc}",
                hint="a dotted path to a callable (user, merchant_id) -> bool",
                id="payments.E002",
            )
        )
    else:
        if not callable(policy):
            errors.append(
                Error(
                    f"PAYMENTS_MERCHANT_ACCESS_POLICY {path!r} is not callable",
                    hint="a dotted path to a callable (user, merchant_id) -> bool",
                    id="payments.E002",
                )
            )
    errors += _max_body_bytes_check()
    return errors


# A create is a few hundred bytes; above 10 MiB a body is a denial of service, not a payment.
MAX_BODY_BYTES_RANGE = (1024, 10 * 1024 * 1024)


def _max_body_bytes_check() -> list[Error]:
    value = conf.PAYMENTS_API_MAX_BODY_BYTES
    low, high = MAX_BODY_BYTES_RANGE
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        return [
            Error(
                f"PAYMENTS_API_MAX_BODY_BYTES is {value!r}",
                hint=f"an integer number of bytes from {low} to {high}",
                id="payments.E020",
            )
        ]
    return []
