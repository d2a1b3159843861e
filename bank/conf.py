"""The bank app's settings, each with its default kept here.

A host sets them in one dict, ``BANK = {"NACHA_ORIGINATOR": {...}, "VAULT_KEYS": ...}``, and
the code reads ``conf.NAME`` at call time (``payments.kernel.app_settings``). In 0.1.0 they were
keys of ``PAYMENTS``: a key still set there (and not in ``BANK``) is read through the next release,
with a start-up warning naming its new place (``bank.W001``), and refused after it. The books'
settings (``BOOKS_...``) were a dict of their own in 0.1.0, ``PAYMENTS_BOOKS``, without the
prefix: read the same way, with the same warning.
"""

from typing import Any

from bank.books.options import (
    STATEMENT_TRANSPORT_ACCEPTED,
    TYPE_CODES_ACCEPTED,
    parse_statement_transport,
    parse_type_codes,
)
from bank.nacha.originator import parse_originator
from bank.nacha.transport_options import TRANSPORT_ACCEPTED, parse_transport
from bank.nacha.windows import FED_WINDOWS, WINDOWS_ACCEPTED, parse_windows
from bank.vault.keys import KMS_KEYS_ACCEPTED, parse_kms_keys, parse_vault_keys
from payments.kernel.app_settings import AppSettings
from payments.kernel.setting_specs import (
    Number,
    Parsed,
    Seconds,
    Spec,
    Text,
    Url,
    defaults,
    json_text,
)

SPECS: dict[str, Spec] = {
    # Bank-direct origination (bank.nacha): who the files come from and go to (None: the
    # bank path is not set up, and cutting a file says so), the Fed's windows (Eastern time)
    # and how long before a window's deadline the bank wants the file.
    "NACHA_ORIGINATOR": Parsed(
        None,
        parse=parse_originator,
        accepted="None, or a dict of the originator's identity (docs/how-to/bank-direct.md)",
        types=(dict, type(None)),
        text_type=json_text,
    ),
    "NACHA_WINDOWS": Parsed(
        FED_WINDOWS,
        parse=parse_windows,
        accepted=WINDOWS_ACCEPTED,
        types=(list, tuple),
        text_type=json_text,
    ),
    "NACHA_BANK_BUFFER_MINUTES": Number(30, 0, 12 * 60, whole=True, unit="of minutes"),
    # Where files go and come back from (bank.nacha.transports): None until set up.
    "NACHA_TRANSPORT": Parsed(
        None,
        parse=parse_transport,
        accepted=TRANSPORT_ACCEPTED,
        types=(dict, type(None)),
        text_type=json_text,
    ),
    # The vault's key-encrypting keys, by version (base64 of 32 bytes each; from the
    # environment "v1:<base64>,v2:<base64>"), the version new records are sealed under, and
    # the class holding them (bank.vault.crypto.KeyProvider; the provider's own settings are
    # checked apart, bank.E002).
    "VAULT_KEYS": Parsed(
        {},
        parse=parse_vault_keys,
        accepted="a dict of version: base64 of 32 bytes, or 'v1:<base64>,v2:<base64>'",
        types=(dict, str),
        secret=True,
    ),
    "VAULT_ACTIVE_KEY": Text(
        "",
        pattern=r"[A-Za-z0-9_.-]*",
        accepted="a version of VAULT_KEYS (or of VAULT_KMS_KEYS), or blank (no vault)",
    ),
    "VAULT_KEY_PROVIDER": Text(
        "bank.vault.crypto.SettingsKeyProvider",
        pattern=r"[A-Za-z_][\w]*(\.[A-Za-z_][\w]*)+",
        accepted="a dotted path such as 'package.module.Class'",
    ),
    # The KMS key holder (VAULT_KEY_PROVIDER "bank.vault.kms.KmsKeyProvider"): the KMS key
    # of each version (from the environment "v1:<key ARN>,v2:<key ARN>"), the region (None:
    # boto3's own, AWS_REGION or AWS_DEFAULT_REGION), an endpoint (None: AWS itself; a URL: a
    # KMS-compatible server, LocalStack in tests) and how long one call may wait to connect and
    # to be answered: a store or a file cut waits on it, so an unreachable KMS must fail fast.
    "VAULT_KMS_KEYS": Parsed(
        {}, parse=parse_kms_keys, accepted=KMS_KEYS_ACCEPTED, types=(dict, str)
    ),
    "VAULT_KMS_REGION": Text(
        None,
        pattern=r"|[a-z]{2}(-[a-z]+)+-\d+",
        accepted="an AWS region such as 'us-east-1', or None/blank for boto3's own",
        optional=True,
    ),
    "VAULT_KMS_ENDPOINT_URL": Url(None),
    "VAULT_KMS_TIMEOUT_SECONDS": Seconds(5.0, 60),
    # The books against the bank's statements (bank.books): where the bank's BAI2 statements
    # wait (None: not collected), the BAI2 detail type codes the bank uses for an originated
    # ACH batch's settlement (credits) and for a return debited back (banks differ: set yours),
    # the hour (Eastern) of the next banking day a banking day must be closed green by, and how
    # many banking days a variance may stay unexplained before it alerts (high).
    "BOOKS_STATEMENT_TRANSPORT": Parsed(
        None,
        parse=parse_statement_transport,
        accepted=STATEMENT_TRANSPORT_ACCEPTED,
        types=(dict, type(None)),
        text_type=json_text,
    ),
    "BOOKS_SETTLEMENT_TYPE_CODES": Parsed(
        ("165", "166", "169", "142", "145"),
        parse=parse_type_codes,
        accepted=TYPE_CODES_ACCEPTED,
        types=(list, tuple),
        text_type=json_text,
    ),
    "BOOKS_RETURN_TYPE_CODES": Parsed(
        ("455", "466", "495", "555"),
        parse=parse_type_codes,
        accepted=TYPE_CODES_ACCEPTED,
        types=(list, tuple),
        text_type=json_text,
    ),
    "BOOKS_CLOSE_BY_HOUR_EASTERN": Number(12, 0, 23, whole=True, unit="(an hour, Eastern)"),
    "BOOKS_VARIANCE_ALERT_BANKING_DAYS": Number(2, 0, 60, whole=True, unit="of banking days"),
}

DEFAULTS: dict[str, Any] = defaults(SPECS)

# The key holders' dotted paths of 0.1.0, read as the new ones for this release (bank.W003).
RENAMED = {
    "VAULT_KEY_PROVIDER": {
        "payments.vault.crypto.SettingsKeyProvider": "bank.vault.crypto.SettingsKeyProvider",
        "payments.vault.kms.KmsKeyProvider": "bank.vault.kms.KmsKeyProvider",
    }
}

bank_settings = AppSettings(
    app="bank",
    setting="BANK",
    specs=SPECS,
    formerly="PAYMENTS",
    renamed=RENAMED,
    folded={"PAYMENTS_BOOKS": "BOOKS_"},
)


def __getattr__(name: str) -> Any:
    return getattr(bank_settings, name)
