"""The ``e2e`` phase, the whole pipeline: open-loop signed callbacks through gunicorn to the
workers, the latency from the 202 to the event applied at a steady rate, then rising steps
until the backlog grows, with each part's CPU per event."""

import signal
import subprocess
import threading
import time
import uuid

import psycopg

from bench import events, loadgen, stats
from bench.cpu import CpuMeter, cpu_summary
from bench.metrics import batch_means, histograms
from bench.options import CALLBACK_PATH, CONFIG, SECRETS, log, problems
from bench.prepare import payments_reset, queue_depth, queues_create
from bench.report import fmt
from bench.stack import RESULTS, BenchError, Gunicorn, Stack, spawn
from devstack.processes import worker_command


class BacklogSampler:
    """Samples the queue's visible + in-flight messages every ``interval`` seconds."""

    def __init__(self, url: str, interval: float = 0.5) -> None:
        self.url, self.interval = url, interval
        self.points: list[tuple[float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                visible, in_flight = queue_depth(self.url)
                self.points.append((time.time(), float(visible + in_flight)))
            except Exception as exc:  # noqa: BLE001 - a missed sample is only a gap
                log(f"backlog sample failed: {exc}")
            self._stop.wait(self.interval)

    def __enter__(self) -> "BacklogSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def _offer(
    server: Gunicorn,
    payment_ids: list[str],
    run: str,
    rate: int,
    seconds: int,
    path: str = CALLBACK_PATH,
):
    """Open-loop callbacks at ``rate``/s to ``path``, one ``settled`` event per payment, signed
    as sent."""
    port = server.port

    def make(n: int) -> tuple[str, bytes]:
        callback = events.settled_callback(payment_ids[n], events.event_id(run, n))
        headers = {
            "Content-Type": "application/json",
            "X-Processor-Signature": callback.signature(SECRETS),
        }
        request = loadgen.build_request("127.0.0.1", port, path, callback.body, headers)
        return callback.processor_event_id, request

    return loadgen.open_loop(
        "127.0.0.1",
        port,
        make,
        rate=rate,
        seconds=seconds,
        connections=CONFIG["e2e_connections"],
    )


# Callbacks sent before the measured runs, at a low rate: every web thread's and worker's first
# use of its connections and clients (a boto3 client, a kombu channel) is not measured.
WARM_UP_RATE, WARM_UP_SECONDS = 50, 2
WARM_UP = WARM_UP_RATE * WARM_UP_SECONDS


def warm_up(stack: Stack, server: Gunicorn, ids: list[str], run: str, path: str = CALLBACK_PATH):
    """Send the warm-up callbacks and wait until they are applied."""
    result = _offer(server, ids, f"{run}w", WARM_UP_RATE, WARM_UP_SECONDS, path)
    _wait_applied(stack.database_url, [s.key for s in result.samples if s.status == 202])


def _applied_times(db_url: str, event_ids: list[str]) -> dict[str, float]:
    with psycopg.connect(db_url) as conn:
        rows = conn.execute(
            "SELECT processor_event_id, extract(epoch FROM processed_at) "
            "FROM payments_processedevent WHERE processor_event_id = ANY(%s)",
            (event_ids,),
        ).fetchall()
    return {event_id: float(at) for event_id, at in rows}


def _wait_applied(
    db_url: str, event_ids: list[str], *, stall: float = 20, timeout: float | None = None
) -> dict[str, float]:
    """Wait until every event is applied, or nothing more was applied for ``stall`` seconds
    (a worker that stopped making progress is a problem and must not hang the run), or
    ``timeout`` seconds passed (a backlog left by an overloaded step drains slowly; its
    unapplied events are left out of the latencies, which the report says)."""
    started = last_progress = time.time()
    last_count = -1
    while True:
        applied = _applied_times(db_url, event_ids)
        if len(applied) >= len(event_ids):
            return applied
        if timeout is not None and time.time() - started > timeout:
            return applied
        if len(applied) != last_count:
            last_count, last_progress = len(applied), time.time()
        elif time.time() - last_progress > stall:
            problems.append(
                f"end to end: {len(event_ids) - len(applied)} accepted callbacks were not "
                f"applied (no progress for {stall:.0f} s)"
            )
            return applied
        time.sleep(0.5)


def _applied_rate(result: loadgen.LoadResult, applied: dict[str, float]) -> float | None:
    times = [applied[s.key] for s in result.samples if s.key in applied]
    return stats.rate(len(times), min(times, default=None), max(times, default=None))


def _latency_summary(result: loadgen.LoadResult, applied: dict[str, float]) -> dict:
    accepted = [s for s in result.samples if s.status == 202]
    to_applied = [(applied[s.key] - s.answered) * 1000 for s in accepted if s.key in applied]
    sent_to_applied = [(applied[s.key] - s.intended) * 1000 for s in accepted if s.key in applied]
    http = [(s.answered - s.intended) * 1000 for s in result.samples]
    return {
        "accepted": len(accepted),
        "applied": sum(1 for s in accepted if s.key in applied),
        "accepted_to_applied_p50_ms": stats.percentile(to_applied, 50),
        "accepted_to_applied_p99_ms": stats.percentile(to_applied, 99),
        "sent_to_applied_p50_ms": stats.percentile(sent_to_applied, 50),
        "sent_to_applied_p99_ms": stats.percentile(sent_to_applied, 99),
        "http_p50_ms": stats.percentile(http, 50),
        "http_p99_ms": stats.percentile(http, 99),
    }


def e2e_phase(stack: Stack) -> dict:
    rate, seconds = CONFIG["e2e_rate"], CONFIG["e2e_seconds"]
    step_rates, step_seconds = CONFIG["step_rates"], CONFIG["step_seconds"]
    total = WARM_UP + rate * seconds + sum(r * step_seconds for r in step_rates)
    ids = payments_reset(stack.database_url, total)
    name, dlq, url = queues_create("e2e")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    env = stack.env(name, dlq)
    cmd = worker_command(until_empty=False, wait_time=20, relay=CONFIG["e2e_relay"])
    workers = [
        spawn(cmd, env, RESULTS / f"e2e-worker-{i}.log") for i in range(CONFIG["e2e_workers"])
    ]
    out: dict = {
        "gunicorn": " ".join(server.command[1:]),
        "workers": CONFIG["e2e_workers"],
        "worker_command": " ".join(["manage.py", *cmd[2:]]),
        "connections": CONFIG["e2e_connections"],
    }
    try:
        time.sleep(2)  # let the workers start their first long poll
        if any(w.poll() is not None for w in workers):
            raise BenchError(f"a worker exited at start; see {RESULTS}/e2e-worker-*.log")
        run = uuid.uuid4().hex[:8]
        meter = CpuMeter(stack, server, workers)
        warm_up(stack, server, ids[:WARM_UP], run)
        ids = ids[WARM_UP:]
        steady_ids, step_ids = ids[: rate * seconds], ids[rate * seconds :]
        out["steady"] = steady_run(stack, server, meter, url, steady_ids, run)
        steps = step_runs(stack, server, meter, url, step_ids, run)
        out["steps"] = steps
        passed = [s["offered_rate"] for s in steps if s["sustained"]]
        out["sustained_events_per_second"] = max(passed, default=0)
        out["limit_reached"] = bool(steps) and not steps[-1]["sustained"]
    finally:
        _stop(server, workers)
    crashed = [w.returncode for w in workers if w.returncode not in (0, -15)]
    if crashed:
        problems.append(f"end to end: worker exit statuses {crashed}; see e2e-worker-*.log")
    return out


def steady_run(
    stack: Stack,
    server: Gunicorn,
    meter: CpuMeter,
    url: str,
    ids: list[str],
    run: str,
    path: str = CALLBACK_PATH,
) -> dict:
    """The steady run: ``e2e_rate`` callbacks/s for ``e2e_seconds`` to ``path``."""
    rate, seconds = CONFIG["e2e_rate"], CONFIG["e2e_seconds"]
    log(f"end to end: {rate} callbacks/s for {seconds} s")
    batches = histograms(server)  # read outside the measured CPU
    cpu_before = meter.snapshot()
    with BacklogSampler(url) as sampler:
        steady = _offer(server, ids, f"{run}s", rate, seconds, path)
    steady_cpu = cpu_summary(
        CpuMeter.used(cpu_before, meter.snapshot()), steady.count(202), steady.duration
    )
    steady_cpu["batches"] = batch_means(batches, histograms(server))
    applied = _wait_applied(stack.database_url, [s.key for s in steady.samples if s.status == 202])
    out = {
        "offered_rate": rate,
        "seconds": seconds,
        "backlog_max": max((y for _, y in sampler.points), default=None),
        **_latency_summary(steady, applied),
        **steady_cpu,
        "accepted_per_second": steady.count(202) / steady.duration,
        "applied_per_second": _applied_rate(steady, applied),
    }
    log(
        f"end to end at {rate}/s: accepted->applied P50 "
        f"{fmt(out['accepted_to_applied_p50_ms'])} ms, P99 "
        f"{fmt(out['accepted_to_applied_p99_ms'])} ms"
    )
    return out


def step_runs(
    stack: Stack,
    server: Gunicorn,
    meter: CpuMeter,
    url: str,
    ids: list[str],
    run: str,
    path: str = CALLBACK_PATH,
    rates: list[int] | None = None,
) -> list[dict]:
    """The offered-rate steps (``rates``, default ``BENCH_STEPS``) to ``path``, up to the first
    one not sustained; their latencies once what they left queued has drained (bounded)."""
    step_seconds = CONFIG["step_seconds"]
    steps, offset = [], 0
    for step_rate in rates or CONFIG["step_rates"]:
        step_ids = ids[offset : offset + step_rate * step_seconds]
        offset += len(step_ids)
        batches = histograms(server)  # read outside the measured CPU
        cpu_before = meter.snapshot()
        with BacklogSampler(url) as sampler:
            result = _offer(server, step_ids, f"{run}r{step_rate}", step_rate, step_seconds, path)
        step = _step_verdict(step_rate, step_seconds, result, sampler.points)
        step.update(
            cpu_summary(
                CpuMeter.used(cpu_before, meter.snapshot()), result.count(202), result.duration
            )
        )
        step["batches"] = batch_means(batches, histograms(server))
        step["_result"] = result
        steps.append(step)
        log(
            f"step {step_rate}/s: accepted {step['accepted_per_second']:.0f}/s, backlog "
            f"{step['backlog_start']:.0f} -> {step['backlog_end']:.0f} "
            f"(trend {step['backlog_trend_per_second']:+.1f}/s), "
            f"{step['cores_busy']:.2f} cores busy, "
            f"batches {step['batches']['callbacks_per_send_call']} per send, "
            f"{step['batches']['worker_batch']} per receive: "
            f"{'sustained' if step['sustained'] else 'NOT sustained'}"
        )
        if not step["sustained"]:
            break
    all_keys = [s.key for st in steps for s in st["_result"].samples if s.status == 202]
    # An overloaded last step leaves a backlog: give it a bounded time to drain.
    applied = _wait_applied(stack.database_url, all_keys, timeout=90)
    for step in steps:
        result = step.pop("_result")
        step.update(_latency_summary(result, applied))
        step["applied_per_second"] = _applied_rate(result, applied)
    return steps


def _stop(server: Gunicorn, workers: list[subprocess.Popen]) -> None:
    # A worker finishes its long poll (up to 20 s) before it stops: signal all at once.
    for w in workers:
        if w.poll() is None:
            w.send_signal(signal.SIGTERM)
    server.stop()
    for w in workers:
        try:
            w.wait(30)
        except subprocess.TimeoutExpired:
            w.kill()
            w.wait()


def _step_verdict(rate: int, seconds: int, result: loadgen.LoadResult, points) -> dict:
    offered = rate * seconds
    accepted = result.count(202)
    accepted_rate = accepted / result.duration
    grows = stats.backlog_grows(points, rate)
    generator_bound = result.schedule_lag_max > 0.5
    reasons = []
    if accepted < 0.99 * offered:
        reasons.append(f"only {accepted} of {offered} callbacks accepted")
    if accepted_rate < 0.95 * rate:
        reasons.append(f"accepted {accepted_rate:.0f}/s of {rate}/s offered")
    if grows:
        reasons.append("the queue backlog kept growing")
    if generator_bound:
        reasons.append(
            f"the load generator fell {result.schedule_lag_max:.2f} s behind its schedule"
        )
    return {
        "offered_rate": rate,
        "seconds": seconds,
        "offered": offered,
        "accepted_per_second": accepted_rate,
        "non_202": len(result.samples) - accepted,
        "errors": result.errors,
        "generator_lag_max_seconds": result.schedule_lag_max,
        "backlog_start": points[0][1] if points else 0.0,
        "backlog_end": points[-1][1] if points else 0.0,
        "backlog_max": max((y for _, y in points), default=0.0),
        "backlog_trend_per_second": stats.backlog_trend(points),
        "sustained": not reasons,
        "why_not": reasons,
    }
