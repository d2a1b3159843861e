"""/metrics under a real multi-worker gunicorn in multiprocess mode."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import requests
from django.db import connection
from prometheus_client.mmap_dict import MmapedDict
from prometheus_client.parser import text_string_to_metric_families

from tests.gunicorn_support import free_port, gunicorn_running

pytestmark = pytest.mark.subprocess

ROOT = Path(__file__).resolve().parents[2]


OTHER_PROCESS = """
import sys, time, django
django.setup()
from callbacks.metrics import CALLBACKS_RECEIVED
CALLBACKS_RECEIVED.labels(outcome="bad_signature").inc(5)
print("ready", flush=True)
time.sleep(120)
"""


def counter(text: str, name: str, **labels) -> float:
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return 0.0


def bad_signature_counts(directory: Path) -> dict[int, float]:
    """pid -> payments_callbacks_received_total{outcome="bad_signature"} in its own file."""
    counts = {}
    for path in directory.glob("counter_*.db"):
        pid = int(path.stem.rsplit("_", 1)[-1])
        counts[pid] = 0.0
        values = MmapedDict(str(path), read_mode=True)
        try:
            for key, value, _ in values.read_all_values():
                _, name, labels, _ = json.loads(key)
                if name == "payments_callbacks_received_total" and labels == {
                    "outcome": "bad_signature"
                }:
                    counts[pid] += value
        finally:
            values.close()
    return counts


@pytest.mark.django_db(transaction=True)
def test_every_scrape_sums_the_counters_of_all_gunicorn_workers(local_sqs, tmp_path):
    multiproc_dir = tmp_path / "prom"
    multiproc_dir.mkdir()
    (multiproc_dir / "counter_99999.db").write_bytes(b"stale from an earlier run")
    port = free_port()
    db = connection.settings_dict
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "config.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "SQS_ENDPOINT_URL": local_sqs.endpoint_url,
        "PROMETHEUS_MULTIPROC_DIR": str(multiproc_dir),
        "GUNICORN_BIND": f"127.0.0.1:{port}",
        "GUNICORN_WORKERS": "3",
        "GUNICORN_THREADS": "1",
    }
    # A queue worker process on the same host, started before gunicorn and still running.
    other_process = subprocess.Popen(
        [sys.executable, "-c", OTHER_PROCESS],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert other_process.stdout.readline().strip() == "ready"
    try:
        with gunicorn_running(env, tmp_path / "gunicorn.log", timeout=30) as base:
            _scrapes_sum_every_worker(base, multiproc_dir, other_process.pid)
    finally:
        other_process.kill()
        other_process.wait()


def _scrapes_sum_every_worker(base: str, multiproc_dir: Path, other_pid: int) -> None:
    assert not (multiproc_dir / "counter_99999.db").exists()  # a dead process's file
    assert (multiproc_dir / f"counter_{other_pid}.db").exists()  # a live one's

    # New connections each time, so requests spread over the workers; go on (in rounds of
    # 10, within a bound) until at least two gunicorn workers have counted some, so the
    # sum below is certain to span workers.
    sent = 0
    per_worker: dict[int, float] = {}
    while len(per_worker) < 2:
        assert sent < 300, f"one gunicorn worker served all {sent} requests: {per_worker}"
        for _ in range(10):
            response = requests.post(
                f"{base}/callbacks/processor/",
                data=b"{}",
                headers={"Content-Type": "application/json", "Connection": "close"},
                timeout=5,
            )
            assert response.status_code == 401
        sent += 10
        per_worker = {
            pid: count
            for pid, count in bad_signature_counts(multiproc_dir).items()
            if pid != other_pid and count > 0
        }
    assert bad_signature_counts(multiproc_dir)[other_pid] == 5
    assert sum(per_worker.values()) == sent
    scrapes = [
        requests.get(f"{base}/metrics", headers={"Connection": "close"}, timeout=10).text
        for _ in range(6)
    ]
    values = [
        counter(text, "payments_callbacks_received_total", outcome="bad_signature")
        for text in scrapes
    ]
    # What the gunicorn workers counted plus 5 from the other process, in every scrape.
    assert values == [float(sent + 5)] * 6
    for text in scrapes:
        assert text.count("# TYPE payments_dead_letters_open gauge") == 1
