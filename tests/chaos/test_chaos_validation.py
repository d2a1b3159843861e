"""The chaos run's validation share: its size, its accounts, its settings, and the validation
service's double over real HTTP (open, closed, flapping, and a malformed question refused)."""

import pytest
import requests

from chaos.config import MICRO_ENTRY_MAX_ATTEMPTS, environment
from chaos.review import LIMITED_MERCHANTS, risk_limits
from chaos.validation import (
    PLANS,
    SERVICE,
    SERVICE_URL_VARIABLE,
    WRONG_RACERS,
    ValidationDouble,
    account_plan,
    validation_accounts,
    validation_debits,
)
from devstack.processes import free_port
from payments.services import validate_source_token
from payments.validation_methods import service_class_problem, service_failure_passes
from sandbox.faults import FaultConfig, FaultKind, FaultPlan

PORTS = {"proxy": 1, "sandbox": 2, "web": 3, "validation": 4}


def test_the_share_is_twelve_percent_of_the_payments_with_a_floor_of_eight_accounts():
    assert validation_accounts(150) == 8
    assert validation_debits(150) == 24
    assert validation_accounts(1000) == 40
    assert validation_debits(1000) == 120
    assert validation_accounts(10) == 8


def test_every_plan_runs_twice_at_a_small_size_on_merchants_without_limits():
    plans = [account_plan(i) for i in range(validation_accounts(150))]

    assert sorted(plan for plan, _, _ in plans) == sorted(PLANS * 2)
    assert not {merchant for _, _, merchant in plans} & set(risk_limits(150))
    assert all(int(m.rsplit("-", 1)[1]) >= LIMITED_MERCHANTS for _, _, m in plans)
    assert len({token for _, token, _ in plans}) == len(plans)


def test_the_accounts_tokens_are_valid_and_trip_no_sandbox_rule():
    plan = FaultPlan(FaultConfig(), seed=1)
    for index in range(validation_accounts(1000)):
        _, token, _ = account_plan(index)
        validate_source_token(token)
        assert plan.debit_fault(token).kind == FaultKind.NONE
        assert not plan.returns(token)
        assert not any(code in token for code in ("R02", "R03", "R04", "R23"))


def test_the_wrong_racers_outnumber_the_tries_a_validation_counts():
    assert WRONG_RACERS > MICRO_ENTRY_MAX_ATTEMPTS


def test_the_run_holds_unvalidated_web_debits_and_names_an_importable_service():
    env = environment(PORTS, "postgres://x/y")

    assert env["UNVALIDATED_WEB_DEBITS"] == "hold"
    assert env["ACCOUNT_VALIDATION_SERVICE"] == SERVICE
    assert env["MICRO_ENTRY_MAX_ATTEMPTS"] == str(MICRO_ENTRY_MAX_ATTEMPTS)
    assert env[SERVICE_URL_VARIABLE] == "http://127.0.0.1:4"
    assert service_class_problem(SERVICE) is None


def test_the_callers_validation_settings_do_not_reach_the_run(monkeypatch):
    monkeypatch.setenv("UNVALIDATED_WEB_DEBITS", "refuse")
    monkeypatch.setenv("ACCOUNT_VALIDATION_REQUIRED_WEB", "false")
    monkeypatch.setenv("MICRO_ENTRY_EXPIRY_DAYS", "1")

    env = environment(PORTS, "postgres://x/y")

    assert env["UNVALIDATED_WEB_DEBITS"] == "hold"
    assert "ACCOUNT_VALIDATION_REQUIRED_WEB" not in env
    assert "MICRO_ENTRY_EXPIRY_DAYS" not in env


class Draws:
    """A random source that draws ``value`` every time: which answer the double gives."""

    def __init__(self, value: float) -> None:
        self.value = value

    def random(self) -> float:
        return self.value


@pytest.fixture
def double(monkeypatch):
    double = ValidationDouble(free_port(), seed=1).start()
    monkeypatch.setenv(SERVICE_URL_VARIABLE, double.url)
    yield double
    double.stop()


def _service():
    from chaos.validation_service import ChaosValidationService

    return ChaosValidationService()


def test_the_service_answers_an_account_open_and_a_closed_one_closed(double):
    double.rng = Draws(0.99)

    opened = _service().validate(account_token="tok_chaosval_x_a0001", merchant_id="merchant-3")
    closed = _service().validate(
        account_token="tok_chaosval_service_closed_a0002", merchant_id="merchant-4"
    )

    assert opened.validated and opened.evidence["status"] == "open"
    assert not closed.validated
    assert closed.reason == "validation service: closed"
    assert dict(double.answers) == {"open": 1, "closed": 1}


@pytest.mark.parametrize(
    ("draw", "error", "answer"),
    [(0.0, requests.HTTPError, "503"), (0.5, requests.Timeout, "slow")],
)
def test_a_flapping_service_fails_in_a_way_the_validation_asks_again(double, draw, error, answer):
    double.rng, double.flapping = Draws(draw), True

    with pytest.raises(error) as raised:
        _service().validate(account_token="tok_chaosval_x_a0003", merchant_id="merchant-3")

    assert service_failure_passes(raised.value)
    assert double.answers[answer] == 1


def test_the_service_answers_503_now_and_then_outside_its_flap(double):
    double.rng = Draws(0.01)

    with pytest.raises(requests.HTTPError):
        _service().validate(account_token="tok_chaosval_x_a0004", merchant_id="merchant-3")


def test_a_question_without_an_account_is_refused_naming_it(double):
    answer = requests.post(f"{double.url}/v1/account_checks", data=b"{}", timeout=5)

    assert answer.status_code == 400
    assert "account_token" in answer.json()["error"]
