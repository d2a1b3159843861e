"""Start-up checks: the callback endpoint cannot verify anything without signing secrets."""

from django.core.checks import Error, register
from django.core.exceptions import ImproperlyConfigured

from callbacks import conf


@register()
def callbacks_settings_check(app_configs=None, **kwargs) -> list[Error]:
    try:
        conf.required_check()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="callbacks.E001")]
    return []
