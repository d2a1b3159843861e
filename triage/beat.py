"""The module's periodic tasks, as a Celery beat schedule a host merges into its own:

    app.conf.beat_schedule = {**host_schedule, **beat_schedule()}

Each entry expires after its interval: ticks missed while workers were down do not pile up.
"""

from typing import Any


def beat_schedule(
    *, dlq_ingest_interval: float | None = None, bank_direct: bool = False
) -> dict[str, dict[str, Any]]:
    """The schedule; dead letters are ingested every ``dlq_ingest_interval`` seconds
    (default: the DLQ_INGEST_INTERVAL_SECONDS setting, 60). ``bank_direct`` adds the bank
    path's rounds (``PROCESSOR_BACKEND`` = the NACHA backend): sending files every 5 minutes
    (a window is cut within 10 minutes of its cutoff) and collecting the bank's files, its
    statements, and checking the books' alerts. The pull of the processor's events runs every
    minute (a no-op for a backend without an events API), so a callback the processor never
    delivered is applied within a minute or two."""
    if dlq_ingest_interval is None:
        from triage import conf

        dlq_ingest_interval = float(conf.DLQ_INGEST_INTERVAL_SECONDS)
    every = {
        "triage.tasks.dead_letters_ingest": dlq_ingest_interval,
        "triage.tasks.queue_metrics_sample": 60.0,
        "triage.tasks.alerts_evaluate": 60.0,
        "triage.tasks.beat_heartbeat": 60.0,
        "callbacks.tasks.payments_reconcile": 300.0,
        "callbacks.tasks.processor_events_pull": 60.0,
        "triage.tasks.bulk_jobs_resume_stale": 60.0,
        "callbacks.tasks.outbox_relay_publish": 60.0,
        "payments.tasks.refunds_release": 300.0,
        "payments.tasks.review_holds_check": 300.0,
        "payments.tasks.available_totals_fold": 60.0,
        "payments.tasks.account_validations_advance": 300.0,
        "payments.tasks.webhooks_dispatch": 5.0,
        "payments.tasks.events_purge": 3600.0,
        "payments.tasks.processed_events_purge": 3600.0,
        "payments.tasks.idempotency_keys_purge": 3600.0,
        "callbacks.tasks.queue_messages_purge": 3600.0,
        "payments.tasks.outbox_messages_purge": 3600.0,
        "payments.tasks.breaker_transitions_purge": 86400.0,
        "callbacks.tasks.holds_purge": 86400.0,
        "triage.tasks.error_history_purge": 3600.0,
        "triage.tasks.alerts_purge": 86400.0,
        "triage.tasks.bulk_job_items_purge": 86400.0,
    }
    if bank_direct:
        every["bank.tasks.nacha_send"] = 300.0
        every["bank.tasks.nacha_collect"] = 300.0
        every["bank.tasks.bank_statements_collect"] = 300.0
        every["bank.tasks.books_alerts_check"] = 300.0
    names = {
        "triage.tasks.dead_letters_ingest": "dead-letters-ingest",
        "triage.tasks.queue_metrics_sample": "queue-metrics-sample",
        "triage.tasks.alerts_evaluate": "alerts-evaluate",
        "triage.tasks.beat_heartbeat": "beat-heartbeat",
        "callbacks.tasks.payments_reconcile": "payments-reconcile",
        "callbacks.tasks.processor_events_pull": "processor-events-pull",
        "triage.tasks.bulk_jobs_resume_stale": "bulk-jobs-resume-stale",
        "callbacks.tasks.outbox_relay_publish": "outbox-relay-publish",
        "payments.tasks.refunds_release": "refunds-release",
        "payments.tasks.review_holds_check": "review-holds-check",
        "payments.tasks.available_totals_fold": "available-totals-fold",
        "payments.tasks.account_validations_advance": "account-validations-advance",
        "payments.tasks.webhooks_dispatch": "webhooks-dispatch",
        "payments.tasks.events_purge": "events-purge",
        "payments.tasks.processed_events_purge": "processed-events-purge",
        "payments.tasks.idempotency_keys_purge": "idempotency-keys-purge",
        "callbacks.tasks.queue_messages_purge": "queue-messages-purge",
        "payments.tasks.outbox_messages_purge": "outbox-messages-purge",
        "payments.tasks.breaker_transitions_purge": "breaker-transitions-purge",
        "callbacks.tasks.holds_purge": "holds-purge",
        "triage.tasks.error_history_purge": "error-history-purge",
        "triage.tasks.alerts_purge": "alerts-purge",
        "triage.tasks.bulk_job_items_purge": "bulk-job-items-purge",
        "bank.tasks.nacha_send": "nacha-send",
        "bank.tasks.nacha_collect": "nacha-collect",
        "bank.tasks.bank_statements_collect": "bank-statements-collect",
        "bank.tasks.books_alerts_check": "books-alerts-check",
    }
    return {
        names[task]: {"task": task, "schedule": seconds, "options": {"expires": seconds}}
        for task, seconds in every.items()
    }
