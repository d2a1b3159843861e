"""Settings for benchmark runs: the product's settings plus a bench-only URLconf.

The URLconf adds the minimal baseline view next to the product's URLs; nothing else changes,
so both endpoints run behind the same middleware, under the same gunicorn settings.
"""

import os

# Benchmark-only defaults for the secrets production must set; the environment wins.
os.environ.setdefault("SECRET_KEY", "bench-secret-key-not-for-production")
os.environ.setdefault("PROCESSOR_BASE_URL", "http://127.0.0.1:9")
os.environ.setdefault("PROCESSOR_API_KEY", "bench-processor-key")
os.environ.setdefault("CALLBACK_SIGNING_SECRETS", "bench-signing-secret")
# The webhooks phase's receiver is on loopback, over http (bench/webhooks.py).
os.environ.setdefault("WEBHOOK_ALLOW_HTTP", "true")
os.environ.setdefault("WEBHOOK_ALLOW_PRIVATE_ADDRESSES", "true")

# The money phase refunds debits settled seconds before and pays out to accounts first seen
# that minute, which new_destination would hold for a person; the other rules run (and cost)
# as a host has them.
os.environ.setdefault("FRAUD_RULES", '{"new_destination": {"enabled": false}}')
# Its payouts are paid from debits settled seconds before: available at once, not after the
# return reserve's 2 banking days. Only the available balance's cutoff reads it.
os.environ.setdefault("AVAILABLE_AFTER_BANKING_DAYS", "0")

from config.settings.base import *  # noqa: E402,F403

DEBUG = False
ROOT_URLCONF = "bench.urls"
