"""Fixtures and helpers of the webhook tests: a verifying receiver on loopback, and settings
that let a test send to it (production refuses http and loopback addresses)."""

import pytest

from payments.services import payment_apply_event
from payments.webhooks.services import webhook_endpoint_create
from sandbox.webhook_receiver import WebhookReceiver
from tests.factories import PaymentFactory, processor_event


@pytest.fixture
def loopback_webhooks(module_settings):
    module_settings.WEBHOOK_ALLOW_HTTP = True
    module_settings.WEBHOOK_ALLOW_PRIVATE_ADDRESSES = True
    module_settings.WEBHOOK_TIMEOUT_SECONDS = 2
    return module_settings


@pytest.fixture
def receiver(loopback_webhooks):
    server = WebhookReceiver().start()
    yield server
    server.stop()


def endpoint_for(receiver: WebhookReceiver, merchant_id: str = "m-hooks", **fields):
    endpoint = webhook_endpoint_create(
        merchant_id=merchant_id, url=fields.pop("url", receiver.url), event_types=[], **fields
    )
    receiver.secrets.append(endpoint.secret)
    return endpoint


def settle(merchant_id: str = "m-hooks"):
    """A debit submitted then settled: two transitions, two events."""
    payment = PaymentFactory(state="pending", merchant_id=merchant_id, processor_id="")
    payment_apply_event(event=processor_event(payment, "submitted"))
    payment_apply_event(event=processor_event(payment, "settled"))
    return payment
