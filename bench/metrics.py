"""The product's batch-size histograms, read from ``/metrics`` around a measured run: callbacks per
``SendMessageBatch`` call and messages per worker receive."""

import urllib.request

from bench.stack import Gunicorn

SEND_BATCH = "payments_callback_send_batch_entries"


WORKER_BATCH = "payments_worker_batch_messages"


def histograms(server: Gunicorn) -> dict[str, tuple[float, float]]:
    """(sum, count) of the batch-size histograms, summed over every process that shares the
    metrics directory (gunicorn's workers and the queue workers); empty without one."""
    try:
        with urllib.request.urlopen(server.url + "/metrics", timeout=5) as response:
            text = response.read().decode()
    except OSError:
        return {}
    totals: dict[str, list[float]] = {}
    for line in text.splitlines():
        for name in (SEND_BATCH, WORKER_BATCH):
            for i, suffix in enumerate(("_sum", "_count")):
                if line.startswith(name + suffix + " "):
                    totals.setdefault(name, [0.0, 0.0])[i] += float(line.split()[-1])
    return {name: (total[0], total[1]) for name, total in totals.items()}


def batch_means(before: dict, after: dict) -> dict[str, float | None]:
    """Mean messages per call between two ``histograms`` readings."""
    out = {}
    for name, key in ((SEND_BATCH, "callbacks_per_send_call"), (WORKER_BATCH, "worker_batch")):
        total, calls = (after.get(name, (0, 0))[i] - before.get(name, (0, 0))[i] for i in (0, 1))
        out[key] = round(total / calls, 2) if calls else None
    return out
