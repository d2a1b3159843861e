"""Start-up checks: the callback endpoint cannot verify anything without signing secrets."""

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured

from callbacks import conf
from payments.setting_specs import settings_refused


@register()
def callbacks_settings_check(app_configs=None, **kwargs) -> list[Error]:
    try:
        conf.required_check()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="callbacks.E001")]
    return []


@register()
def callbacks_setting_values_check(app_configs=None, **kwargs) -> list[Error]:
    """Every setting of the queue layer against its declared type and range (``SPECS``)."""
    return settings_refused(conf.SPECS, "callbacks.E002", conf.RELATIONS)
