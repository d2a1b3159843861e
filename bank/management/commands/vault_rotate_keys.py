"""Re-key the vault's records under the active key-encrypting key, in batches: the accounts
(re-encrypted), the sealed NACHA files, ours and the bank's, and the bank's statements (their
data keys re-wrapped).

Rotation: add the new key to ``BANK["VAULT_KEYS"]`` (with the KMS holder, a new version in
``VAULT_KMS_KEYS`` naming another KMS key), make it ``VAULT_ACTIVE_KEY`` (new accounts are sealed
under it at once), run this command, and remove the old key (disable the old KMS key) only once
it reports nothing left under it. Each batch is its own transaction: the command can be stopped
and run again, and a running store or reveal is never blocked for long.
"""

from django.core.management.base import BaseCommand, CommandError

from bank.books.models import BankStatement
from bank.nacha.models import NachaFile, NachaInboundFile
from bank.vault.crypto import VaultError, key_provider
from bank.vault.models import VaultAccount
from bank.vault.services import vault_keys_rotate


def batch_size(value: str) -> int:
    number = int(value)
    if not 1 <= number <= 10_000:
        raise ValueError(value)
    return number


class Command(BaseCommand):
    help = (
        "Re-key vaulted accounts, sealed NACHA files and bank statements not under the active "
        "key, in batches (1-10000 rows)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--batch-size", type=batch_size, default=500, help="default 500")

    def handle(self, *args, **options):
        active = key_provider().active_version()
        try:
            done = vault_keys_rotate(batch_size=options["batch_size"])
        except VaultError as exc:
            raise CommandError(f"rotation stopped: {exc}") from exc
        left = {
            "accounts": VaultAccount.objects.exclude(key_version=active).count(),
            "NACHA files": NachaFile.objects.exclude(key_version=active).count(),
            "inbound NACHA files": NachaInboundFile.objects.exclude(key_version=active).count(),
            "bank statements": BankStatement.objects.exclude(key_version=active).count(),
        }
        remaining = ", ".join(f"{n} {kind}" for kind, n in left.items())
        self.stdout.write(f"re-keyed {done} records under key {active}; left: {remaining}")
        if any(left.values()):
            raise CommandError(f"still under another key (held elsewhere?): {remaining}")
