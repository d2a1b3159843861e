"""Settings shared by every environment, read from the environment with django-environ.

Production secrets have no default: a missing one stops start-up with an error that names it.
A ``.env`` file in the project root is read too, if present.
"""

from pathlib import Path

import environ

from bank import conf as bank_conf
from callbacks import conf as callbacks_conf
from config.settings.environment import app_settings_from_environ
from payments import conf as payments_conf
from triage import conf as triage_conf
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
    "bank",
    "triage",
    # The project's development app (the sandbox processor of the demo, bench and tests); a
    # host installs the four apps above and never this one.
    "sandbox",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    # The processor's callbacks go from here to their view: none of the middleware below does
    # anything for them, and each costs every request (callbacks/middleware.py).
    "callbacks.middleware.ProcessorCallbackMiddleware",
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
if DATABASES["default"]["ENGINE"] == "django.db.backends.postgresql":
    # Parameters bound by the server, and a statement run five times on a connection prepared
    # there (psycopg's prepare_threshold): the server parses and plans it once per connection,
    # not on every run. A payment's life costs PostgreSQL about a third less CPU
    # (docs/performance.md). Behind PgBouncer in transaction mode, it needs PgBouncer 1.21 or
    # later with max_prepared_statements set; DATABASE_SERVER_SIDE_BINDING=false turns it off.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "server_side_binding", env.bool("DATABASE_SERVER_SIDE_BINDING", default=True)
    )
    # Django turns psycopg's preparing off unless OPTIONS names a threshold: without this, every
    # statement was parsed and planned on every run. DATABASE_PREPARE_THRESHOLD=0 (or
    # server-side binding off) prepares nothing.
    _prepare_text = env.str("DATABASE_PREPARE_THRESHOLD", default="5").strip()
    if not (_prepare_text.isascii() and _prepare_text.isdigit()):
        raise ValueError(
            "DATABASE_PREPARE_THRESHOLD must be a whole number: the runs on a connection after "
            f"which a statement is prepared, or 0 to prepare none; not {_prepare_text!r}"
        )
    _prepare_after = int(_prepare_text)
    if DATABASES["default"]["OPTIONS"]["server_side_binding"] and _prepare_after > 0:
        DATABASES["default"]["OPTIONS"].setdefault("prepare_threshold", _prepare_after)
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
    # An account validation's states beside a payment's, both fields named "state": the
    # payment's keep the name they had.
    "ENUM_NAME_OVERRIDES": {
        "StateEnum": "payments.models.PaymentState",
        "AccountValidationStateEnum": "payments.models.ValidationState",
    },
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

# --- The payments module: one dict per app. Each app declares every setting's default, type
# and range (payments/conf.py, callbacks/conf.py, bank/conf.py, triage/conf.py) and
# `manage.py check` refuses an unknown key or a bad value; this project passes an environment
# variable through only when it is set, read with its setting's type
# (config/settings/environment.py). The required ones
# (the processor's URL and key, the callback signing secrets) stop start-up naming the variable.
PAYMENTS = app_settings_from_environ(
    env,
    payments_conf.payments_settings,
    [
        "PROCESSOR_BASE_URL",
        "PROCESSOR_API_KEY",
        "PROCESSOR_TIMEOUT_SECONDS",
        "PROCESSOR_CONNECT_TIMEOUT_SECONDS",
        # The circuit breaker around the processor (payments/processor/breaker.py).
        "PROCESSOR_BREAKER_FAILURES",
        "PROCESSOR_BREAKER_FAILURE_RATE",
        "PROCESSOR_BREAKER_WINDOW_SECONDS",
        "PROCESSOR_BREAKER_WINDOW_CALLS",
        "PROCESSOR_BREAKER_TRIAL_CALLS",
        "PROCESSOR_BREAKER_INCIDENT_COOLDOWN_SECONDS",
        "PROCESSOR_BREAKER_PAUSE_SECONDS",
        "PROCESSOR_BREAKER_MAX_PAUSE_SECONDS",
        "RETENTION_PURGE_BATCH_SIZE",
        # Money out: a settled debit's credit is available to pay out this many banking days on.
        "AVAILABLE_AFTER_BANKING_DAYS",
        "REFUND_HOLD_BANKING_DAYS",
        # The default exposure limits of every merchant (JSON, payments/exposure_limits.py).
        "EXPOSURE_LIMITS",
        "OVER_LIMIT",
        # Fraud monitoring rules (JSON, payments/fraud_rules.py) and the review queue's alert.
        "FRAUD_RULES",
        "REVIEW_HOLD_ALERT_HOURS",
        # The processor backend (the bank path's: bank.nacha.backend.NachaBackend).
        "PROCESSOR_BACKEND",
        # Events and webhooks (payments/webhooks/).
        "EVENT_RETENTION_DAYS",
        "WEBHOOK_TIMEOUT_SECONDS",
        "WEBHOOK_RETRY_SCHEDULE",
        "WEBHOOK_DISABLE_AFTER_FAILURES",
        "WEBHOOK_DISABLE_AFTER_HOURS",
        "WEBHOOK_ALLOW_HTTP",
        "WEBHOOK_ALLOW_PRIVATE_ADDRESSES",
        # The SEC code of a debit whose create names none (payments/originator.py).
        "DEFAULT_SEC_CODE",
        # Account validation before the first WEB debit (payments/services/validation.py).
        "UNVALIDATED_WEB_DEBITS",
        "MICRO_ENTRY_MAX_ATTEMPTS",
        "MICRO_ENTRY_EXPIRY_DAYS",
        "MICRO_ENTRY_COST",
        "ACCOUNT_VALIDATION_SERVICE",
    ],
    ACCOUNT_VALIDATION_REQUIRED={
        "WEB": "ACCOUNT_VALIDATION_REQUIRED_WEB",
        "PPD": "ACCOUNT_VALIDATION_REQUIRED_PPD",
        "CCD": "ACCOUNT_VALIDATION_REQUIRED_CCD",
    },
    PROCESSED_EVENT_RETENTION="PROCESSED_EVENT_RETENTION_DAYS",
    API_IDEMPOTENCY_RETENTION="API_IDEMPOTENCY_RETENTION_HOURS",
    API_IDEMPOTENCY_LEASE="API_IDEMPOTENCY_LEASE_SECONDS",
    OUTBOX_RETENTION="OUTBOX_RETENTION_DAYS",
    BREAKER_TRANSITION_RETENTION="BREAKER_TRANSITION_RETENTION_DAYS",
    WEBHOOK_SECRET_GRACE="WEBHOOK_SECRET_GRACE_HOURS",
)
# The bank path (bank/conf.py): the vault's key-encrypting keys ("v1:<base64>,v2:<base64>") and
# the active one, or the KMS key holder and its keys ("v1:<key ARN>,v2:<key ARN>"); the NACHA
# originator, windows, buffer and transport (JSON for the dicts and the windows).
BANK = app_settings_from_environ(
    env,
    bank_conf.bank_settings,
    [
        "VAULT_KEYS",
        "VAULT_ACTIVE_KEY",
        "VAULT_KEY_PROVIDER",
        "VAULT_KMS_KEYS",
        "VAULT_KMS_REGION",
        "VAULT_KMS_ENDPOINT_URL",
        "VAULT_KMS_TIMEOUT_SECONDS",
        "NACHA_ORIGINATOR",
        "NACHA_WINDOWS",
        "NACHA_BANK_BUFFER_MINUTES",
        "NACHA_TRANSPORT",
        # The books: where the bank's BAI2 statements wait (JSON of NACHA_TRANSPORT's shapes),
        # the hour a banking day must be closed by, and how many banking days a variance may
        # stay unexplained before it alerts.
        "BOOKS_STATEMENT_TRANSPORT",
        "BOOKS_CLOSE_BY_HOUR_EASTERN",
        "BOOKS_VARIANCE_ALERT_BANKING_DAYS",
    ],
)
CALLBACKS = app_settings_from_environ(
    env,
    callbacks_conf.callbacks_settings,
    [
        "AWS_REGION",
        "SQS_ENDPOINT_URL",
        "SQS_QUEUE_NAME",
        "SQS_DLQ_NAME",
        "WORKER_BACKOFF_BASE_SECONDS",
        "WORKER_BACKOFF_CAP_SECONDS",
        "WORKER_MAX_ATTEMPTS",
        "WORKER_VISIBILITY_HEARTBEAT",
        "WORKER_RECEIVE_LINGER_SECONDS",
        "OUTAGE_RELEASE_PER_SECOND",
        # One or more HMAC secrets, comma-separated (the first signs, all verify).
        "CALLBACK_SIGNING_SECRETS",
        "CALLBACK_TOLERANCE_SECONDS",
        "CALLBACK_SEND_COALESCE_SECONDS",
        "OUTBOX_PUBLISH_LINGER_SECONDS",
        "RECONCILE_BATCH_SIZE",
        "PROCESSOR_EVENTS_PULL_PAGE_SIZE",
        "PROCESSOR_EVENTS_PULL_MAX_PAGES",
        "CELERY_SQS_QUEUE_NAME",
    ],
    QUEUE_MESSAGE_RETENTION="QUEUE_MESSAGE_RETENTION_DAYS",
    QUEUE_ERROR_RETENTION="QUEUE_ERROR_RETENTION_DAYS",
    HOLD_RETENTION="HOLD_RETENTION_DAYS",
    RECONCILE_SUBMITTED_AFTER="RECONCILE_SUBMITTED_AFTER_DAYS",
    RECONCILE_PENDING_AFTER="RECONCILE_PENDING_AFTER_MINUTES",
    RECONCILE_RECHECK_AFTER="RECONCILE_RECHECK_AFTER_MINUTES",
)
TRIAGE = app_settings_from_environ(
    env,
    triage_conf.triage_settings,
    [
        "ALERT_WEBHOOK_URL",
        "ALERT_WEBHOOK_TIMEOUT_SECONDS",
        "SETTLEMENT_WINDOW",
        "ALERT_BACKLOG_VISIBLE_MESSAGES",
        "DLQ_INGEST_INTERVAL_SECONDS",
        "TRIAGE_BULK_RATE_PER_SECOND",
        "TRIAGE_BULK_BATCH_SIZE",
        "TRIAGE_BULK_STALE_SECONDS",
        "RETURN_RATE_WINDOW_DAYS",
        "RETURN_RATE_WARNING_FRACTION",
        "RETURN_RATE_MIN_DEBITS",
    ],
    ALERT_BACKLOG_OLDEST_AGE="ALERT_BACKLOG_OLDEST_AGE_SECONDS",
    ALERT_EVENT_QUIET_RESOLVE="ALERT_EVENT_QUIET_RESOLVE_HOURS",
    ALERT_RETENTION="ALERT_RETENTION_DAYS",
    BULK_JOB_RETENTION="BULK_JOB_RETENTION_DAYS",
    ALERT_REMINDER_INTERVALS={
        "high": "ALERT_REMINDER_HIGH_MINUTES",
        "medium": "ALERT_REMINDER_MEDIUM_MINUTES",
        "low": "ALERT_REMINDER_LOW_MINUTES",
    },
    RETURN_RATE_THRESHOLDS={
        "unauthorized": "RETURN_RATE_UNAUTHORIZED_PERCENT",
        "administrative": "RETURN_RATE_ADMINISTRATIVE_PERCENT",
        "overall": "RETURN_RATE_OVERALL_PERCENT",
    },
)


def _callbacks(name: str):
    """A queue setting Celery's own settings below are built from: this project's, else the
    app's default."""
    return CALLBACKS.get(name, callbacks_conf.DEFAULTS[name])


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
CELERY_TASK_DEFAULT_QUEUE = _callbacks("CELERY_SQS_QUEUE_NAME")
if CELERY_BROKER_URL.startswith("sqs://"):
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "region": _callbacks("AWS_REGION"),
        "is_secure": not (_callbacks("SQS_ENDPOINT_URL") or "").startswith("http://"),
        "visibility_timeout": env.int("CELERY_SQS_VISIBILITY_TIMEOUT", default=300),
        "wait_time_seconds": env.int("CELERY_SQS_WAIT_TIME_SECONDS", default=10),
        # kombu's pause after an empty receive, and while the worker has no room for another
        # message (prefetch 1, acks late: after each task). A long-polling receive already waits
        # on the server, so a short pause costs no requests, and at 1 s (kombu's default) a
        # worker would take one task a second: webhook deliveries would queue behind it.
        "polling_interval": env.float("CELERY_SQS_POLLING_INTERVAL", default=0.05),
        # Without CELERY_SQS_QUEUE_URL the URL is looked up (and the queue created if missing)
        # when the Celery app is configured: see config/celery.py.
        "predefined_queues": (
            {CELERY_TASK_DEFAULT_QUEUE: {"url": env("CELERY_SQS_QUEUE_URL")}}
            if env("CELERY_SQS_QUEUE_URL", default=None)
            else {}
        ),
    }
# The module's own schedule (triage/beat.py); a host project merges it into its own.
CELERY_BEAT_SCHEDULE = beat_schedule(
    dlq_ingest_interval=TRIAGE.get(
        "DLQ_INGEST_INTERVAL_SECONDS", triage_conf.DEFAULTS["DLQ_INGEST_INTERVAL_SECONDS"]
    )
)

# plain: one human-readable line per record, for development. json: one JSON object per line
# with every structured field (payment_id, message_id, outcome, request_id, ...), for a log
# pipeline; production's default (config/settings/production.py).
LOG_FORMAT = env.str("LOG_FORMAT", default="plain")
if LOG_FORMAT not in ("plain", "json"):
    raise ValueError(f"LOG_FORMAT must be plain or json, not {LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        # One record, one line: values from outside (an operator's note, a queue message's
        # kind) cannot forge a record (payments/kernel/logformat.py).
        "plain": {
            "()": "payments.kernel.logformat.SingleLineFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "payments.kernel.logformat.JsonLineFormatter"},
    },
    # The fields bound to the work in hand (a worker's message: its request id, its trace) go
    # onto every record, whichever logger wrote it (payments/kernel/logcontext.py).
    "filters": {
        "log_context": {"()": "payments.kernel.logcontext.LogContextFilter"},
        "bank_numbers_in_urls": {"()": "payments.kernel.logformat.BankNumbersInUrlsFilter"},
    },
    "handlers": {
        "console": {
            "class": "logging.StreamHandler",
            "formatter": LOG_FORMAT,
            "filters": ["log_context"],
        }
    },
    # Lines that quote a request's path and query (runserver's access line, the 4xx and 5xx
    # warnings) with any bank number in them masked to its last 4 digits; gunicorn's access
    # log is filtered by config/gunicorn.py.
    "loggers": {
        "django.server": {
            "handlers": ["console"],
            "level": "INFO",
            "propagate": False,
            "filters": ["bank_numbers_in_urls"],
        },
        "django.request": {"filters": ["bank_numbers_in_urls"]},
    },
    "root": {"handlers": ["console"], "level": env("LOG_LEVEL", default="INFO")},
}
