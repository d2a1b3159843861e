"""Settings shared by every environment, read from the environment with django-environ.

Production secrets have no default: a missing one stops start-up with an error that names it.
A ``.env`` file in the project root is read too, if present.
"""

from datetime import timedelta
from pathlib import Path

import environ

from payments.signing import secrets_parse
from triage.beat import beat_schedule

BASE_DIR = Path(__file__).resolve().parent.parent.parent

env = environ.Env()
environ.Env.read_env(BASE_DIR / ".env", overwrite=False)

SECRET_KEY = env("SECRET_KEY")
DEBUG = env.bool("DEBUG", default=False)
ALLOWED_HOSTS = env.list("ALLOWED_HOSTS", default=["localhost", "127.0.0.1"])

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "payments",
    "callbacks",
    "triage",
    # The project's development app (the sandbox processor of the demo, bench and tests); a
    # host installs the three apps above and never this one.
    "sandbox",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # Serves the admin's static files from gunicorn (compressed, cached); no separate server.
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

DATABASES = {"default": env.db("DATABASE_URL")}
DATABASES["default"].setdefault("CONN_MAX_AGE", env.int("CONN_MAX_AGE", default=60))
DATABASES["default"].setdefault("CONN_HEALTH_CHECKS", True)
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded quick start: WAL lets readers run beside the single writer, and
    # IMMEDIATE transactions take the write lock up front instead of failing on upgrade.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        {
            "transaction_mode": "IMMEDIATE",
            "timeout": 30,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        }
    )
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": env(
            "STATICFILES_BACKEND",
            default="whitenoise.storage.CompressedManifestStaticFilesStorage",
        )
    },
}

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": None,
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
}

# OpenAPI 3 schema of the payments API and the callback endpoint, served at /api/schema/.
SPECTACULAR_SETTINGS = {
    "TITLE": "ACH payments",
    "DESCRIPTION": "Payments API (Token authentication) and the processor callback endpoint.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
}

# --- Security (production values come from the environment; see config/settings/production.py)
SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
SESSION_COOKIE_SECURE = env.bool("SESSION_COOKIE_SECURE", default=False)
CSRF_COOKIE_SECURE = env.bool("CSRF_COOKIE_SECURE", default=False)
SECURE_SSL_REDIRECT = env.bool("SECURE_SSL_REDIRECT", default=False)
SECURE_HSTS_SECONDS = env.int("SECURE_HSTS_SECONDS", default=0)
CSRF_TRUSTED_ORIGINS = env.list("CSRF_TRUSTED_ORIGINS", default=[])

ADMINS = [tuple(a.split(":", 1)) for a in env.list("ADMINS", default=[]) if ":" in a]
EMAIL_BACKEND = env("EMAIL_BACKEND", default="django.core.mail.backends.smtp.EmailBackend")
SERVER_EMAIL = env("SERVER_EMAIL", default="payments@localhost")

# --- AWS SQS
AWS_REGION = env("AWS_REGION", default="us-east-1")
SQS_ENDPOINT_URL = env("SQS_ENDPOINT_URL", default=None)
SQS_QUEUE_NAME = env("SQS_QUEUE_NAME", default="payments.fifo")
SQS_DLQ_NAME = env("SQS_DLQ_NAME", default="payments-dlq.fifo")

# --- Queue worker: retries with exponential backoff and full jitter, then the dead-letter queue
WORKER_BACKOFF_BASE_SECONDS = env.float("WORKER_BACKOFF_BASE_SECONDS", default=1.0)
WORKER_BACKOFF_CAP_SECONDS = env.float("WORKER_BACKOFF_CAP_SECONDS", default=30.0)
WORKER_MAX_ATTEMPTS = env.int("WORKER_MAX_ATTEMPTS", default=6)  # the first try plus 5 retries
# Keeps in-flight messages hidden past the visibility timeout; never turn it off in production.
WORKER_VISIBILITY_HEARTBEAT = env.bool("WORKER_VISIBILITY_HEARTBEAT", default=True)
# After a batch that was not full, wait this long before the next receive (fuller batches).
WORKER_RECEIVE_LINGER_SECONDS = env.float("WORKER_RECEIVE_LINGER_SECONDS", default=0.02)

# --- Processor
PROCESSOR_BASE_URL = env("PROCESSOR_BASE_URL")
PROCESSOR_API_KEY = env("PROCESSOR_API_KEY")
PROCESSOR_TIMEOUT_SECONDS = env.float("PROCESSOR_TIMEOUT_SECONDS", default=10.0)
PROCESSOR_CONNECT_TIMEOUT_SECONDS = env.float("PROCESSOR_CONNECT_TIMEOUT_SECONDS", default=3.05)
# Circuit breaker around the processor: it opens after a run of consecutive failures (5xx,
# timeouts, connection errors, 401/403) or when the failure rate over a short window passes a
# threshold (with a minimum of calls), pauses all calls, then lets one probe decide.
PROCESSOR_BREAKER_FAILURES = env.int("PROCESSOR_BREAKER_FAILURES", default=5)
PROCESSOR_BREAKER_FAILURE_RATE = env.float("PROCESSOR_BREAKER_FAILURE_RATE", default=0.5)
PROCESSOR_BREAKER_WINDOW_SECONDS = env.float("PROCESSOR_BREAKER_WINDOW_SECONDS", default=60.0)
PROCESSOR_BREAKER_WINDOW_CALLS = env.int("PROCESSOR_BREAKER_WINDOW_CALLS", default=10)
PROCESSOR_BREAKER_TRIAL_CALLS = env.int("PROCESSOR_BREAKER_TRIAL_CALLS", default=3)
PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS = env.float(
    "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS", default=300.0
)
PROCESSOR_BREAKER_PAUSE_SECONDS = env.float("PROCESSOR_BREAKER_PAUSE_SECONDS", default=15.0)
PROCESSOR_BREAKER_MAX_PAUSE_SECONDS = env.float(
    "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS", default=300.0
)

# --- Callbacks: one or more HMAC secrets, comma-separated (the first signs, all verify).
# Stripped ("new, old" is two secrets); an empty list stops start-up naming the setting.
CALLBACK_SIGNING_SECRETS = secrets_parse(env.str("CALLBACK_SIGNING_SECRETS"))
CALLBACK_TOLERANCE_SECONDS = env.int("CALLBACK_TOLERANCE_SECONDS", default=300)
CALLBACK_MAX_BODY_BYTES = 64 * 1024
CALLBACK_SEND_COALESCE_SECONDS = env.float("CALLBACK_SEND_COALESCE_SECONDS", default=0.002)

# --- Retention
PROCESSED_EVENT_RETENTION = timedelta(days=env.int("PROCESSED_EVENT_RETENTION_DAYS", default=30))
API_IDEMPOTENCY_RETENTION = timedelta(hours=env.int("API_IDEMPOTENCY_RETENTION_HOURS", default=24))
QUEUE_MESSAGE_RETENTION = timedelta(days=env.int("QUEUE_MESSAGE_RETENTION_DAYS", default=30))
QUEUE_ERROR_RETENTION = timedelta(days=env.int("QUEUE_ERROR_RETENTION_DAYS", default=90))
OUTBOX_RETENTION = timedelta(days=env.int("OUTBOX_RETENTION_DAYS", default=7))
HOLD_RETENTION = timedelta(days=env.int("HOLD_RETENTION_DAYS", default=90))
BREAKER_TRANSITION_RETENTION = timedelta(
    days=env.int("BREAKER_TRANSITION_RETENTION_DAYS", default=90)
)
ALERT_RETENTION = timedelta(days=env.int("ALERT_RETENTION_DAYS", default=90))
BULK_JOB_RETENTION = timedelta(days=env.int("BULK_JOB_RETENTION_DAYS", default=30))
RETENTION_PURGE_BATCH_SIZE = env.int("RETENTION_PURGE_BATCH_SIZE", default=1000)

# --- Alerts and operations
ALERT_WEBHOOK_URL = env("ALERT_WEBHOOK_URL", default=None)
SETTLEMENT_WINDOW = env("SETTLEMENT_WINDOW", default="Mon-Fri 05:00-08:00 America/Chicago")
# A firing alert is re-sent at most once per interval of its severity (minutes).
ALERT_REMINDER_INTERVALS = {
    "high": timedelta(minutes=env.int("ALERT_REMINDER_HIGH_MINUTES", default=15)),
    "medium": timedelta(minutes=env.int("ALERT_REMINDER_MEDIUM_MINUTES", default=60)),
    "low": timedelta(minutes=env.int("ALERT_REMINDER_LOW_MINUTES", default=240)),
}
ALERT_WEBHOOK_TIMEOUT_SECONDS = env.float("ALERT_WEBHOOK_TIMEOUT_SECONDS", default=5.0)
# Backlog (low severity, silent inside SETTLEMENT_WINDOW): visible messages or the age of the
# oldest unfinished message over these thresholds.
ALERT_BACKLOG_VISIBLE_MESSAGES = env.int("ALERT_BACKLOG_VISIBLE_MESSAGES", default=1000)
ALERT_BACKLOG_OLDEST_AGE = timedelta(
    seconds=env.int("ALERT_BACKLOG_OLDEST_AGE_SECONDS", default=600)
)
# One-off alerts (a rejected submission) resolve by themselves after this long without a repeat.
ALERT_EVENT_QUIET_RESOLVE = timedelta(hours=env.int("ALERT_EVENT_QUIET_RESOLVE_HOURS", default=24))
# Return rates per merchant (payments/return_rates.py): the rolling window, the NACHA
# thresholds in percent, a warning alert at this fraction of a threshold, and the debits a
# merchant needs in the window before its rates are alerted on.
RETURN_RATE_WINDOW_DAYS = env.int("RETURN_RATE_WINDOW_DAYS", default=60)
RETURN_RATE_THRESHOLDS = {
    "unauthorized": env.float("RETURN_RATE_UNAUTHORIZED_PERCENT", default=0.5),
    "administrative": env.float("RETURN_RATE_ADMINISTRATIVE_PERCENT", default=3.0),
    "overall": env.float("RETURN_RATE_OVERALL_PERCENT", default=15.0),
}
RETURN_RATE_WARNING_FRACTION = env.float("RETURN_RATE_WARNING_FRACTION", default=0.8)
RETURN_RATE_MIN_DEBITS = env.int("RETURN_RATE_MIN_DEBITS", default=20)

# --- Reconciliation of stuck payments (ACH settles in days)
RECONCILE_SUBMITTED_AFTER = timedelta(days=env.int("RECONCILE_SUBMITTED_AFTER_DAYS", default=3))
RECONCILE_PENDING_AFTER = timedelta(minutes=env.int("RECONCILE_PENDING_AFTER_MINUTES", default=5))
RECONCILE_RECHECK_AFTER = timedelta(minutes=env.int("RECONCILE_RECHECK_AFTER_MINUTES", default=60))
RECONCILE_BATCH_SIZE = env.int("RECONCILE_BATCH_SIZE", default=100)

# --- Bulk triage ("all matching this filter"): a background job acts at most this many dead
# letters per second, and checks for a cancel between batches of this size.
TRIAGE_BULK_RATE_PER_SECOND = env.float("TRIAGE_BULK_RATE_PER_SECOND", default=20.0)
TRIAGE_BULK_BATCH_SIZE = env.int("TRIAGE_BULK_BATCH_SIZE", default=100)
# A pending or running job without progress for this long is started again by beat.
TRIAGE_BULK_STALE_SECONDS = env.int("TRIAGE_BULK_STALE_SECONDS", default=300)

# --- Celery (its broker is SQS in production; the URL comes from the environment)
CELERY_BROKER_URL = env("CELERY_BROKER_URL", default="memory://")
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_BACKEND = None
# The broker's queue is a standard (non-FIFO) SQS queue; `manage.py setup_celery_queue` creates
# it and prints its URL for CELERY_SQS_QUEUE_URL (if unset, the Celery app looks it up and creates
# the queue when missing). kombu's SQS transport is given that URL (predefined_queues). The broker
# URL is ``sqs://`` for AWS; with a local server it names the server, ``sqs://127.0.0.1:<port>``
# (the host and port of SQS_ENDPOINT_URL, whose scheme decides is_secure). Celery reads the
# CELERY_BROKER_URL environment variable itself, before any setting, so it is used as given.
CELERY_SQS_QUEUE_NAME = env("CELERY_SQS_QUEUE_NAME", default="payments-celery")
CELERY_TASK_DEFAULT_QUEUE = CELERY_SQS_QUEUE_NAME
if CELERY_BROKER_URL.startswith("sqs://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "region": AWS_REGION,
        "is_secure": not (SQS_ENDPOINT_URL or "").startswith("http://"),
        "visibility_timeout": env.int("CELERY_SQS_VISIBILITY_TIMEOUT", default=300),
        "wait_time_seconds": env.int("CELERY_SQS_WAIT_TIME_SECONDS", default=10),
        "polling_interval": 1,
        # Without CELERY_SQS_QUEUE_URL the URL is looked up (and the queue created if missing)
        # when the Celery app is configured: see config/celery.py.
        "predefined_queues": (
            {CELERY_SQS_QUEUE_NAME: {"url": env("CELERY_SQS_QUEUE_URL")}}
            if env("CELERY_SQS_QUEUE_URL", default=None)
            else {}
        ),
    }
# Dead letters reach a human (and page) within this many seconds of reaching the DLQ.
DLQ_INGEST_INTERVAL_SECONDS = env.float("DLQ_INGEST_INTERVAL_SECONDS", default=60.0)
# The module's own schedule (triage/beat.py); a host project merges it into its own.
CELERY_BEAT_SCHEDULE = beat_schedule(dlq_ingest_interval=DLQ_INGEST_INTERVAL_SECONDS)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # One record, one line: values from outside (an operator's note, a queue message's
        # kind) cannot forge a record (payments/logformat.py).
        "plain": {
            "()": "payments.logformat.SingleLineFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
}
