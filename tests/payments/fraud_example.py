"""A host's own fraud rule, the worked example the docs point to: a debit of a round amount
at or above a threshold (``1000.00``, ``5000.00``) from an account the merchant never drew from,
a pattern of test charges with stolen account numbers. Registered by dotted path::

    PAYMENTS["FRAUD_RULES"] = {
        "round_amount": {"path": "tests.payments.fraud_example.RoundAmount", "amount": "1000"},
    }
"""

from decimal import Decimal

from payments.exposure_limits import limit_amount
from payments.fraud_rules import Entry, FraudRule, History


class RoundAmount(FraudRule):
    name = "round_amount"
    options = {"amount": "1000.00"}

    def __init__(self, **options):
        super().__init__(**options)
        self.amount = limit_amount(self.settings["amount"], name="amount")

    def check(self, entry: Entry, history: History):
        round_amount = entry.amount % Decimal(100) == 0
        if entry.direction != "debit" or not round_amount or entry.amount < self.amount:
            return None
        if history.account_debits:
            return None
        summary = f"round {entry.amount:.2f} from a new account"
        return self.flag(summary, amount=entry.amount, at_least=self.amount)


class Broken(FraudRule):
    """A rule that fails: the payment is held for a person, never sent unchecked."""

    name = "broken"

    def check(self, entry, history):
        raise RuntimeError("the rule's own service is down")


class Misnamed(FraudRule):
    name = "something_else"

    def check(self, entry, history):
        return None
