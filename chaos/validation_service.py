"""The chaos run's validation service (``PAYMENTS["ACCOUNT_VALIDATION_SERVICE"]`` in the run):
a module of its own, imported by the run's Django processes once Django is set up, while
``chaos.validation`` (the double, the plans) is imported by the run before."""

from __future__ import annotations

import os

import requests

from chaos.validation import SERVICE_TIMEOUT_SECONDS, SERVICE_URL_VARIABLE
from payments.validation_methods import Outcome, ValidationService


class ChaosValidationService(ValidationService):
    """The run's validation service: asks the double at ``CHAOS_VALIDATION_SERVICE_URL``
    whether the account is open (503s and timeouts raise, and the validation is asked again)."""

    def validate(self, *, account_token: str, merchant_id: str) -> Outcome:
        answer = requests.post(
            f"{os.environ[SERVICE_URL_VARIABLE]}/v1/account_checks",
            json={"account_token": account_token, "merchant_id": merchant_id},
            timeout=SERVICE_TIMEOUT_SECONDS,
        )
        answer.raise_for_status()
        body = answer.json()
        evidence = {"check_id": str(body.get("check_id", ""))[:64], "status": body.get("status")}
        if body.get("status") == "open":
            return Outcome(True, evidence=evidence)
        return Outcome(False, evidence=evidence, reason=f"validation service: {body.get('status')}")
