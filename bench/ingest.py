"""The ``ingest`` phase: the callback endpoint against the minimal view, behind one gunicorn, in
alternating rounds, with the CPU each web process and the local SQS server used per request."""

import json
import os
import subprocess
import threading
import uuid
from collections.abc import Callable
from pathlib import Path

from bench import events, loadgen, stats
from bench.cpu import process_cpu
from bench.metrics import batch_means, histograms
from bench.options import CALLBACK_PATH, CONFIG, SECRETS, log, problems
from bench.prepare import queue_depth, queues_create
from bench.sockets import connections_per_process
from bench.stack import RESULTS, BenchError, Gunicorn, Stack
from devstack.processes import ROOT


def _wrk(url: str, pool: Path, seconds: int, connections: int) -> dict:
    threads = 1
    cmd = ["wrk", "-t", str(threads), "-c", str(connections), "-d", f"{seconds}s"]
    cmd += ["--timeout", "5s", "-s", str(ROOT / "bench" / "wrk_callbacks.lua"), url]
    cmd += ["--", str(pool), str(threads)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("BENCHJSON ")]
    if done.returncode != 0 or not lines:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stdout}{done.stderr}")
    raw = json.loads(lines[-1].removeprefix("BENCHJSON "))
    duration = raw["duration_us"] / 1e6
    return {
        "requests": raw["requests"],
        "accepted": raw["accepted"],
        "other_status": raw["other_status"],
        "socket_errors": sum(raw[k] for k in raw if k.startswith("errors_")),
        "pool_wraps": raw["wraps"],
        "seconds": duration,
        "accepted_per_second": raw["accepted"] / duration,
        "p50_ms": raw["p50_us"] / 1000,
        "p90_ms": raw["p90_us"] / 1000,
        "p99_ms": raw["p99_us"] / 1000,
        "max_ms": raw["max_us"] / 1000,
    }


def _python_closed_loop(port: int, path: str, pool: Path, seconds: int, connections: int) -> dict:
    lines = pool.read_text().splitlines()

    def make(n: int) -> tuple[str, bytes]:
        signature, body = lines[n % len(lines)].split("\t", 1)
        headers = {"Content-Type": "application/json", "X-Processor-Signature": signature}
        return str(n), loadgen.build_request("127.0.0.1", port, path, body.encode(), headers)

    result = loadgen.closed_loop("127.0.0.1", port, make, seconds=seconds, connections=connections)
    latencies = [(s.answered - s.sent) * 1000 for s in result.samples]
    accepted = result.count(202)
    return {
        "requests": len(result.samples),
        "accepted": accepted,
        "other_status": len(result.samples) - accepted - result.count(0),
        "socket_errors": result.count(0),
        "pool_wraps": len(result.samples) // len(lines),
        "seconds": result.duration,
        "accepted_per_second": accepted / result.duration,
        "p50_ms": stats.percentile(latencies, 50),
        "p90_ms": stats.percentile(latencies, 90),
        "p99_ms": stats.percentile(latencies, 99),
        "max_ms": max(latencies, default=None),
    }


def load_callbacks(
    generator: str,
    server: Gunicorn,
    path: str,
    seconds: int,
    pool_size: int,
    *,
    midway: Callable[[], None] | None = None,
) -> dict:
    """``seconds`` of signed callbacks from the generator; ``midway()`` runs in a thread
    halfway through, once the pool is signed and the generator's connections are open."""
    pool = RESULTS / "callbacks-pool.tsv"
    events.write_signed_pool(pool, pool_size, SECRETS, run=uuid.uuid4().hex[:8])
    timer = threading.Timer(seconds / 2, midway) if midway else None
    if timer is not None:
        timer.start()
    try:
        if generator == "wrk":
            return _wrk(server.url + path, pool, seconds, CONFIG["ingest_connections"])
        return _python_closed_loop(server.port, path, pool, seconds, CONFIG["ingest_connections"])
    finally:
        if timer is not None:
            timer.cancel()
        pool.unlink(missing_ok=True)


def ingest_phase(stack: Stack, generator: str) -> dict:
    from bench.urls import MINIMAL_PATH

    name, dlq, url = queues_create("ingest")
    server = Gunicorn(
        stack,
        queue=(name, dlq),
        workers=CONFIG["gunicorn_workers"],
        threads=CONFIG["gunicorn_threads"],
    ).start()
    out: dict = {
        "generator": generator,
        "connections": CONFIG["ingest_connections"],
        "gunicorn": " ".join(server.command[1:]),
        "seconds": CONFIG["ingest_seconds"],
        # The web processes read it from the environment (unset: the product's default).
        "send_coalesce_seconds": os.environ.get("CALLBACK_SEND_COALESCE_SECONDS", "default"),
        "rounds": CONFIG["ingest_rounds"],
    }
    runs: dict[str, list[dict]] = {"minimal": [], "callback": []}
    try:
        sent = 0
        # Alternating rounds, so drift in the machine's background load hits both alike.
        for round_number in range(1, out["rounds"] + 1):
            for target, path in (("minimal", MINIMAL_PATH), ("callback", CALLBACK_PATH)):
                if round_number == 1:
                    # Warm up: imports, connection pools, each gunicorn worker's SQS client.
                    warm = load_callbacks(generator, server, path, 2, 5_000)
                    if target == "callback":
                        sent += warm["accepted"]
                result = _round(stack, server, generator, target, path)
                if target == "callback":
                    sent += result["accepted"]
                runs[target].append(result)
                _log_round(target, round_number, result)
        for target, results in runs.items():
            out[target] = _means(results)
            out[target]["rounds"] = results
        visible, _ = queue_depth(url)
        out["queued_messages"] = visible
        # wrk stops with requests in flight: the server may still queue those after the
        # count, so the queue may hold a few more than were answered, never fewer.
        if visible < sent:
            problems.append(f"ingest: {sent} callbacks accepted but only {visible} queued")
    finally:
        server.stop()
    out["callback_vs_minimal"] = stats.ratio(
        out["callback"]["accepted_per_second"], out["minimal"]["accepted_per_second"]
    )
    out["callback_vs_minimal_even_rounds"] = _even_rounds_ratio(runs)
    out["callback_vs_minimal_min_round"] = min_round_ratio(runs)
    return out


def min_round_ratio(runs: dict[str, list[dict]]) -> float | None:
    """The worst round: each callback round over the minimal round it alternated with (the
    same round number), the lowest of those ratios."""
    pairs = zip(runs["minimal"], runs["callback"], strict=False)
    ratios = [
        stats.ratio(cb["accepted_per_second"], mini["accepted_per_second"]) for mini, cb in pairs
    ]
    ratios = [r for r in ratios if r is not None]
    return min(ratios, default=None)


def _round(stack: Stack, server: Gunicorn, generator: str, target: str, path: str) -> dict:
    """One measured round against ``path``, with the CPU it cost each web process and the
    local SQS server."""
    web_pids = [server.process.pid, *server.worker_pids()]
    sqs_pids = [stack.sqs_pid] if stack.sqs_pid else []
    batches = histograms(server)  # read outside the measured CPU
    cpu_each = [process_cpu(pid) for pid in web_pids]
    cpu_sqs = sum(process_cpu(pid) for pid in sqs_pids)
    spread: list[int] = []
    result = load_callbacks(
        generator,
        server,
        path,
        CONFIG["ingest_seconds"],
        CONFIG["ingest_pool"],
        midway=lambda: spread.extend(connections_per_process(web_pids[1:], server.port)),
    )
    result["connections_per_process"] = spread
    used_each = [process_cpu(pid) - before for pid, before in zip(web_pids, cpu_each, strict=True)]
    answered = max(result["accepted"], 1)
    # CPU per accepted request of gunicorn's processes and of the local SQS server.
    result["web_cpu_ms_per_request"] = round(1000 * sum(used_each) / answered, 3)
    result["sqs_cpu_ms_per_request"] = round(
        1000 * (sum(process_cpu(pid) for pid in sqs_pids) - cpu_sqs) / answered, 3
    )
    # Cores each web process used (master first): one process held to one core by its GIL
    # while the other idles shows an uneven share of the connections.
    result["web_cores_per_process"] = [
        round(used / max(result["seconds"], 1e-9), 2) for used in used_each
    ]
    workers_cores = result["web_cores_per_process"][1:]
    result["web_processes_uneven"] = len(workers_cores) > 1 and min(workers_cores) < 0.6 * max(
        workers_cores
    )
    if target == "callback":
        result["callbacks_per_send_call"] = batch_means(batches, histograms(server))[
            "callbacks_per_send_call"
        ]
    if result["pool_wraps"]:
        problems.append(
            f"ingest {target}: the pool of {CONFIG['ingest_pool']} signed "
            "callbacks wrapped around; raise BENCH_INGEST_POOL"
        )
    if result["other_status"] or result["socket_errors"]:
        problems.append(
            f"ingest {target}: {result['other_status']} non-202 answers and "
            f"{result['socket_errors']} socket errors"
        )
    return result


def _log_round(target: str, round_number: int, result: dict) -> None:
    log(
        f"ingest {target} round {round_number}: "
        f"{result['accepted_per_second']:.0f} accepted/s, "
        f"P50 {result['p50_ms']:.1f} ms, P99 {result['p99_ms']:.1f} ms"
        + (
            f", {result['callbacks_per_send_call']} callbacks per SQS call"
            if result.get("callbacks_per_send_call")
            else ""
        )
        + f", cores per web process {result['web_cores_per_process'][1:]}"
        + f", connections per web process {result.get('connections_per_process')}"
        + (" (uneven)" if result["web_processes_uneven"] else "")
    )


def _means(results: list[dict]) -> dict:
    """The mean of the rounds, the figures the table shows."""
    keys = (
        "accepted_per_second",
        "p50_ms",
        "p90_ms",
        "p99_ms",
        "web_cpu_ms_per_request",
        "sqs_cpu_ms_per_request",
    )
    return {key: sum(r[key] for r in results) / len(results) for key in keys}


def _even_rounds_ratio(runs: dict[str, list[dict]]) -> float | None:
    """The ratio over only the rounds whose connections fell evenly on the web processes (see
    "web_cores_per_process"): None when either endpoint had no such round."""
    even = {
        target: [r["accepted_per_second"] for r in runs[target] if not r["web_processes_uneven"]]
        for target in runs
    }
    if not (even["callback"] and even["minimal"]):
        return None
    return stats.ratio(
        sum(even["callback"]) / len(even["callback"]),
        sum(even["minimal"]) / len(even["minimal"]),
    )
