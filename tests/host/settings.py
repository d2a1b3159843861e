"""Someone else's monolith adopting the module: its own project package, user model, Celery
app, DRF defaults and URL layout. Nothing here comes from this repository's ``config``.

What the module needs from a host is what docs/how-to/install.md lists: the
apps, the URLs, the required settings (processor, signing secrets, queues), Celery wiring.
"""

import os

import environ

SECRET_KEY = "host-project-secret-key-for-tests"
DEBUG = False
ALLOWED_HOSTS = ["testserver", "localhost", "127.0.0.1"]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "rest_framework.authtoken",
    # The host's own apps.
    "tests.host.accounts",
    "tests.host.shop",
    # The payments module.
    "payments",
    "callbacks",
    "bank",
    "triage",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "tests.host.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

DATABASES = {
    "default": environ.Env.db_url_config(
        os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/payments")
    )
}
# A test database of the host's own: make test runs this suite beside the main one, whose
# in-process run (PYTEST_WORKERS=0) would otherwise create and drop the same test_<name>.
DATABASES["default"]["TEST"] = {"NAME": f"test_{DATABASES['default']['NAME']}_host"}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "host_accounts.User"
PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]

USE_TZ = True
TIME_ZONE = "Europe/Berlin"
STATIC_URL = "/assets/"

# The host's API conventions, which must change nothing in the module's views: every policy
# DRF reads from here is set to something the module does not use.
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["tests.host.auth.ShopKeyAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAdminUser"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.FormParser"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.BrowsableAPIRenderer"],
    "EXCEPTION_HANDLER": "tests.host.errors.shop_exception_handler",
    "DEFAULT_VERSIONING_CLASS": "rest_framework.versioning.URLPathVersioning",
    "ALLOWED_VERSIONS": ["v1"],
    "DEFAULT_PAGINATION_CLASS": "tests.host.pagination.ShopPagination",
    "PAGE_SIZE": 2,
    "DEFAULT_THROTTLE_CLASSES": ["rest_framework.throttling.UserRateThrottle"],
    "DEFAULT_THROTTLE_RATES": {"user": "1/day", "anon": "1/day"},
    "DEFAULT_METADATA_CLASS": None,
    "DEFAULT_SCHEMA_CLASS": "rest_framework.schemas.openapi.AutoSchema",
}

# --- The payments module: one dict per app, only what has no default inside it (and backoff
# off, for a fast test); `manage.py check` refuses a key an app does not know.
PAYMENTS = {
    "PROCESSOR_BASE_URL": "http://127.0.0.1:9",  # the sandbox's address, set by the tests
    "PROCESSOR_API_KEY": "host-processor-key",
}
CALLBACKS = {
    "CALLBACK_SIGNING_SECRETS": ["host-secret-new", "host-secret-old"],
    "SQS_ENDPOINT_URL": "http://127.0.0.1:9",  # the local SQS server, set by the tests
    "SQS_QUEUE_NAME": "shop-ach.fifo",
    "SQS_DLQ_NAME": "shop-ach-dlq.fifo",
    "WORKER_BACKOFF_BASE_SECONDS": 0,
    "WORKER_BACKOFF_CAP_SECONDS": 0,
}
# The host merges the module's beat schedule into its own: see tests/host/celery.py.

CELERY_BROKER_URL = "memory://"

# The host's logging with every formatter and filter the module documents for LOGGING
# (docs/operations/monitoring.md): configured when Django starts, so the wheel's test (a fresh
# virtualenv with the declared dependencies only) fails when one of them cannot be imported.
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "filters": {
        "bank_numbers_in_urls": {"()": "payments.kernel.logformat.BankNumbersInUrlsFilter"},
    },
    "formatters": {
        "plain": {
            "()": "payments.kernel.logformat.SingleLineFormatter",
            "format": "%(asctime)s %(levelname)s %(name)s %(message)s",
        },
        "json": {"()": "payments.kernel.logformat.JsonLineFormatter"},
    },
    "handlers": {
        "json": {"class": "logging.StreamHandler", "formatter": "json", "level": "WARNING"},
        "plain": {
            "class": "logging.StreamHandler",
            "formatter": "plain",
            "filters": ["bank_numbers_in_urls"],
            "level": "WARNING",
        },
    },
    "loggers": {
        "django.request": {"handlers": ["plain"], "level": "WARNING", "propagate": False},
    },
    "root": {"handlers": ["json"], "level": "WARNING"},
}
