"""NACHA's account validation rule, checked after the fact: no debit of a class that needs its
account validated (WEB, and any the host adds) left before its account was validated, and no
account was validated by a prenote before the prenote's wait was over."""

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
