"""The bank app's models, kept with their code (``nacha/``, ``vault/``, ``books/``) and
registered here. Their tables keep the names they had as models of the payments app
(``payments_nachafile``...): migration ``bank.0001`` took them over without touching a row."""

from bank.books.models import (  # noqa: F401
    BankStatement,
    BooksVariance,
    StatementDay,
    StatementLine,
    StatementMatch,
    VarianceExplanation,
)
from bank.nacha.models import (  # noqa: F401
    NachaEntry,
    NachaFile,
    NachaInboundEvent,
    NachaInboundFile,
    NachaPrenote,
    NachaTraceCounter,
)
from bank.vault.models import VaultAccount  # noqa: F401
