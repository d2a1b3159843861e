"""What the writer needs of a bank account, and the type of whatever supplies it (the vault).

A ``BankAccount`` holds raw numbers: its ``repr`` shows the last 4 digits only, so a log
line, a traceback's locals or an assertion message cannot carry the number.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass(frozen=True)
class BankAccount:
    routing_number: str = field(repr=False)
    account_number: str = field(repr=False)
    account_type: str  # checking | savings
    holder_name: str = field(repr=False)
    sec_code: str  # how the debit was authorized: PPD, CCD or WEB
    # The merchant the account was stored for (the vault always says; None: the resolver
    # cannot tell). A payment of another merchant is never debited from it.
    merchant_id: str | None = None

    def __repr__(self) -> str:
        return f"BankAccount(****{self.account_number[-4:]}, {self.account_type}, {self.sec_code})"

    __str__ = __repr__


class AccountUnavailable(Exception):
    """No account can be had for the token (unknown, closed); the message names no number."""


# A token in, the account out; raises AccountUnavailable.
AccountResolver = Callable[[str], BankAccount]
