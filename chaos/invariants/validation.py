"""NACHA's account validation rule, checked after the fact: no debit of a class that needs its
account validated (WEB, and any the host adds) left before its account was validated."""

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
