"""The bank app's admin pages live with their code; importing them here registers them."""

from bank.books import admin as books_admin  # noqa: F401
from bank.nacha import admin as nacha_admin  # noqa: F401
from bank.vault import admin as vault_admin  # noqa: F401
