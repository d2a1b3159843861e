"""Start-up checks: the callback endpoint cannot verify anything without signing secrets."""

from django.core.checks import Error, Warning, register
from django.core.exceptions import ImproperlyConfigured

from callbacks import conf


@register()
def callbacks_settings_check(app_configs=None, **kwargs) -> list[Error]:
    try:
        conf.required_check()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="callbacks.E001")]
    return []


@register()
def callbacks_setting_values_check(app_configs=None, **kwargs) -> list[Error]:
    """The host's ``CALLBACKS`` dict: a key the queue layer does not know (callbacks.E003), then
    every setting against its declared type and range (``SPECS``, callbacks.E002)."""
    return conf.callbacks_settings.refused(error_id="callbacks.E002", unknown_id="callbacks.E003")


@register()
def callbacks_stray_settings_check(app_configs=None, **kwargs) -> list[Warning]:
    """A callbacks setting written as a top-level name, which the app does not read."""
    return conf.callbacks_settings.stray(warning_id="callbacks.W001")
