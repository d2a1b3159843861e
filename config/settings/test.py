"""Settings for the test suite: PostgreSQL over a real connection, never SQLite."""

import os

os.environ.setdefault("SECRET_KEY", "test-secret-key-not-for-production")
os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/payments")
os.environ.setdefault("PROCESSOR_BASE_URL", "http://127.0.0.1:9")
os.environ.setdefault("PROCESSOR_API_KEY", "test-processor-key")
os.environ.setdefault("CALLBACK_SIGNING_SECRETS", "test-signing-secret")
os.environ.setdefault("PROCESSOR_TIMEOUT_SECONDS", "2")
# Never AWS from a test: a closed loopback port unless a test points at the local SQS server.
os.environ.setdefault("SQS_ENDPOINT_URL", "http://127.0.0.1:9")

from config.settings.base import *  # noqa: E402,F403

PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
CELERY_TASK_ALWAYS_EAGER = False

# Tests render templates without running collectstatic first.
STORAGES = {
    **STORAGES,  # noqa: F405
    "staticfiles": {"BACKEND": "django.contrib.staticfiles.storage.StaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True

# A worker subprocess a test starts may be told to stop at a named point (callbacks.conf).
if "WORKER_PAUSE_AT" in os.environ:
    CALLBACKS["WORKER_PAUSE_AT"] = os.environ["WORKER_PAUSE_AT"]  # noqa: F405
if "PROCESSOR_EVENTS_PULL_PAUSE_AT" in os.environ:
    CALLBACKS["PROCESSOR_EVENTS_PULL_PAUSE_AT"] = os.environ["PROCESSOR_EVENTS_PULL_PAUSE_AT"]  # noqa: F405

# A test's transaction is not visible to another connection, so the suite publishes a committed
# outbox row in the committing thread; the publisher thread (callbacks.outbox_after_commit) is
# tested on committed rows (tests/callbacks/test_outbox_after_commit.py) and runs wherever a test
# starts gunicorn or a worker with OUTBOX_PUBLISH_LINGER_SECONDS set.
if "OUTBOX_PUBLISH_LINGER_SECONDS" not in os.environ:
    CALLBACKS["OUTBOX_PUBLISH_LINGER_SECONDS"] = 0  # noqa: F405

# Each scrape reads the shared-state gauges afresh, so a test sees the rows it wrote rather than
# another test's snapshot; the snapshot interval itself is tested with the production value set
# explicitly (tests/triage/test_metrics_snapshot.py).
TRIAGE = {**TRIAGE, "METRICS_SNAPSHOT_SECONDS": 0}  # noqa: F405

# The fraud rules are on by default (payments.fraud_rules); most tests pay out to accounts made a
# moment ago and would be held by them, so the suite turns them off and the rules' own tests
# (tests/payments/test_fraud_rules.py) turn them on with ``module_settings``.
PAYMENTS = {  # noqa: F405
    **PAYMENTS,  # noqa: F405
    "FRAUD_RULES": {
        "new_destination": {"enabled": False},
        "velocity": {"enabled": False},
        "first_large_debit": {"enabled": False},
    },
}
