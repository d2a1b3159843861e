"""NACHA's account validation rule, checked after the fact: no debit of a class that needs its
account validated (WEB, and any the host adds) left before its account was validated, and no
account was validated by a prenote before the prenote's wait was over."""

import uuid
from collections import Counter, defaultdict
from datetime import UTC, datetime
from decimal import Decimal

from chaos.invariants.report import Report


def check_web_debits_validated_first(report: Report) -> None:
    """``web_debits_validated_first``: every debit of a class ``ACCOUNT_VALIDATION_REQUIRED``
    names that reached the processor or a bank file (a submission began, or the log records
    the processor's word on it) had its account validated at or before that moment, by the
    validation of its token. A reinitiation is exempt (not the account's first use); a debit
    held for validation and failed with it never left."""
    from django.db.models import Min

    from payments.models import (
        AccountValidation,
        EventKind,
        Payment,
        PaymentDirection,
        PaymentEvent,
    )
    from payments.services.validation_rule import validation_required

    check = "web_debits_validated_first"
    classes = [code for code in ("WEB", "PPD", "CCD") if validation_required(code)]
    debits = Payment.objects.filter(
        direction=PaymentDirection.DEBIT, reinitiation_of__isnull=True, sec_code__in=classes
    )
    left_at = dict(
        PaymentEvent.objects.filter(
            payment__in=debits, kind__in=(EventKind.SUBMISSION, EventKind.PROCESSOR_EVENT)
        )
        .values("payment_id")
        .annotate(first=Min("created_at"))
        .values_list("payment_id", "first")
    )
    for payment_id, started in debits.filter(submission_started_at__isnull=False).values_list(
        "id", "submission_started_at"
    ):
        if payment_id not in left_at or started < left_at[payment_id]:
            left_at[payment_id] = started
    tokens = dict(debits.filter(id__in=left_at).values_list("id", "source_token"))
    validated_at = dict(
        AccountValidation.objects.filter(
            account_token__in=set(tokens.values()), validated_at__isnull=False
        ).values_list("account_token", "validated_at")
    )
    early = sorted(
        str(payment_id)
        for payment_id, moment in left_at.items()
        if validated_at.get(tokens[payment_id]) is None or validated_at[tokens[payment_id]] > moment
    )
    if early:
        report.add(
            check,
            f"{len(early)} debit(s) of {', '.join(classes)} left before their account was "
            "validated",
            early,
        )
    report.checked[check] = {"debits that left": len(left_at), "classes": ", ".join(classes)}


def check_prenotes_waited(report: Report) -> None:
    """``prenotes_waited``: every account validated by a prenote was validated at or after its
    ``live_from`` (the third banking day after the prenote's settlement), which is set, and, on
    the bank backend, after the file holding its prenote was delivered."""
    from django.apps import apps

    from payments.models import AccountValidation, ValidationMethod, ValidationState

    check = "prenotes_waited"
    validated = list(
        AccountValidation.objects.filter(
            method=ValidationMethod.PRENOTE, state=ValidationState.VALIDATED
        ).values_list("pk", "validated_at", "live_from", "evidence")
    )
    delivered_at: dict[str, object] = {}
    if apps.is_installed("bank"):
        from bank.nacha.models import NachaPrenote

        delivered_at = dict(
            NachaPrenote.objects.filter(validation__in=[row[0] for row in validated]).values_list(
                "trace_number", "file__delivered_at"
            )
        )
    early = []
    for pk, validated_at, live_from, evidence in validated:
        trace = (evidence or {}).get("prenote", {}).get("trace_number")
        sent = delivered_at.get(trace) if trace else validated_at
        if (
            live_from is None
            or validated_at is None
            or validated_at < live_from
            or sent is None
            or sent > validated_at
        ):
            early.append(str(pk))
    if early:
        report.add(
            check,
            f"{len(early)} account(s) validated by a prenote before its wait was over",
            sorted(early),
        )
    report.checked[check] = {"validated by prenote": len(validated)}


def _when(stamp: str) -> datetime:
    when = datetime.fromisoformat(stamp)
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def check_web_debits_reached_processor_validated(
    report: Report, processor_debits: list | None, *, expected: bool = False
) -> None:
    """The processor's side of ``web_debits_validated_first``: every WEB debit the processor
    took (its own record: the class submitted, the account, when the first call arrived),
    reinitiations apart, arrived at or after its account's validation was validated. A WEB
    debit of ours the processor took under another class counts as WEB. ``expected`` (the run
    validated a share of its accounts): a run whose processor took no WEB debit fails."""
    from payments.models import AccountValidation, Payment

    check = "web_debits_validated_first"
    if processor_debits is None:
        if expected:
            report.add(
                check, "the run validated accounts, yet the processor's debits were not given"
            )
        return
    ours = {
        str(pid): (sec_code, reinitiation)
        for pid, sec_code, reinitiation in Payment.objects.filter(direction="debit").values_list(
            "id", "sec_code", "reinitiation_of_id"
        )
    }
    web = []
    for debit in processor_debits:
        sec_code, reinitiation = ours.get(str(debit.get("payment_id")), ("", None))
        if reinitiation is not None:
            continue
        if debit.get("sec_code") == "WEB" or sec_code == "WEB":
            web.append(debit)
    validated_at = dict(
        AccountValidation.objects.filter(
            account_token__in={d.get("source_token") for d in web}, validated_at__isnull=False
        ).values_list("account_token", "validated_at")
    )
    early = []
    for debit in web:
        validated = validated_at.get(debit.get("source_token"))
        arrived = _when(debit.get("received_at") or debit["created_at"])
        if validated is None or arrived < validated:
            when = "never validated" if validated is None else f"validated {validated.isoformat()}"
            early.append(f"{debit.get('payment_id')} (arrived {arrived.isoformat()}, {when})")
    if early:
        report.add(
            check,
            f"{len(early)} WEB debit(s) reached the processor before their account was validated",
            sorted(early),
        )
    if expected and not web:
        report.add(
            check,
            "the run validated a share of its accounts, yet the processor took no WEB debit: the "
            "check proved nothing",
        )
    report.checked.setdefault(check, {})["WEB debits at the processor"] = len(web)
    report.checked[check]["their accounts"] = len({d.get("source_token") for d in web})


def check_held_debits_decided_once(
    report: Report, sandbox_stats: dict, *, expected: bool = False
) -> None:
    """``held_debits_decided_once``: every debit held for its account's validation was decided
    once: released once (its validation validated) and then charged by the processor once
    (never, only when the processor refused it: failed), or failed once (its validation
    failed) and never attempted, submitted nor charged. One still held after its validation
    ended was forgotten; one still held on a validation not ended (pending, or never started:
    it may wait) is a violation when the run validates every account it debits
    (``expected``), which also fails a run that held nothing."""
    from payments.models import (
        AccountValidation,
        EventKind,
        Payment,
        PaymentEvent,
        ProcessorAttempt,
        ReviewStatus,
        ValidationState,
    )
    from payments.services.validation import FAILED_EVENT, RELEASED_EVENT

    check = "held_debits_decided_once"
    decisions: dict = defaultdict(Counter)
    for pid, event_type in PaymentEvent.objects.filter(
        kind=EventKind.REVIEW, event_type__in=(RELEASED_EVENT, FAILED_EVENT)
    ).values_list("payment_id", "event_type"):
        decisions[pid][event_type] += 1
    still = set(
        Payment.objects.filter(review_status=ReviewStatus.VALIDATION).values_list("id", flat=True)
    )
    held = set(decisions) | still
    rows = {
        row["id"]: row
        for row in Payment.objects.filter(id__in=held).values(
            "id", "idempotency_key", "state", "source_token", "submission_started_at"
        )
    }
    states = dict(
        AccountValidation.objects.filter(
            account_token__in={r["source_token"] for r in rows.values()}
        ).values_list("account_token", "state")
    )
    attempted = set(
        ProcessorAttempt.objects.filter(payment_id__in=held).values_list("payment_id", flat=True)
    )
    charges = sandbox_stats.get("charges") or {}
    wrong: list[str] = []
    counts: Counter = Counter()
    for pid in held:
        row, seen = rows[pid], decisions.get(pid, Counter())
        charged = int(charges.get(str(row["idempotency_key"]), 0))
        released, failed = seen[RELEASED_EVENT], seen[FAILED_EVENT]
        validation = states.get(row["source_token"])
        if released + failed > 1:
            wrong.append(f"{pid} (decided {released + failed} times)")
        elif pid in still:
            if validation in (ValidationState.VALIDATED, ValidationState.FAILED):
                wrong.append(f"{pid} (still held, its validation {validation})")
            elif expected:
                wrong.append(f"{pid} (still held: its validation, {validation}, never ended)")
            counts["still held"] += 1
        elif released:
            counts["released"] += 1
            if charged == 1:
                counts["released and charged once"] += 1
            elif charged > 1 or row["state"] != "failed":
                wrong.append(f"{pid} (released, charged {charged} times, {row['state']})")
        else:
            counts["failed with its validation"] += 1
            signs = [
                name
                for name, present in (
                    ("not failed", row["state"] != "failed"),
                    ("an attempt", pid in attempted),
                    ("a submission started", row["submission_started_at"] is not None),
                    ("a charge", charged > 0),
                )
                if present
            ]
            if signs:
                wrong.append(f"{pid} (failed with its validation, yet {', '.join(signs)})")
    if wrong:
        report.add(
            check, f"{len(wrong)} debit(s) held for validation not decided exactly once", wrong
        )
    if expected and not held:
        report.add(
            check,
            "the run held WEB debits for validation, yet none was held: the check proved nothing",
        )
    report.checked[check] = {"held for validation": len(held), **counts}


def check_refused_web_debits_left_nothing(
    report: Report, refused_creates: list | None = None, *, expected: bool = False
) -> None:
    """``refused_web_debits_left_nothing``: no debit of a class that needs validation (not a
    reinitiation) was made from an account after its validation failed (such a create is
    refused 409 ``account_not_validated``); and, given the creates refused so (``source_token``,
    ``merchant_id``, ``amount``, ``sent_at`` and ``answered_at``), no payment of that account,
    merchant and amount was made between the first send and the answer. ``expected``: a run
    that had none refused fails."""
    from payments.models import AccountValidation, Payment, ValidationState
    from payments.services.validation_rule import validation_required

    check = "refused_web_debits_left_nothing"
    classes = [code for code in ("WEB", "PPD", "CCD") if validation_required(code)]
    failed_at = dict(
        AccountValidation.objects.filter(
            state=ValidationState.FAILED, failed_at__isnull=False
        ).values_list("account_token", "failed_at")
    )
    debits = Payment.objects.filter(
        direction="debit", reinitiation_of__isnull=True, sec_code__in=classes
    )
    made = defaultdict(list)
    for pid, token, merchant, amount, created in debits.filter(
        source_token__in=list(failed_at)
        + [str(r.get("source_token")) for r in refused_creates or []]
    ).values_list("id", "source_token", "merchant_id", "amount", "created_at"):
        made[token].append((pid, merchant, amount, created))
    wrong = [
        f"{pid} (made after its account's validation failed)"
        for token, when in failed_at.items()
        for pid, _, _, created in made.get(token, [])
        if created > when
    ]
    for refused in refused_creates or []:
        sent, answered = _when(refused["sent_at"]), _when(refused["answered_at"])
        wrong += [
            f"{pid} (made by a create answered account_not_validated)"
            for pid, merchant, amount, created in made.get(refused["source_token"], [])
            if merchant == refused["merchant_id"]
            and amount == Decimal(refused["amount"])
            and sent <= created <= answered
        ]
    if wrong:
        report.add(check, f"{len(wrong)} debit(s) made where the create was refused", sorted(wrong))
    if expected and not refused_creates:
        report.add(
            check,
            "the run's failed validations were followed by creates, yet none was refused "
            "account_not_validated: the check proved nothing",
        )
    report.checked[check] = {
        "accounts whose validation failed": len(failed_at),
        "creates refused account_not_validated": len(refused_creates or []),
    }


MISMATCH = "micro_entries_mismatch"


def check_micro_entry_attempts(
    report: Report, verify_answers: list | None = None, *, expected: bool = False
) -> None:
    """``micro_entry_attempts_bounded``: no micro-entries validation counted more wrong tries
    than ``PAYMENTS["MICRO_ENTRY_MAX_ATTEMPTS"]``; one failed for wrong amounts counted exactly
    that many; and, given the verify answers the clients got (``account_token``, ``status``,
    ``code``), no account was answered ``micro_entries_mismatch`` (a try spent) more times
    than that, and none was validated after its last try was spent. ``expected``: a run that
    verified no micro-entries fails."""
    from payments import conf as payments_conf
    from payments.models import AccountValidation, ValidationMethod, ValidationState

    check = "micro_entry_attempts_bounded"
    most = payments_conf.MICRO_ENTRY_MAX_ATTEMPTS
    rows = list(
        AccountValidation.objects.filter(method=ValidationMethod.MICRO_ENTRIES).values_list(
            "account_token", "state", "attempts", "failure_reason"
        )
    )
    wrong = [f"{token} ({n} tries counted)" for token, _, n, _ in rows if n > most]
    wrong += [
        f"{token} (failed for wrong amounts after {attempts} tries)"
        for token, state, attempts, reason in rows
        if state == ValidationState.FAILED and "wrong too often" in reason and attempts != most
    ]
    mismatches: Counter = Counter()
    late = set()
    for answer in verify_answers or []:
        token = answer.get("account_token")
        if answer.get("code") == MISMATCH:
            mismatches[token] += 1
        elif answer.get("status") == 200 and mismatches[token] >= most:
            late.add(token)
    wrong += [f"{t} (answered {MISMATCH} {n} times)" for t, n in mismatches.items() if n > most]
    wrong += [f"{t} (validated after its last try was spent)" for t in sorted(late)]
    if wrong:
        report.add(
            check, f"{len(wrong)} account(s) past the micro-entries' try limit", sorted(wrong)
        )
    if expected and not verify_answers:
        report.add(
            check,
            "the run verified micro-entries, yet no verify answer was given: the check proved "
            "nothing",
        )
    report.checked[check] = {
        "micro-entries validations": len(rows),
        "failed for wrong amounts": sum(
            1 for _, s, _, r in rows if s == ValidationState.FAILED and "wrong too often" in r
        ),
        "verify answers": len(verify_answers or []),
        "tries spent (409 mismatch)": sum(mismatches.values()),
        "limit": most,
    }


def micro_entry_keys() -> set[str]:
    """The processor keys of the micro-entries sent as the validation's own calls, derived
    from each round its evidence names (the current one and the earlier ones): they are ours
    though no payment holds them. Micro-entries made as payments are found as payments."""
    from payments.models import AccountValidation

    keys: set[str] = set()
    for evidence in AccountValidation.objects.values_list("evidence", flat=True):
        rounds = [evidence or {}] + [
            e.get("evidence") or {} for e in (evidence or {}).get("earlier", [])
        ]
        for found in rounds:
            round_id = (found.get("micro_entries") or {}).get("round")
            if not round_id:
                continue
            try:
                base = uuid.UUID(str(round_id))
            except ValueError:
                continue
            credits = int((found.get("micro_entries") or {}).get("credits") or 2)
            keys.update(str(uuid.uuid5(base, f"credit-{n}")) for n in range(1, credits + 1))
            keys.add(str(uuid.uuid5(base, "debit")))
    return keys
