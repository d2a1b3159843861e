"""Production: secure cookies, HSTS and the SSL redirect, unless the environment says no."""

import os

for name, value in {
    "SESSION_COOKIE_SECURE": "true",
    "CSRF_COOKIE_SECURE": "true",
    "SECURE_SSL_REDIRECT": "true",
    "SECURE_HSTS_SECONDS": "31536000",
    "LOG_FORMAT": "json",
}.items():
    os.environ.setdefault(name, value)

from config.settings.base import *  # noqa: E402,F403
from config.settings.base import env  # noqa: E402

DEBUG = False
# The sandbox processor is a test double: production has the real processor, so not its command.
INSTALLED_APPS = [app for app in INSTALLED_APPS if app != "sandbox"]  # noqa: F405
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", default=True)
SECURE_HSTS_PRELOAD = env.bool("SECURE_HSTS_PRELOAD", default=True)
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
