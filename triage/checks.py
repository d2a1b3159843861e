"""Start-up checks: a triage setting the alerting or the bulk pages cannot use stops start-up
naming it, instead of every alert failing to fire or every bulk page raising later."""

from django.core.checks import Error, Warning, register

from triage import conf


@register()
def triage_setting_values_check(app_configs=None, **kwargs) -> list[Error]:
    """The host's ``TRIAGE`` dict: a key the triage app does not know (triage.E002), then every
    setting against its declared type and range (``SPECS``, triage.E001)."""
    return conf.triage_settings.refused(error_id="triage.E001", unknown_id="triage.E002")


@register()
def triage_stray_settings_check(app_configs=None, **kwargs) -> list[Warning]:
    """A triage setting written as a top-level name, which the app does not read."""
    return conf.triage_settings.stray(warning_id="triage.W001")
