"""Start-up checks: a triage setting the alerting or the bulk pages cannot use stops start-up
naming it, instead of every alert failing to fire or every bulk page raising later."""

from django.core.checks import Error, register

from payments.setting_specs import settings_refused
from triage import conf


@register()
def triage_setting_values_check(app_configs=None, **kwargs) -> list[Error]:
    """Every setting of the triage app against its declared type and range (``SPECS``)."""
    return settings_refused(conf.SPECS, "triage.E001")
