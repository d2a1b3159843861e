"""Start-up checks (``manage.py check``, ``migrate``, ``runserver``): a host project learns of a
missing or broken setting of the payments app by its name, before the first request."""

from django.conf import settings
from django.core.checks import Error, Warning, register
from django.utils.module_loading import import_string

from payments import conf
from payments.processor.backend import backend_class_problem


@register()
def payments_settings_check(app_configs=None, **kwargs) -> list[Error]:
    errors = [
        Error(
            f"{conf.payments_settings.label(name)} is required by the payments app and is not set",
            id="payments.E001",
        )
        for name in conf.payments_settings.missing()
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
    return errors


@register()
def payments_setting_values_check(app_configs=None, **kwargs) -> list[Error]:
    """The host's ``PAYMENTS`` dict: a key the app does not know (payments.E004), then every
    setting, the host's value or the default, against its declared type and range
    (``payments.conf.SPECS``, payments.E003); the required ones too, when they are set at all
    (a missing one is payments.E001)."""
    return conf.payments_settings.refused(error_id="payments.E003", unknown_id="payments.E004")


@register()
def payments_renamed_paths_check(app_configs=None, **kwargs) -> list[Warning]:
    """A dotted path of 0.1.0 (``PROCESSOR_BACKEND``), read as its new one this release only
    (payments.W002); and the log formatters and filters of 0.1.0's ``LOGGING`` (payments.W003),
    whose modules moved into ``payments.kernel`` and are kept where they were for this release."""
    warnings = conf.payments_settings.renamed_paths(warning_id="payments.W002")
    logging = getattr(settings, "LOGGING", None)
    text = repr(logging) if isinstance(logging, dict) else ""
    warnings += [
        Warning(
            f"LOGGING names {old}: it moved to payments.kernel.{old.rpartition('.')[2]} and the "
            "old module is kept in this release only.",
            hint=f"Name payments.kernel.{old.rpartition('.')[2]}.<class> in LOGGING.",
            obj="LOGGING",
            id="payments.W003",
        )
        for old in ("payments.logformat", "payments.logcontext")
        if f"{old}." in text
    ]
    return warnings


@register()
def payments_stray_settings_check(app_configs=None, **kwargs) -> list[Warning]:
    """A payments setting written as a top-level name, which the app does not read."""
    return conf.payments_settings.stray(warning_id="payments.W001")


@register()
def payments_processor_backend_check(app_configs=None, **kwargs) -> list[Error]:
    """``PAYMENTS["PROCESSOR_BACKEND"]`` must name a class that imports and implements the
    backend interface: otherwise the first submission, status check or callback would fail, not
    start-up."""
    path = conf.PROCESSOR_BACKEND
    problem = backend_class_problem(path)
    if problem is None:
        return []
    return [
        Error(
            f'PAYMENTS["PROCESSOR_BACKEND"] = {path!r} {problem}',
            hint="a dotted path to a subclass of payments.processor.backend.ProcessorBackend",
            obj="PROCESSOR_BACKEND",
            id="payments.E005",
        )
    ]


@register()
def payments_validation_service_check(app_configs=None, **kwargs) -> list[Error]:
    """``PAYMENTS["ACCOUNT_VALIDATION_SERVICE"]``, when set, must name a validation service
    class: otherwise the first validation by the service would fail, not start-up."""
    from payments.validation_methods import service_class_problem

    path = conf.ACCOUNT_VALIDATION_SERVICE
    problem = service_class_problem(path) if isinstance(path, str) else None
    if problem is None:
        return []
    return [
        Error(
            f'PAYMENTS["ACCOUNT_VALIDATION_SERVICE"] = {path!r} {problem}',
            hint="a dotted path to a subclass of payments.validation_methods.ValidationService",
            obj="ACCOUNT_VALIDATION_SERVICE",
            id="payments.E006",
        )
    ]
