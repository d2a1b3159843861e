"""Operations: what tells a human how the system is doing and when to step in.

- ``alerting``: alert policy, history and sinks (an ``Alert`` row per firing key, reminders,
  settlement-window suppression, webhook and e-mail); ``alert_conditions``: what the periodic
  evaluation checks, one function per condition; ``admin``: the alert history in the admin.
- ``monitoring``: the operations snapshot and the Prometheus gauges read at scrape time;
  ``health``: ``/healthz``, ``/readyz`` and ``/metrics``.
- ``dashboard``: the triage dashboard page, drawn with ``charts``.
- ``return_rates``: per-merchant return rates against the NACHA thresholds, with their alerts,
  gauges and dashboard panel.

The Celery tasks that run them stay in ``triage.tasks`` (their names are the beat schedule's).
"""
