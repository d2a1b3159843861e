"""What a chaos run prints and keeps: the API's answers checked against the database, a summary
of the run, and ``report.json`` with the fault log and the invariant report."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from chaos.config import (
    DATABASE_OUTAGE_SECONDS,
    PROCESSOR_FLAP_SECONDS,
    PROCESSOR_OUTAGE_MODE,
    PROCESSOR_OUTAGE_SECONDS,
    QUEUE_OUTAGE_SECONDS,
    VAR,
    VISIBILITY_TIMEOUT,
)
from chaos.load import LoadStats

# The refusals the run's load may meet: its exposure limits (chaos/review.py), and a WEB debit
# from an account whose validation failed (chaos/validation.py).
EXPECTED_REFUSALS = ("exposure_limit_exceeded:", "account_not_validated:")


def check_api(load: LoadStats) -> list[str]:
    """Each acknowledged Idempotency-Key made exactly one payment; none was lost."""
    from payments.models import Payment

    problems = []
    if load.failures:
        problems.append(
            f"{len(load.failures)} payment request(s) never got an answer: "
            + "; ".join(load.failures[:5])
        )
    ids = set(load.created.values())
    # The debits the load made (the money-out fault's refunds and payouts are its own).
    stored = {
        str(pk) for pk in Payment.objects.filter(purpose="collection").values_list("id", flat=True)
    }
    if len(ids) != len(load.created):
        problems.append("two Idempotency-Keys were answered with the same payment")
    if stored - ids:
        problems.append(
            f"{len(stored - ids)} payment(s) in the database that no answer named "
            f"(a retry created a second payment): {sorted(stored - ids)[:5]}"
        )
    if ids - stored:
        problems.append(f"{len(ids - stored)} acknowledged payment(s) are not in the database")
    unexpected = {k: r for k, r in load.refused.items() if not r.startswith(EXPECTED_REFUSALS)}
    if unexpected:
        problems.append(
            f"{len(unexpected)} create(s) refused for another reason than an exposure limit or "
            "an account whose validation failed: "
            + "; ".join(f"{k}: {r}" for k, r in list(unexpected.items())[:5])
        )
    return problems


def _counts() -> dict:
    """What the database holds after the run, grouped as the summary shows it."""
    from django.db.models import Count

    from callbacks.models import ParkedMessage, PaymentHold
    from payments.models import (
        CircuitBreakerTransition,
        LedgerEntry,
        Payment,
        PaymentReturn,
        ProcessorAttempt,
    )
    from triage.models import DeadLetter

    def by(queryset, column: str) -> dict:
        return dict(queryset.values_list(column).annotate(n=Count("id")))

    return {
        "states": by(Payment.objects, "state"),
        "attempts": by(ProcessorAttempt.objects, "outcome"),
        "slow": ProcessorAttempt.objects.filter(
            latency_ms__gt=VISIBILITY_TIMEOUT * 1000, outcome="accepted"
        ).count(),
        "dead": by(DeadLetter.objects, "last_error_class"),
        "holds": PaymentHold.objects.filter(released_at__isnull=True, kind="triage").count(),
        "outage_holds": PaymentHold.objects.filter(kind="outage").count(),
        "parked": ParkedMessage.objects.count(),
        "breaker": by(CircuitBreakerTransition.objects, "kind"),
        "returns": by(PaymentReturn.objects, "after_settlement"),
        "reversals": LedgerEntry.objects.filter(kind="reversal").count(),
    }


def summary(run, load: LoadStats, stats: dict, settled: bool, backlog: dict, dead_letters: int):
    """The run in a dozen lines: what was created, answered, charged, delivered and injected."""
    n = _counts()
    kills = sum(w.killed_by_us for w in run.workers)
    unexpected = {w.name: w.unexpected_exits for w in run.workers if w.unexpected_exits}
    tracebacks = {
        child.name: child.log_path.read_text(errors="replace").count("Traceback")
        for child in run.children.values()
        if child.log_path.exists()
    }
    returns = n["returns"]
    lines = [
        "",
        f"chaos summary (seed {run.config.seed}; CHAOS_SEED={run.config.seed} runs it again)",
        f"  payments: {len(load.created)} created of {run.config.payments}; states {n['states']}",
        f"  api answers: {dict(load.statuses)}; retries {load.retries}; "
        f"{load.double_sends} sent twice at once with one key",
        f"  processor: {stats.get('total_charges')} charges over "
        f"{len(stats.get('charges', {}))} keys; answers {stats.get('responses')}",
        f"  processor attempts: {n['attempts']}; {n['slow']} accepted after more than the "
        f"{VISIBILITY_TIMEOUT} s visibility timeout",
        f"  injected faulty callbacks accepted: {len(run.injected)}; dead letters by error "
        f"{n['dead']}; active holds for a person {n['holds']}; parked messages {n['parked']}",
        f"  callbacks: delivered {stats.get('callbacks_sent')}, failed attempts "
        f"{stats.get('callback_failed_attempts')}, given up {stats.get('callbacks_given_up')}",
        f"  faults: {kills} worker SIGKILLs, {run.web_kills} gunicorn worker SIGKILLs, "
        f"{run.pg_terminated} PostgreSQL backends "
        f"terminated, one {QUEUE_OUTAGE_SECONDS:.0f} s queue outage, {run.database_outages} "
        f"database outage(s) of {DATABASE_OUTAGE_SECONDS} s",
        f"  processor outage: {PROCESSOR_OUTAGE_SECONDS} s ({PROCESSOR_OUTAGE_MODE}), then "
        f"{PROCESSOR_FLAP_SECONDS} s of flapping; breaker {n['breaker']}; submissions parked "
        f"through it {n['outage_holds']}",
        f"  worker exits not caused by the run: {unexpected or 'none'}",
        f"  tracebacks in logs: {tracebacks}",
        f"  returns: {returns.get(True, 0)} after settlement ({n['reversals']} ledger "
        f"reversals), {returns.get(False, 0)} before settlement",
        f"  risk: creates refused {dict(Counter(load.refused.values())) or 'none'}; "
        f"reviewer {dict(run.review_counts) or 'idle'}",
        validation_line(run),
        f"  settled: {settled} {backlog}; dead letters ingested: {dead_letters}",
    ]
    return "\n".join(lines)


def validation_line(run) -> str:
    """The validation share in one line: the accounts' ends by plan, the WEB debits made and
    refused, the micro-entry answers by code, and what the validation service answered."""
    from payments.models import AccountValidation

    states = dict(Counter(AccountValidation.objects.values_list("method", "state")))
    answers = Counter(f"{a['status']} {a['code']}".strip() for a in run.verify_answers)
    service = dict(run.validation_double.answers) if run.validation_double else {}
    return (
        f"  validation (UNVALIDATED_WEB_DEBITS=hold): {dict(run.validation_counts) or 'idle'}; "
        f"validations by (method, state) { {f'{m} {s}': n for (m, s), n in states.items()} }; "
        f"verify answers {dict(answers)}; service answered {service}"
    )


def write_report(run, *, load: LoadStats, record: dict, report, settled: bool, backlog: dict,
                 api_problems: list[str]) -> None:  # fmt: skip
    """``report.json``: the config, the fault log, the load and the invariant report."""
    (VAR / "report.json").write_text(
        json.dumps(
            {
                "config": run.config.__dict__,
                "events": run.events,
                "settled": settled,
                "backlog": backlog,
                "api_problems": api_problems,
                "harness_errors": run.harness_errors,
                "load": {
                    "created": len(load.created),
                    "statuses": dict(load.statuses),
                    "retries": load.retries,
                    "failures": load.failures,
                    "refused": load.refused,
                },
                "review": dict(run.review_counts),
                "validation": dict(run.validation_counts),
                "refused_creates": len(run.refused_creates),
                "verify_answers": len(run.verify_answers),
                "sandbox": record["stats"],
                "invariants": report.as_dict(),
            },
            indent=2,
            default=str,
        )
    )


def recheck_command(database_url: str, python: str, root: Path) -> str:
    """How to run the invariant checker again on the database the run leaves behind."""
    shown = Path(python).relative_to(root) if root in Path(python).parents else python
    return (
        f"logs and report.json in {VAR.relative_to(root)}/; check again with: "
        # The run's reserve (chaos.config): payouts_never_overdraw replays the balances by it.
        "AVAILABLE_AFTER_BANKING_DAYS=0 "
        f"DJANGO_SETTINGS_MODULE=config.settings.test DATABASE_URL={database_url} "
        f"{shown} -m chaos.invariants "
        f"--sandbox-stats {VAR.relative_to(root)}/sandbox-stats.json "
        f"--callbacks-sent {VAR.relative_to(root)}/callbacks-sent.json "
        f"--callbacks-dropped {VAR.relative_to(root)}/callbacks-dropped.json "
        f"--processor-events {VAR.relative_to(root)}/processor-events.json "
        f"--webhook-receipts {VAR.relative_to(root)}/webhook-receipts.json "
        f"--processor-debits {VAR.relative_to(root)}/processor-debits.json "
        f"--refused-creates {VAR.relative_to(root)}/refused-creates.json "
        f"--verify-answers {VAR.relative_to(root)}/verify-answers.json "
        "--expect-limits --expect-holds --expect-validation"
    )
