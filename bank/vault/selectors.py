"""Reading the vault without opening it: whose a token is. Imports only the vault's model, so
``payments.services`` can ask at create time (the vault's services import those services)."""

from datetime import datetime

from bank.vault.models import VaultAccount

TOKEN_PREFIX = "vtok_"
UNKNOWN_TOKEN_MESSAGE = "unknown token"


def vault_token_is_vaults(token: str) -> bool:
    """A token the vault minted (its prefix): the module's own to judge, not a processor's."""
    return token.startswith(TOKEN_PREFIX)


def vault_token_held_for(*, token: str, merchant_id: str) -> bool:
    """Whether the vault holds ``token`` for ``merchant_id``. A missing token and another
    merchant's answer the same, so a caller cannot learn that a token exists elsewhere."""
    return VaultAccount.objects.filter(token=token, merchant_id=merchant_id).exists()


def vault_accounts_last4(*, tokens: list[str], merchant_id: str) -> dict[str, str]:
    """Token to the account's last four digits, for those of ``tokens`` the vault holds for
    ``merchant_id`` (another merchant's token is left out, as a missing one is)."""
    accounts = VaultAccount.objects.filter(token__in=tokens, merchant_id=merchant_id)
    return dict(accounts.values_list("token", "account_last4"))


def vault_token_account(*, token: str, merchant_id: str) -> tuple[str, datetime] | None:
    """The standard entry class of the account the vault holds as ``token`` for
    ``merchant_id``, and when it was vaulted (a token's account never changes: new details are a
    new token, so this is when the account's details last changed); None for a missing token
    and another merchant's alike. One read."""
    return (
        VaultAccount.objects.filter(token=token, merchant_id=merchant_id)
        .values_list("sec_code", "created_at")
        .first()
    )
