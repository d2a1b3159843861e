"""The demo's risk section (demo/risk.py): its plan runs past each limit once, its watched rule
holds only the section's merchant's payouts, its operator decides through the admin over HTTP,
and its checks fail what they guard."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest

from demo.risk import (
    CAPPED,
    CAPPED_DEBITS,
    FRAUD_RULES,
    HELD_PAYOUT,
    LIMITS,
    QUESTIONABLE_DEBIT,
    REFUSED_PAYOUT,
    WATCH_RULE,
    WATCHED,
    WATCHED_DEBITS,
    Story,
    WatchedNewDestination,
    admin_decide,
    answer_of,
    csrf_token,
    operator_create,
    risk_checks,
    risk_setup,
)
from demo.run import DEMO_FRAUD_RULES
from payments.exceptions import ExposureLimitExceeded
from payments.fraud_rules import Entry, FirstLargeDebit, parse_fraud_rules
from payments.models import Payment, ProcessorAttempt
from payments.services import payment_create
from payments.services.review import payment_review_approve
from tests.factories import UserFactory

NOW = datetime(2026, 12, 2, 15, tzinfo=UTC)


class _History:
    """A merchant's figures as a rule reads them: an account never seen before."""

    today_total = Decimal("0.00")
    daily_mean = Decimal("0.00")
    baseline_days = 30
    account_first_seen = None
    account_debits = 0


def _entry(merchant: str, direction: str = "credit", purpose: str = "payout") -> Entry:
    return Entry(
        merchant_id=merchant,
        direction=direction,
        purpose=purpose,
        amount=Decimal("400.00"),
        currency="USD",
        account_token="tok_demo_risk001x",
        now=NOW,
    )


def test_the_demo_s_rules_are_accepted_and_watch_only_the_section_s_merchant():
    rules = {rule.name: rule for rule in parse_fraud_rules({**DEMO_FRAUD_RULES, **FRAUD_RULES})}

    assert sorted(rules) == sorted(["first_large_debit", "velocity", WATCH_RULE])
    watched = rules[WATCH_RULE]
    flag = watched.check(_entry(WATCHED), _History())
    assert flag is not None and flag.rule == WATCH_RULE
    assert watched.check(_entry(CAPPED), _History()) is None
    assert watched.check(_entry("merchant-3"), _History()) is None
    assert watched.check(_entry(WATCHED, "debit", "collection"), _History()) is None


def test_the_watched_rule_refuses_merchants_that_are_not_a_list_of_ids():
    with pytest.raises(ValueError, match="merchants: a list of merchant ids"):
        WatchedNewDestination(merchants="merchant-risk-2")
    with pytest.raises(ValueError, match="unknown option"):
        WatchedNewDestination(merchant=[WATCHED])


def test_the_plan_runs_past_each_limit_once_with_the_held_entries_counted():
    debit, first_large = LIMITS[CAPPED]["debit"], FirstLargeDebit().amount
    amounts = {shows: Decimal(amount) for shows, amount, _ in CAPPED_DEBITS}

    assert amounts["within the limits"] <= first_large
    assert amounts["past the single-entry cap"] > debit["single"]
    assert first_large < amounts["a first large debit"] <= debit["single"]
    counted = amounts["within the limits"] + amounts["a first large debit"]
    assert counted <= debit["daily"] < counted + amounts["past the daily cap"]
    watched = LIMITS[WATCHED]
    collected = sum(map(Decimal, WATCHED_DEBITS)) + Decimal(QUESTIONABLE_DEBIT)
    assert collected <= watched["debit"]["daily"]
    held, refused = Decimal(HELD_PAYOUT), Decimal(REFUSED_PAYOUT)
    assert held <= watched["credit"]["daily"] < held + refused


def test_an_answer_is_named_as_the_plan_states_it():
    refusal = {"error": {"code": "exposure_limit_exceeded", "param": "debit_daily_limit"}}

    assert answer_of(201, {"id": "x"}) == "sent"
    assert answer_of(201, {"id": "x"}, "first_large_debit") == "held:first_large_debit"
    assert answer_of(409, refusal) == "exposure_limit_exceeded:debit_daily_limit"
    assert answer_of(409, {"error": {"code": "account_blocked"}}) == "account_blocked:"
    assert answer_of(502, {}) == "502"


def test_the_admin_form_s_csrf_token_is_read_and_a_page_without_one_gives_none():
    html = '<form><input type="hidden" name="csrfmiddlewaretoken" value="abc123"></form>'

    assert csrf_token(html) == "abc123"
    assert csrf_token("<p>no form</p>") == ""


def _section(module_settings) -> dict:
    """The capped merchant's part of the section through the services: answers and ids as the
    section records them, the held debit approved."""
    module_settings.FRAUD_RULES = {**DEMO_FRAUD_RULES, **FRAUD_RULES}
    UserFactory(username="admin", is_superuser=True, is_staff=True)
    client = UserFactory(username="demo-api-client")
    risk_setup(client.username)
    story = Story()
    for n, (shows, amount, _) in enumerate(CAPPED_DEBITS):
        try:
            payment = payment_create(
                merchant_id=CAPPED, amount=Decimal(amount), source_token=f"tok_demo_risk{n:03d}x"
            )
        except ExposureLimitExceeded as exc:
            story.answers[shows] = f"{exc.rule}:{exc.limit}"
            continue
        story.ids[shows] = str(payment.id)
        held = payment.review_rule
        story.answers[shows] = f"held:{held}" if held else "sent"
    admin = UserFactory(username="admin")
    payment_review_approve(payment_id=story.ids["a first large debit"], user=admin, note="ok")
    return {"story": story}


def _check(checks: list, starts: str) -> bool:
    [passed] = [passed for label, passed in checks if label.startswith(starts)]
    return passed


@pytest.mark.django_db
def test_the_checks_pass_the_capped_merchant_s_answers_and_the_invariants(module_settings):
    story = _section(module_settings)["story"]

    _, checks = risk_checks(story, sandbox_stats={})

    for shows, _, want in CAPPED_DEBITS:
        assert _check(checks, f"{shows}: {want}"), checks
    assert _check(checks, "no merchant exceeded an exposure limit")
    assert _check(checks, "nothing held was submitted before its approval")
    # The payouts and the R17 return were not made here: their checks fail.
    assert not _check(checks, "payout to a fresh account")
    assert not _check(checks, "an R17 QUESTIONABLE return")


@pytest.mark.django_db
def test_the_checks_fail_a_held_debit_attempted_before_its_approval(module_settings):
    story = _section(module_settings)["story"]
    held = Payment.objects.get(pk=story.ids["a first large debit"])
    ProcessorAttempt.objects.create(
        payment=held,
        attempt_number=1,
        idempotency_key=held.idempotency_key,
        outcome="accepted",
        latency_ms=1.0,
        started_at=held.created_at,
    )

    _, checks = risk_checks(story, sandbox_stats={})

    assert not _check(checks, "nothing held was submitted before its approval")
    assert _check(checks, "no merchant exceeded an exposure limit")


@pytest.mark.django_db
def test_the_checks_fail_an_entry_past_a_limit(module_settings):
    story = _section(module_settings)["story"]
    Payment.objects.filter(pk=story.ids["within the limits"]).update(amount=Decimal("15000.01"))

    _, checks = risk_checks(story, sandbox_stats={})

    assert not _check(checks, "no merchant exceeded an exposure limit")


@pytest.mark.django_db(transaction=True)
def test_the_operator_approves_a_held_payment_through_the_admin_over_http(
    live_server, module_settings
):
    module_settings.FRAUD_RULES = {**DEMO_FRAUD_RULES, **FRAUD_RULES}
    held = payment_create(
        merchant_id=CAPPED, amount=Decimal("12000.00"), source_token="tok_demo_risk900x"
    )
    assert held.review_status == "held"
    username, password = operator_create()

    refused = admin_decide(live_server.url, username, "wrong", str(held.id), "approve", "ok")
    assert refused == 200  # the login page again: nothing decided
    assert Payment.objects.get(pk=held.pk).review_status == "held"

    status = admin_decide(live_server.url, username, password, str(held.id), "approve", "ok")

    assert status == 302
    assert Payment.objects.get(pk=held.pk).review_status == "approved"
    again = admin_decide(live_server.url, username, password, str(held.id), "reject", "late")
    assert again == 200  # the review page, naming the refusal: decided once
    assert Payment.objects.get(pk=held.pk).review_status == "approved"


@pytest.mark.django_db(transaction=True)
def test_the_section_on_the_processor_backend_passes_every_check(
    module_settings, live_server, sqs_queues, tmp_path
):
    """The whole section against the real parts: the API and the admin on a live server, the
    sandbox processor posting its callbacks to it, a worker process applying them."""
    import signal

    from rest_framework.authtoken.models import Token

    from demo.risk import processor_accounts, run_risk
    from tests.callbacks.sandbox_support import sandbox_posting_callbacks
    from tests.callbacks.worker_support import WorkerProcess

    module_settings.FRAUD_RULES = {**DEMO_FRAUD_RULES, **FRAUD_RULES}
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0
    UserFactory(username="admin", is_superuser=True, is_staff=True)
    client = UserFactory(username="demo-api-client")
    token = Token.objects.create(user=client).key
    with sandbox_posting_callbacks(module_settings, live_server, return_after_seconds=0.2) as sb:
        worker = WorkerProcess("--wait-time", "1", log_dir=tmp_path)
        try:
            rows, checks = run_risk(
                web_url=live_server.url,
                token=token,
                client_username=client.username,
                account=processor_accounts(),
                sandbox_url=sb.base_url,
                timeout=90,
            )
        finally:
            worker.signal(signal.SIGTERM)
            worker.wait(30)

    failed = [label for label, passed in checks if not passed]
    assert not failed, (failed, rows, worker.output[-2000:])
    assert len(checks) == 11
    shown = dict(rows)
    assert shown["past the single-entry cap"] == "exposure_limit_exceeded:debit_single_limit"
    assert shown["  its next debit"] == "account_blocked:source_token"


@pytest.fixture
def bank_backend(module_settings, sqs_queues, tmp_path):
    """The bank backend as the bank demo runs it: the vault, the originator, a directory
    transport the sandbox bank answers through."""
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


def _bank_rounds(stop, transport, errors: list) -> None:
    """What the bank demo's processes do, round after round: cut and deliver the files, let
    their banking day pass and the sandbox bank answer, collect the answers, work the queue."""
    from django.db import connection
    from django.utils import timezone

    from bank.collect import nacha_files_collect
    from bank.nacha.services import nacha_send_due
    from bank.vault.services import vault_account_reveal
    from demo.bank_day import answer_round, settle_round
    from tests.callbacks.worker_support import run_worker

    try:
        while not stop.is_set():
            run_worker(relay=True)
            nacha_send_due(
                now=timezone.now(),
                transport=transport,
                resolve_account=vault_account_reveal,
                lead=None,
            )
            settle_round()
            answer_round(transport.outbound, transport.inbound)
            nacha_files_collect(transport=transport, min_age_seconds=0)
            run_worker(relay=True)
            stop.wait(0.3)
    except Exception as exc:  # noqa: BLE001 - reported by the test
        errors.append(exc)
    finally:
        connection.close()


@pytest.mark.django_db(transaction=True)
def test_the_section_on_the_bank_backend_passes_every_check(
    module_settings, bank_backend, live_server
):
    """The whole section on the bank backend: accounts stored in the vault through the API,
    entries in files, the sandbox bank's R17 QUESTIONABLE answer collected and applied."""
    import threading

    from rest_framework.authtoken.models import Token

    from bank.nacha.models import NachaEntry
    from demo.risk import bank_accounts, run_risk

    module_settings.FRAUD_RULES = {**DEMO_FRAUD_RULES, **FRAUD_RULES}
    module_settings.AVAILABLE_AFTER_BANKING_DAYS = 0
    UserFactory(username="admin", is_superuser=True, is_staff=True)
    client = UserFactory(username="demo-api-client")
    token = Token.objects.create(user=client).key
    stop, errors = threading.Event(), []
    rounds = threading.Thread(target=_bank_rounds, args=(stop, bank_backend, errors))
    rounds.start()
    try:
        rows, checks = run_risk(
            web_url=live_server.url,
            token=token,
            client_username=client.username,
            account=bank_accounts(live_server.url, token),
            timeout=90,
        )
    finally:
        stop.set()
        rounds.join(60)

    assert not errors, errors
    failed = [label for label, passed in checks if not passed]
    assert not failed, (failed, rows)
    # The rejected payout never reached a file; the approved debit did, once.
    rejected = Payment.objects.get(review_status="rejected")
    approved = Payment.objects.get(review_status="approved")
    assert not NachaEntry.objects.filter(payment=rejected).exists()
    assert NachaEntry.objects.filter(payment=approved, file__isnull=False).count() == 1
