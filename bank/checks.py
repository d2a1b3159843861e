"""Start-up checks (``manage.py check``, ``migrate``, ``runserver``): a host project learns of a
broken setting of the bank app by its name, before the first file is cut."""

from django.core.checks import Error, Tags, Warning, register
from django.utils.module_loading import import_string

from bank import conf


@register()
def bank_setting_values_check(app_configs=None, **kwargs) -> list[Error]:
    """The host's ``BANK`` dict: a key the app does not know (bank.E002), then every setting,
    the host's value or the default, against its declared type and range (``bank.conf.SPECS``,
    bank.E001); a key still set in ``PAYMENTS``, or in 0.1.0's ``PAYMENTS_BOOKS``, is checked
    the same way, and a key of ``PAYMENTS_BOOKS`` the app does not know is refused (bank.E002)."""
    return [
        *conf.bank_settings.refused(error_id="bank.E001", unknown_id="bank.E002"),
        *conf.bank_settings.folded_refused(error_id="bank.E002"),
    ]


@register()
def bank_moved_settings_check(app_configs=None, **kwargs) -> list[Warning]:
    """A bank setting still set in ``PAYMENTS`` or ``PAYMENTS_BOOKS``, where 0.1.0 read it:
    read this release only."""
    return conf.bank_settings.moved(warning_id="bank.W001")


@register()
def bank_renamed_paths_check(app_configs=None, **kwargs) -> list[Warning]:
    """A key holder named by its 0.1.0 path, read as its new one this release only."""
    return conf.bank_settings.renamed_paths(warning_id="bank.W003")


@register()
def bank_stray_settings_check(app_configs=None, **kwargs) -> list[Warning]:
    """A bank setting written as a top-level name, which the app does not read."""
    return conf.bank_settings.stray(warning_id="bank.W002")


@register()
def vault_key_provider_check(app_configs=None, **kwargs) -> list[Error]:
    """``BANK["VAULT_KEY_PROVIDER"]`` must name a key provider (bank.E003), and the
    settings that provider reads must fit together (bank.E004): an active version that no
    key has, or a KMS holder with no KMS key, would otherwise fail the first store, not start-up.
    Nothing is called out: a KMS that is down is the store's error, not start-up's."""
    from bank.vault.crypto import KeyProvider

    path = conf.VAULT_KEY_PROVIDER
    hint = "a dotted path to a subclass of bank.vault.crypto.KeyProvider"
    try:
        provider = import_string(path)
    except ImportError as exc:
        problem = f"cannot be imported: {exc}"
    else:
        if isinstance(provider, type) and issubclass(provider, KeyProvider):
            return [
                Error(
                    problem,
                    hint="the vault's settings: README, settings table",
                    obj="VAULT_KEY_PROVIDER",
                    id="bank.E004",
                )
                for problem in provider.settings_problems()
            ]
        problem = "is not a subclass of bank.vault.crypto.KeyProvider"
    return [
        Error(
            f'BANK["VAULT_KEY_PROVIDER"] = {path!r} {problem}',
            hint=hint,
            obj="VAULT_KEY_PROVIDER",
            id="bank.E003",
        )
    ]


# How many merchants the warning names; the rest are counted.
UNPROFILED_SHOWN = 10


@register(Tags.database)
def merchants_without_originator_profile_check(
    app_configs=None, databases=None, **kwargs
) -> list[Warning]:
    """On the bank backend, the merchants with vault accounts but no originator profile
    (bank.W004): their entries go out under the global ``NACHA_ORIGINATOR``'s company name, not
    their own, so the receiver's statement names the operator. A database check: run with
    ``manage.py check --database default``."""
    from django.db import connection

    from bank.vault.models import VaultAccount
    from payments import conf as payments_conf
    from payments.models import OriginatorProfile

    if not databases or payments_conf.PROCESSOR_BACKEND != "bank.nacha.backend.NachaBankBackend":
        return []
    tables = {VaultAccount._meta.db_table, OriginatorProfile._meta.db_table}
    if not tables <= set(connection.introspection.table_names()):
        return []  # not migrated yet (``migrate`` runs the database checks first)
    merchants = sorted(
        set(VaultAccount.objects.values_list("merchant_id", flat=True).distinct())
        - set(OriginatorProfile.objects.values_list("merchant_id", flat=True))
    )
    if not merchants:
        return []
    shown = ", ".join(merchants[:UNPROFILED_SHOWN])
    more = len(merchants) - UNPROFILED_SHOWN
    return [
        Warning(
            f"{len(merchants)} merchant(s) with vault accounts have no originator profile: "
            f"{shown}{f' and {more} more' if more > 0 else ''}. Their entries go out under "
            'BANK["NACHA_ORIGINATOR"]\'s company name, not their own.',
            hint="add an originator profile for each in the admin (Originator profiles)",
            obj="OriginatorProfile",
            id="bank.W004",
        )
    ]
