"""The ``webhooks`` phase: deliveries per second and CPU per delivery of the webhook sender.

``BENCH_WEBHOOK_EVENTS`` (2,000) events of one merchant, each carrying a payment as a
transition writes it, numbered and fanned out to one endpoint; a verifying receiver in this
process (``sandbox.webhook_receiver``). Then ``BENCH_WEBHOOK_SENDERS`` (2) ``manage.py
webhooks_deliver --until-empty`` processes send them, each claiming its own deliveries.
Measured from their start until the last one exits: deliveries per second, and the CPU seconds
the senders used (user + system, waited for) per delivery, beside the pipeline's CPU per event
when the ``e2e`` phase ran.
"""

import time

from bench.cpu import children_cpu
from bench.options import CONFIG, log, problems
from bench.stack import RESULTS, BenchError, Stack, spawn
from devstack.processes import PY, ROOT

MERCHANT = "bench-webhooks"


def webhooks_phase(stack: Stack) -> dict:
    from payments.models import Payment
    from payments.webhooks.delivery import events_dispatch
    from payments.webhooks.events import payment_event_new
    from payments.webhooks.models import DeliveryStatus, Event, WebhookDelivery
    from payments.webhooks.services import webhook_endpoint_create
    from sandbox.webhook_receiver import WebhookReceiver

    events, senders = CONFIG["webhook_events"], CONFIG["webhook_senders"]
    receiver = WebhookReceiver().start()
    try:
        endpoint = webhook_endpoint_create(merchant_id=MERCHANT, url=receiver.url, event_types=[])
        receiver.secrets.append(endpoint.secret)
        payment = Payment(merchant_id=MERCHANT, amount="25.00", source_token="tok_bench_hooks")
        Event.objects.bulk_create(
            payment_event_new(payment=payment, state="submitted") for _ in range(events)
        )
        events_dispatch(limit=events)
        env = stack.env()
        command = [PY, str(ROOT / "manage.py"), "webhooks_deliver", "--until-empty"]
        cpu, started = children_cpu(), time.monotonic()
        processes = [
            spawn(command, env, RESULTS / f"webhooks-sender{n}.log") for n in range(senders)
        ]
        for process in processes:
            if process.wait(timeout=600) != 0:
                raise BenchError(f"a webhook sender exited {process.returncode}")
        seconds, cpu = time.monotonic() - started, children_cpu() - cpu
        delivered = WebhookDelivery.objects.filter(
            endpoint=endpoint, status=DeliveryStatus.SUCCEEDED
        ).count()
    finally:
        receiver.stop()
    if delivered != events or receiver.refused or len(receiver.verified) != events:
        problems.append(
            f"webhooks: {delivered} of {events} delivered, {len(receiver.verified)} verified, "
            f"{receiver.refused} refused"
        )
    result = {
        "events": events,
        "senders": senders,
        "seconds": round(seconds, 2),
        "deliveries_per_second": round(delivered / seconds, 1) if seconds else None,
        "cpu_ms_per_delivery": round(1000 * cpu / delivered, 2) if delivered else None,
        "repeats": receiver.repeats,
    }
    log(f"webhooks: {result}")
    return result
