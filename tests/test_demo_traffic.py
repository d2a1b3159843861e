"""The demo waits for promised returns and its summary checks the reversals."""

from datetime import timedelta
from decimal import Decimal

import pytest

from demo.traffic import _summary, _unfinished
from payments.models import LedgerEntry, Payment, PaymentState, ReturnDishonor
from payments.services import payment_apply_event
from tests.factories import (
    LedgerEntryFactory,
    PaymentFactory,
    account_validated,
    processor_event,
)
from tests.history import history_rewritten

pytestmark = pytest.mark.django_db


def _settled(token: str):
    payment = PaymentFactory(state=PaymentState.SUBMITTED, source_token=token)
    payment_apply_event(event=processor_event(payment, "settled"))
    return payment


def test_a_settled_payment_whose_token_promises_a_return_is_still_moving():
    _settled("tok_demo_00001x")
    nsf = _settled("tok_nsf_00002x")
    assert _unfinished() == 1

    payment_apply_event(event=processor_event(nsf, "returned", reason_code="R01"))

    assert _unfinished() == 0


def _processor_outage_story(capture_on_commit) -> None:
    """The breaker's history of a demo run: opened by failures, closed by a successful trial,
    the incident over after its cool-down (the demo's summary checks the story of its processor
    outage too)."""
    from datetime import timedelta

    from django.db.models.functions import Now

    from payments.models import CircuitBreaker
    from payments.processor.breaker import (
        PROCESSOR,
        CallOutcome,
        processor_breaker_admit,
        processor_breaker_incident_end,
        processor_breaker_record,
        trial_calls,
    )

    with capture_on_commit(execute=True):
        for _ in range(5):
            processor_breaker_record(
                admission=processor_breaker_admit(),
                outcome=CallOutcome.FAILURE,
                error="503 Service Unavailable",
            )
        CircuitBreaker.objects.filter(name=PROCESSOR).update(open_until=Now())
        for _ in range(trial_calls()):
            trial = processor_breaker_admit()
            assert trial.trial
            processor_breaker_record(admission=trial, outcome=CallOutcome.SUCCESS)
        CircuitBreaker.objects.filter(name=PROCESSOR).update(closed_at=Now() - timedelta(days=1))
        assert processor_breaker_incident_end()


def test_the_summary_shows_returns_and_passes_when_each_is_reversed_once(
    sqs_queues, sandbox, capsys, django_capture_on_commit_callbacks
):
    _processor_outage_story(django_capture_on_commit_callbacks)
    returned = _settled("tok_unauth_00003x")
    _settled("tok_demo_00004x")
    payment_apply_event(event=processor_event(returned, "returned", reason_code="R10"))

    assert _summary(sandbox.base_url, 0) is True
    out = capsys.readouterr().out
    assert "returned after settlement (reversed)" in out
    assert "R10: 1" in out
    assert "[PASS] every returned payment reversed exactly once (1 returned)" in out

    with history_rewritten():  # a corruption for the summary to find
        LedgerEntry.objects.filter(kind="reversal").delete()
    assert _summary(sandbox.base_url, 0) is False
    assert "[FAIL] every returned payment reversed exactly once" in capsys.readouterr().out


def test_the_summary_fails_a_credit_for_an_unsettled_payment(
    sqs_queues, sandbox, capsys, django_capture_on_commit_callbacks
):
    _processor_outage_story(django_capture_on_commit_callbacks)
    payment = PaymentFactory(state=PaymentState.SUBMITTED, amount=Decimal("3.00"))
    LedgerEntryFactory(payment=payment)

    assert _summary(sandbox.base_url, 0) is False
    assert "[FAIL] no ledger credit without a confirmed payment" in capsys.readouterr().out


def test_the_summary_counts_one_resolved_alert_per_breaker_incident(
    sqs_queues, sandbox, capsys, django_capture_on_commit_callbacks
):
    """Injected 5xx may open the breaker again after the outage: a second, short incident with
    its own alert, which passes when it too is resolved."""

    from payments.processor.breaker import ALERT_KEY
    from triage.models import Alert

    _processor_outage_story(django_capture_on_commit_callbacks)
    _processor_outage_story(django_capture_on_commit_callbacks)

    assert _summary(sandbox.base_url, 0) is True
    out = capsys.readouterr().out
    assert "1 more short incident(s) from injected 5xx" in out
    assert "[PASS] one 'processor unavailable' alert per breaker incident, each resolved " in out
    assert "(2 alert(s), 2 incident(s))" in out

    latest = Alert.objects.filter(key=ALERT_KEY).order_by("-id").values_list("pk", flat=True)[:1]
    Alert.objects.filter(pk__in=list(latest)).update(status="firing", resolved_at=None)
    assert _summary(sandbox.base_url, 0) is False
    assert "[FAIL] one 'processor unavailable' alert per breaker incident" in (
        capsys.readouterr().out
    )


def test_the_demo_checks_one_dishonor_re_credited_and_one_contest_reversed():
    from demo.dishonors import dishonor_story

    def returned():
        payment = _settled("tok_nsf_demo_dishonor0")
        payment_apply_event(event=processor_event(payment, "returned", reason_code="R01"))
        return payment

    dishonored, contested = returned(), returned()
    assert [passed for _, passed in dishonor_story(dishonored.id, contested.id)] == [False, False]

    payment_apply_event(event=processor_event(dishonored, "return_dishonored", reason_code="R61"))
    payment_apply_event(event=processor_event(contested, "return_dishonored", reason_code="R61"))
    payment_apply_event(event=processor_event(contested, "dishonor_contested", reason_code="R76"))
    checks = dishonor_story(dishonored.id, contested.id)

    assert [passed for _, passed in checks] == [True, True]
    assert "dishonored: the return is undone" in checks[0][0]
    assert "contested: the return stands, net 0.00" in checks[1][0]


def test_the_demo_checks_a_dishonor_of_the_reinitiated_return_is_refused_with_no_call():
    from demo.lifecycle import _dishonor_after_reinitiation_check
    from payments.services import payment_reinitiate

    payment = _settled("tok_nsfonce_demo_0001")
    payment_apply_event(event=processor_event(payment, "returned", reason_code="R01"))
    payment_reinitiate(payment_id=payment.id)

    check, passed = _dishonor_after_reinitiation_check(str(payment.id))

    assert passed and "the customer pays once" in check
    assert not ReturnDishonor.objects.filter(payment=payment).exists()


def test_the_demo_checks_its_cancels_and_fails_a_canceled_payment_the_processor_charged():
    from demo.cancels import cancels_checks
    from payments.services import payment_cancel

    canceled, submitted = PaymentFactory(), PaymentFactory(state=PaymentState.SUBMITTED)
    payment_cancel(payment_id=canceled.id)
    answers = {str(canceled.id): (200, "canceled"), str(submitted.id): (409, "already_submitted")}
    stats = {"charges_by_payment": {str(submitted.id): 1}}

    clean = cancels_checks(answers, (200, "canceled"), stats)
    stats["charges_by_payment"][str(canceled.id)] = 1
    charged = dict(cancels_checks(answers, (200, "canceled"), stats))

    assert all(passed for _, passed in clean), clean
    failed = [label for label, passed in charged.items() if not passed]
    assert len(failed) == 1 and "no canceled payment reached the processor" in failed[0]


# --- DEMO_BACKEND=nacha: the bank backend's demo (demo/bank_traffic.py, demo/bank_day.py) ----


def test_the_demo_accounts_show_every_rule_of_the_sandbox_bank_and_pass_the_vault(module_settings):
    from bank.vault.services import vault_account_store
    from demo.bank_traffic import RULES, demo_accounts
    from sandbox.bank import RULES as BANK_RULES
    from tests.bank.vault.conftest import KEY_1

    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    accounts = demo_accounts(len(RULES) + 5)

    assert [a.rule for a in accounts[: len(RULES)]] == RULES
    assert accounts == demo_accounts(len(RULES) + 5)  # the same run every time
    for account in accounts:
        word = account.body["holder_name"].split()[0]
        code = account.rule.return_code or account.rule.change_code
        assert BANK_RULES.get(word.upper()) == (code or None)
        assert vault_account_store(**account.body).token.startswith("vtok_")


def test_the_demo_gives_the_bank_backend_settings_the_module_accepts(environment, tmp_path):
    import environ

    from bank.conf import bank_settings
    from config.settings.environment import app_settings_from_environ
    from demo.run import bank_environment
    from payments.conf import payments_settings
    from payments.kernel.setting_specs import value_problem

    variables = bank_environment(tmp_path)
    for name, value in variables.items():
        environment.setenv(name, value)
    owner = {
        name: payments_settings if name in payments_settings.names else bank_settings
        for name in variables
    }
    values = {
        name: value
        for app in (payments_settings, bank_settings)
        for name, value in app_settings_from_environ(
            environ.Env(), app, [n for n in variables if owner[n] is app]
        ).items()
    }

    assert set(values) == set(variables)
    assert {n: value_problem(owner[n].specs[n], v) for n, v in values.items()} == {
        name: None for name in variables
    }
    assert values["PROCESSOR_BACKEND"] == "bank.nacha.backend.NachaBankBackend"
    assert values["NACHA_TRANSPORT"]["outbound"] == str(tmp_path / "bank" / "outbound")
    statements = values["BOOKS_STATEMENT_TRANSPORT"]
    assert statements == {"kind": "directory", "inbound": str(tmp_path / "bank" / "statements")}


def test_an_unknown_demo_backend_is_refused_naming_the_choices(monkeypatch):
    from demo.run import demo_backend

    monkeypatch.setenv("DEMO_BACKEND", "fedwire")
    with pytest.raises(SystemExit, match="processor, nacha"):
        demo_backend()
    monkeypatch.delenv("DEMO_BACKEND")
    assert demo_backend() == "processor"


@pytest.fixture
def environment(monkeypatch):
    for name in ("PROCESSOR_BACKEND", "VAULT_KEYS", "VAULT_ACTIVE_KEY"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


@pytest.fixture
def demo_bank(module_settings, sqs_queues, tmp_path):
    from bank.nacha.transports import DirectoryTransport
    from tests.bank.nacha.conftest import ORIGINATOR_SETTING
    from tests.bank.vault.conftest import KEY_1

    module_settings.PROCESSOR_BACKEND = "bank.nacha.backend.NachaBankBackend"
    module_settings.NACHA_ORIGINATOR = dict(ORIGINATOR_SETTING)
    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    module_settings.NACHA_TRANSPORT = {
        "kind": "directory",
        "outbound": str(tmp_path / "out"),
        "inbound": str(tmp_path / "in"),
    }
    return DirectoryTransport(outbound=str(tmp_path / "out"), inbound=str(tmp_path / "in"))


@pytest.mark.django_db(transaction=True)
def test_the_bank_demo_days_settle_first_then_the_bank_answers_and_the_summary_checks_it(
    demo_bank, tmp_path, capsys
):
    from django.utils import timezone

    from bank.collect import nacha_files_collect
    from bank.nacha.services import nacha_send_due
    from bank.vault.services import vault_account_reveal, vault_account_store
    from demo.bank_day import answer_round, files_to_answer, settle_round
    from demo.bank_traffic import RULES, Run, bank_summary, bank_unfinished, demo_accounts
    from payments.services import payment_create, payment_submit
    from tests.callbacks.worker_support import run_worker

    run = Run(accounts=demo_accounts(len(RULES)))
    for account in run.accounts:
        account.token = vault_account_store(**account.body).token
        if account.body["sec_code"] == "WEB":
            # As the demo does before its debits (demo/validation.py).
            account_validated(account.token, account.body["merchant_id"])
            run.web_validated += 1
        payment = payment_create(
            merchant_id=account.body["merchant_id"],
            amount=Decimal("12.34"),
            source_token=account.token,
        )
        run.payments.append({"id": str(payment.id)})
        # Queued for its file: the message is done, the delivery submits it.
        assert str(payment_submit(payment_id=payment.pk).outcome) == "queued"
    expected = run.expected()
    sent = nacha_send_due(
        now=timezone.now(), transport=demo_bank, resolve_account=vault_account_reveal, lead=None
    )
    assert len(sent.delivered) == 1 and sent.settled == 0  # its effective date is to come

    # The bank answers nothing of a file whose payments the workers have not settled.
    assert files_to_answer() == {}
    assert settle_round() == len(RULES)
    assert settle_round() == 0  # each entry's settlement promised once
    assert answer_round(demo_bank.outbound, demo_bank.inbound) == []
    run_worker(relay=True)
    assert bank_unfinished(expected) == 6  # 4 returns and 2 NOCs to come; the paying one done
    [(name, morning)] = files_to_answer().items()
    assert morning.hour == 9 and morning.date() == sent.delivered[0].effective_entry_date + (
        timedelta(days=1)
    )
    assert answer_round(demo_bank.outbound, demo_bank.inbound) == [f"answers-{name[:-4]}.ach"]
    assert answer_round(demo_bank.outbound, demo_bank.inbound) == []  # each file answered once
    nacha_files_collect(transport=demo_bank, min_age_seconds=0)
    run_worker()
    assert bank_unfinished(expected) == 0

    log = tmp_path / "demo.log"
    log.write_text("every line of the run, none with a number\n")
    assert bank_summary(run, [log]) is True
    out = capsys.readouterr().out
    assert "returns by code                            R01: 2, R02: 1, R10: 1" in out
    assert "[PASS] every returned payment reversed exactly once (4 returned)" in out
    assert "[PASS] at least one NOC recorded, none moving money (2 recorded)" in out
    assert "[PASS] no account number stored in the clear in any table" in out
    assert "[FAIL]" not in out

    leaked_number = run.accounts[2].body["account_number"]
    Payment.objects.filter(pk=run.payments[0]["id"]).update(description=f"acct {leaked_number}")
    log.write_text(f"a leak: {run.accounts[3].body['account_number']}\n")
    with history_rewritten():  # a corruption for the summary to find
        LedgerEntry.objects.filter(kind="reversal").order_by("pk").first().delete()
    assert bank_summary(run, [log]) is False
    out = capsys.readouterr().out
    assert "[FAIL] every returned payment reversed exactly once (4 returned)" in out
    assert "[FAIL] no account number in any log" in out
    assert "[FAIL] no account number stored in the clear in any table" in out
    assert "tables holding an account number in the clear: payments_payment" in out
    assert run.accounts[3].body["account_number"] not in out
    assert leaked_number not in out


@pytest.mark.django_db(transaction=True)
def test_the_demo_checks_every_dropped_callback_was_recovered_by_the_pull(sqs_queues, sandbox):
    from callbacks.events_pull import processor_events_pull
    from demo.recovery import drops_start, recovery_report
    from payments.services import payment_submit
    from tests.callbacks.worker_support import run_worker
    from tests.waiting import wait_for

    drops_start(sandbox.base_url, share=1.0)
    payment = PaymentFactory()
    payment_submit(payment_id=payment.id)
    wait_for(lambda: len(sandbox.drops.dropped()) == 2, 10, "both callbacks dropped")

    rows, [(label, passed)] = recovery_report(sandbox.base_url, timeout=0)
    assert (label, passed) == (
        "every callback the processor dropped was recovered by the events pull (0 of 2)",
        False,
    )

    processor_events_pull()
    run_worker()
    rows, [(label, passed)] = recovery_report(sandbox.base_url, timeout=0)
    assert passed, label
    assert dict(rows)["  recovered by the events pull"] == 2


def test_the_bank_demo_refuses_a_web_debit_then_validates_every_web_account(
    module_settings, live_server, api_client, user
):
    """demo/validation.py against the API on the bank backend: the first WEB debit is refused
    409 account_not_validated, every WEB account is then validated by the demo's service, and
    the chaos check over the database passes."""
    from rest_framework.authtoken.models import Token

    from bank.vault.services import vault_account_store
    from demo.bank_traffic import demo_accounts
    from demo.traffic import MERCHANTS
    from demo.validation import SERVICE, web_accounts_validate, web_debits_validated_first
    from payments.models import AccountValidation
    from payments.processor.backend import reset_backend
    from tests.bank.vault.conftest import KEY_1
    from tests.factories import grant

    module_settings.PROCESSOR_BACKEND = "bank.nacha.backend.NachaBankBackend"
    module_settings.VAULT_KEYS = {"k1": KEY_1}
    module_settings.VAULT_ACTIVE_KEY = "k1"
    module_settings.ACCOUNT_VALIDATION_SERVICE = SERVICE
    reset_backend()
    grant(user, *MERCHANTS)
    accounts = demo_accounts(12)
    for account in accounts:
        account.token = vault_account_store(**account.body).token
    web = [a for a in accounts if a.body["sec_code"] == "WEB"]
    assert web

    try:
        refused, validated = web_accounts_validate(
            live_server.url, Token.objects.get(user=user).key, accounts
        )
    finally:
        reset_backend()

    assert refused is True
    assert validated == len(web)
    assert set(AccountValidation.objects.values_list("account_token", "state")) == {
        (a.token, "validated") for a in web
    }
    label, passed = web_debits_validated_first()
    assert passed and "WEB debits sent" in label


@pytest.mark.django_db(transaction=True)
def test_the_bank_demo_prenotes_one_returned_r03_and_one_validated_from_live_from(
    demo_bank, live_server, user
):
    """demo/validation.py's prenotes against the API on the bank backend: both start pending,
    the file goes out, the sandbox bank answers the NOACCOUNT one R03 (demo/bank_day.py's
    round), the collect fails its validation, and the check moves the calendar past the other's
    live_from: every check passes; a WEB debit from the returned account is then refused."""
    from django.utils import timezone
    from rest_framework.authtoken.models import Token

    from bank.collect import nacha_files_collect
    from bank.nacha.services import nacha_send_due
    from bank.vault.services import vault_account_reveal
    from demo.bank_day import answer_round
    from demo.traffic import MERCHANTS
    from demo.validation import prenotes_check, prenotes_start
    from payments.exceptions import AccountNotValidated
    from payments.models import AccountValidation
    from payments.processor.backend import reset_backend
    from payments.services import payment_create
    from tests.factories import grant

    reset_backend()
    grant(user, MERCHANTS[0])
    try:
        expected = prenotes_start(
            live_server.url, Token.objects.create(user=user).key, MERCHANTS[0]
        )
    finally:
        reset_backend()
    assert sorted(expected.values()) == ["failed", "validated"]
    sent = nacha_send_due(
        now=timezone.now(), transport=demo_bank, resolve_account=vault_account_reveal, lead=None
    )
    assert len(sent.delivered) == 1
    assert len(answer_round(demo_bank.outbound, demo_bank.inbound)) == 1
    nacha_files_collect(transport=demo_bank, min_age_seconds=0)

    checks = prenotes_check(expected, timeout=5)

    assert [passed for _, passed in checks] == [True, True, True], checks
    states = dict(AccountValidation.objects.values_list("account_token", "state"))
    assert {states[t] for t in expected} == {"failed", "validated"}
    returned = next(t for t, s in expected.items() if s == "failed")
    with pytest.raises(AccountNotValidated):
        payment_create(
            merchant_id=MERCHANTS[0], amount=Decimal("5.00"), source_token=returned, sec_code="WEB"
        )


@pytest.mark.django_db
def test_the_demo_prenote_check_fails_when_no_prenote_came_back():
    from demo.validation import prenotes_check

    checks = prenotes_check({"tok_missing_1": "failed", "tok_missing_2": "validated"}, timeout=0)
    assert [passed for _, passed in checks] == [True, False, False]

    checks = prenotes_check({"tok_missing_1": "not started"}, timeout=0)
    assert checks[0] == ("prenotes started on the bank backend (0 of 2)", False)
