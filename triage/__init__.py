"""People and operations: dead letters in the Django admin with their whole history, the
operator's decisions (redrive, resolve, discard) one by one or in bulk, each audited, the triage
dashboard, alerts and their sinks, metrics, health checks, and the module's Celery beat
schedule."""
