"""``python -m chaos.invariants``: the check against a database and a processor's record, by hand
(``make chaos`` prints the command line for the database it leaves behind)."""

import argparse
import json
import os
from pathlib import Path
from typing import Any

from chaos.invariants import check_invariants


def _load_json(source: str) -> Any:
    if source.startswith(("http://", "https://")):
        import requests

        response = requests.get(source, timeout=10)
        response.raise_for_status()
        return response.json()
    return json.loads(Path(source).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m chaos.invariants",
        description="Check the pipeline's invariants against the database (DATABASE_URL) and "
        "the processor's record; exit 1 on any violation. Reads only the database: "
        "DJANGO_SETTINGS_MODULE=config.settings.test spares setting the processor and signing "
        "secrets.",
    )
    parser.add_argument(
        "--sandbox-stats",
        required=True,
        help="the sandbox's stats: its URL (http://127.0.0.1:PORT/_sandbox/stats) or a JSON file",
    )
    parser.add_argument(
        "--callbacks-sent",
        help="JSON file listing the callbacks the processor delivered (bodies or event ids); "
        "without it they are accounted for by count",
    )
    parser.add_argument(
        "--callbacks-dropped",
        help="JSON file listing the callbacks the processor dropped on purpose (the sandbox's "
        "GET /_sandbox/drops 'dropped'); each must have been recovered by the events pull",
    )
    parser.add_argument(
        "--processor-events",
        help="JSON file listing every event the processor made, delivered or dropped (not the "
        "run's injected ones); each payment's final state must agree with them",
    )
    parser.add_argument(
        "--webhook-receipts",
        help="JSON file listing what a webhook receiver verified (WebhookReceiver.receipts); "
        "without it the webhook checks read the database alone",
    )
    parser.add_argument(
        "--expect-limits",
        action="store_true",
        help="the run set exposure limits: limits_never_exceeded fails if no entry was made "
        "under one",
    )
    parser.add_argument(
        "--expect-holds",
        action="store_true",
        help="the run turned on a rule that holds payments for review: "
        "held_payments_never_sent_unapproved fails if none was held",
    )
    parser.add_argument(
        "--processor-debits",
        help="JSON file listing every debit the processor took (the recorded sandbox's "
        "'debits'): no WEB debit may have arrived before its account was validated",
    )
    parser.add_argument(
        "--refused-creates",
        help="JSON file listing the creates answered 409 account_not_validated; none may have "
        "made a payment",
    )
    parser.add_argument(
        "--verify-answers",
        help="JSON file listing the answers clients got to their micro-entry amounts",
    )
    parser.add_argument(
        "--expect-validation",
        action="store_true",
        help="the run validated a share of its accounts: the validation checks fail if they "
        "found nothing to check",
    )
    parser.add_argument("--json", help="also write the report as JSON to this file")
    args = parser.parse_args(argv)

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings.base")
    import django

    django.setup()
    try:
        stats = _load_json(args.sandbox_stats)
        sent = _load_json(args.callbacks_sent) if args.callbacks_sent else None
        dropped = _load_json(args.callbacks_dropped) if args.callbacks_dropped else None
        made = _load_json(args.processor_events) if args.processor_events else None
        receipts = _load_json(args.webhook_receipts) if args.webhook_receipts else None
        debits = _load_json(args.processor_debits) if args.processor_debits else None
        refused = _load_json(args.refused_creates) if args.refused_creates else None
        answers = _load_json(args.verify_answers) if args.verify_answers else None
    except (OSError, ValueError) as exc:
        parser.error(f"cannot read the processor's record: {exc}")
    report = check_invariants(
        sandbox_stats=stats,
        callbacks_sent=sent,
        callbacks_dropped=dropped,
        processor_events=made,
        webhook_receipts=receipts,
        expect_limits=args.expect_limits,
        expect_holds=args.expect_holds,
        processor_debits=debits,
        refused_creates=refused,
        verify_answers=answers,
        expect_validation=args.expect_validation,
    )
    print(report.render())
    if args.json:
        Path(args.json).write_text(json.dumps(report.as_dict(), indent=2, default=str))
    return 0 if report.ok else 1
