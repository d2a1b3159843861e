"""The ``peer`` phase: the Celery peer (``bench.peer``) measured as the whole pipeline is, in the
same run: the latency from the 202 to the event applied at a steady ``BENCH_E2E_RATE``, then
rising steps until its backlog grows, with each part's CPU per event.

gunicorn serves the peer's callback view with the product's configuration; ``celery -A
bench.peer worker`` runs its default prefork pool with concurrency 2 on a standard SQS queue
of the local server (kombu's SQS transport, the queue given in ``predefined_queues``, as
``config/settings/base.py`` gives the product's own Celery queue).
"""

import subprocess
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit

from bench.cpu import CpuMeter
from bench.options import CONFIG, log, problems
from bench.peer import READY_LINE
from bench.pipeline import WARM_UP, steady_run, step_runs, warm_up
from bench.prepare import payments_reset
from bench.stack import RESULTS, BenchError, Gunicorn, Stack
from devstack.processes import PY, ROOT, stop_process

CONCURRENCY = 2


def peer_queue_create() -> tuple[str, str]:
    """A fresh standard queue for the peer's tasks, with the attributes the product gives its
    own Celery queue. Returns its name and URL."""
    from callbacks import sqs
    from callbacks.queues import broker_queue_attributes

    name = f"bench-peer-{uuid.uuid4().hex[:8]}"
    return name, sqs.queue_create(
        name=name, attributes=broker_queue_attributes(visibility_timeout=300)
    )


def peer_env(stack: Stack, name: str, url: str) -> dict[str, str]:
    """The environment of the peer's web and worker processes: Celery's broker is the local
    SQS server, its default queue the peer's."""
    endpoint = urlsplit(stack.sqs_endpoint)
    return stack.env(
        CELERY_BROKER_URL=f"sqs://{endpoint.hostname}:{endpoint.port}",
        CELERY_SQS_QUEUE_NAME=name,
        CELERY_SQS_QUEUE_URL=url,
    )


def celery_worker_command() -> list[str]:
    return [
        str(Path(PY).with_name("celery")),
        "-A",
        "bench.peer",
        "worker",
        "--concurrency",
        str(CONCURRENCY),
        "--loglevel",
        "WARNING",
    ]


def celery_worker_start(env: dict[str, str], log_path: Path) -> subprocess.Popen:
    """The Celery worker, once it says it is ready (its pool started, the queue found)."""
    with log_path.open("w") as out:
        worker = subprocess.Popen(
            celery_worker_command(),
            env=env,
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if worker.poll() is not None:
            raise BenchError(f"the Celery worker exited at start; see {log_path}")
        if READY_LINE in log_path.read_text(errors="replace"):
            return worker
        time.sleep(0.3)
    stop_process(worker, group=True)
    raise BenchError(f"the Celery worker was not ready within 60 s; see {log_path}")


def peer_phase(stack: Stack) -> dict:
    rate, seconds = CONFIG["e2e_rate"], CONFIG["e2e_seconds"]
    step_rates, step_seconds = CONFIG["peer_step_rates"], CONFIG["step_seconds"]
    total = WARM_UP + rate * seconds + sum(r * step_seconds for r in step_rates)
    ids = payments_reset(stack.database_url, total)
    name, url = peer_queue_create()
    env = peer_env(stack, name, url)
    from bench.urls import PEER_PATH

    server = Gunicorn(
        stack,
        queue=("", ""),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
        env=env,
    ).start()
    worker = None
    out: dict = {
        "gunicorn": " ".join(server.command[1:]),
        "worker_command": " ".join(["celery", *celery_worker_command()[1:]]),
        "queue": "standard",
    }
    try:
        worker = celery_worker_start(env, RESULTS / "peer-celery.log")
        meter = CpuMeter(stack, server, [worker], with_children=True)
        run = uuid.uuid4().hex[:8]
        warm_up(stack, server, ids[:WARM_UP], f"p{run}", PEER_PATH)
        ids = ids[WARM_UP:]
        steady_ids, step_ids = ids[: rate * seconds], ids[rate * seconds :]
        out["steady"] = steady_run(stack, server, meter, url, steady_ids, f"p{run}", PEER_PATH)
        steps = step_runs(
            stack, server, meter, url, step_ids, f"p{run}", PEER_PATH, rates=step_rates
        )
        out["steps"] = steps
        passed = [s["offered_rate"] for s in steps if s["sustained"]]
        out["sustained_events_per_second"] = max(passed, default=0)
        out["limit_reached"] = bool(steps) and not steps[-1]["sustained"]
    finally:
        server.stop()
        stop_process(worker, group=True)
    if worker is not None and worker.returncode not in (0, -15, -9):
        problems.append(f"peer: Celery worker exit status {worker.returncode}; see peer-celery.log")
    summary = peer_summary(out)
    out.update(summary)
    log(
        f"peer: sustained {summary['celery_sustained_events_per_second']}/s, "
        f"{summary['celery_cpu_ms_per_event']} ms CPU per event, P99 202->applied "
        f"{summary['celery_accepted_to_applied_p99_ms']} ms at {rate}/s"
    )
    return out


def pipeline_cpu_ms(step: dict | None) -> float | None:
    """CPU per event of every part but the load generator (which the minimal baselines do not
    count either)."""
    if not step or not step.get("cpu_ms_per_event"):
        return None
    parts = step["cpu_ms_per_event"]
    return round(sum(v for k, v in parts.items() if k != "generator"), 3)


def best_step(out: dict) -> dict | None:
    """The highest sustained step, else the steady run: where a pipeline's CPU per event is
    quoted (the batches are fullest there)."""
    sustained = [s for s in out.get("steps", []) if s["sustained"]]
    return max(sustained, key=lambda s: s["offered_rate"]) if sustained else out.get("steady")


def peer_summary(out: dict) -> dict:
    steady = out.get("steady") or {}
    return {
        "celery_sustained_events_per_second": out.get("sustained_events_per_second"),
        "celery_cpu_ms_per_event": pipeline_cpu_ms(best_step(out)),
        "celery_cpu_ms_per_event_at_steady_rate": pipeline_cpu_ms(steady),
        "celery_accepted_to_applied_p99_ms": steady.get("accepted_to_applied_p99_ms"),
        "celery_accepted_to_applied_p50_ms": steady.get("accepted_to_applied_p50_ms"),
    }
