"""What a callback's ingest costs in process: CPU per request of ``POST /callbacks/processor/``
against the benchmark's minimal DRF view (``bench/minimal.py``), through the same WSGI handler.

    DATABASE_URL=postgres://postgres@127.0.0.1:5432/<any> .venv/bin/python \\
        scripts/callback_ingest_cost.py [--requests 3000] [--rounds 5] [--threads 8] [--profile]

It starts the local SQS server (fauxqs) on a free loopback port with a queue of its own, loads
``bench.settings`` (the product's settings and middleware, plus the minimal view's URL) and
calls Django's WSGI application in a loop, as gunicorn's threads do, with distinct callbacks
signed beforehand (a repeat would be cheaper than reality). Neither view reads the database.

Rounds alternate (minimal view, then the endpoint), so drift in the machine's load hits both
alike, and the medians of the rounds are printed:

- ``serial``: one thread, each request's own thread CPU (``time.thread_time``); the endpoint's
  send is one ``SendMessageBatch`` of one entry, in the request's thread;
- ``threads``: ``--threads`` threads posting at once, the process's CPU over the requests
  (``time.process_time``, every thread's), as under gunicorn's gthread workers, where the
  coalescer shares one send among the requests that arrive together.

It also counts the Python function calls per request of each view, one thread, under
``cProfile`` (exact, where the CPU figures move with the machine's load).

``--without-send`` answers the endpoint's batch sends in process (each entry accepted, as SQS
would) instead of calling SQS: what is left is the endpoint's own work, without boto3's.

The log lines go to ``/dev/null`` through the project's formatter and filters (formatting them
is part of the cost; where they go is not). ``--profile`` prints the serial endpoint's top
``--profile-lines`` functions by cumulative time under ``cProfile``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CALLBACK_PATH = "/callbacks/processor/"
SECRET = "cost-signing-secret"


def environment() -> object:
    from tests.localsqs import LocalSqs, aws_test_environment

    aws_test_environment()
    # As under the production gunicorn config: prometheus-client's multiprocess mode, whose
    # every metric update is a file write (bench/stack.py sets it for the benchmark too).
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = tempfile.mkdtemp(prefix="ingest-cost-metrics-")
    server = LocalSqs().start()
    suffix = uuid.uuid4().hex[:8]
    os.environ.update(
        DJANGO_SETTINGS_MODULE="bench.settings",
        SQS_ENDPOINT_URL=server.endpoint_url,
        SQS_QUEUE_NAME=f"ingest-cost-{suffix}.fifo",
        SQS_DLQ_NAME=f"ingest-cost-dlq-{suffix}.fifo",
        CALLBACK_SIGNING_SECRETS=SECRET,
    )
    os.environ.setdefault("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/postgres")
    return server


def signed_pool(count: int) -> list[tuple[bytes, str]]:
    from bench import events
    from payments import signing

    now = int(time.time())
    run = uuid.uuid4().hex[:8]
    pool = []
    for callback in events.callbacks_for((str(uuid.uuid4()) for _ in range(count)), run):
        pool.append((callback.body, signing.sign(callback.body, [SECRET], timestamp=now)))
    return pool


def environ_of(path: str, body: bytes, signature: str) -> dict:
    return {
        "REQUEST_METHOD": "POST",
        "PATH_INFO": path,
        "SCRIPT_NAME": "",
        "QUERY_STRING": "",
        "SERVER_NAME": "127.0.0.1",
        "SERVER_PORT": "8000",
        "SERVER_PROTOCOL": "HTTP/1.1",
        "REMOTE_ADDR": "127.0.0.1",
        "HTTP_HOST": "127.0.0.1:8000",
        "CONTENT_TYPE": "application/json",
        "CONTENT_LENGTH": str(len(body)),
        "HTTP_X_PROCESSOR_SIGNATURE": signature,
        "wsgi.input": io.BytesIO(body),
        "wsgi.url_scheme": "http",
        "wsgi.errors": sys.stderr,
        "wsgi.multithread": True,
        "wsgi.multiprocess": True,
        "wsgi.run_once": False,
        "wsgi.version": (1, 0),
    }


class Caller:
    """Calls the WSGI application as a server does: the body read, the answer's iterable
    consumed and closed."""

    def __init__(self, application) -> None:
        self.application = application

    def __call__(self, environ: dict) -> str:
        status = []

        def start_response(line, headers, exc_info=None):
            status.append(line)

        answer = self.application(environ, start_response)
        try:
            b"".join(answer)
        finally:
            if hasattr(answer, "close"):
                answer.close()
        if not status[0].startswith("202"):
            raise RuntimeError(f"{environ['PATH_INFO']} answered {status[0]}")
        return status[0]


def serial_round(call: Caller, path: str, pool: list[tuple[bytes, str]]) -> float:
    """Thread CPU per request, in ms."""
    environs = [environ_of(path, body, signature) for body, signature in pool]
    started = time.thread_time()
    for environ in environs:
        call(environ)
    return 1000 * (time.thread_time() - started) / len(environs)


def threaded_round(call: Caller, path: str, pool: list[tuple[bytes, str]], threads: int) -> float:
    """The process's CPU per request, in ms, ``threads`` threads posting at once."""
    environs = [environ_of(path, body, signature) for body, signature in pool]
    share = [environs[n::threads] for n in range(threads)]
    errors: list[BaseException] = []

    def run(mine: list[dict]) -> None:
        try:
            for environ in mine:
                call(environ)
        except BaseException as exc:  # noqa: BLE001 - reported after the round
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(mine,)) for mine in share]
    started = time.process_time()
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    used = time.process_time() - started
    if errors:
        raise errors[0]
    return 1000 * used / len(environs)


class SendCount:
    """Batch send calls and their entries, to tell the coalescer's batching apart from the
    CPU per request (a bigger batch costs less per callback)."""

    def __init__(self) -> None:
        from callbacks import sqs

        self.calls = self.entries = 0
        send = sqs.send_messages_each_now

        def counted(messages, **kwargs):
            messages = list(messages)
            self.calls += 1
            self.entries += len(messages)
            return send(messages, **kwargs)

        sqs.send_messages_each_now = counted


def send_answered_in_process() -> None:
    """The coalescer's batch send (made on its first use, below) answers every entry as SQS
    would, without calling it."""
    from callbacks import sqs
    from callbacks.sqs_messages import BatchOutcome

    def answered(messages, *, url=None):
        messages = list(messages)
        results = [{"Id": str(n), "MessageId": uuid.uuid4().hex} for n in range(len(messages))]
        return BatchOutcome(done=messages, results=results)

    sqs.send_messages_each_now = answered


def calls_per_request(call: Caller, path: str, pool: list[tuple[bytes, str]]) -> float:
    """Function calls (Python and built-in) per request, one thread, under ``cProfile``."""
    import cProfile
    import pstats

    environs = [environ_of(path, body, signature) for body, signature in pool]
    profile = cProfile.Profile()
    profile.enable()
    for environ in environs:
        call(environ)
    profile.disable()
    return pstats.Stats(profile).total_calls / len(environs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--without-send", action="store_true")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--profile-lines", type=int, default=45)
    options = parser.parse_args()

    server = environment()
    try:
        import django

        django.setup()
        import logging

        from django.core.wsgi import get_wsgi_application

        from bench.urls import MINIMAL_PATH
        from callbacks.queues import queues_ensure

        call = Caller(get_wsgi_application())  # sets logging up again
        for handler in logging.getLogger().handlers:
            handler.setStream(open(os.devnull, "w"))  # noqa: SIM115
        queues_ensure(visibility_timeout=30)
        if options.without_send:
            send_answered_in_process()
        sends = SendCount()  # wraps the batch send the coalescer will be made with
        targets = (("minimal", MINIMAL_PATH), ("callback", CALLBACK_PATH))
        for _, path in targets:  # warm up: imports, the SQS client, first-request caches
            serial_round(call, path, signed_pool(200))
        figures: dict[str, dict[str, list[float]]] = {
            mode: {target: [] for target, _ in targets} for mode in ("serial", "threads")
        }
        # Every serial round first: once requests have run at once, a lone callback's send
        # waits for others (callbacks.sqs_coalescing), as it would in such a process.
        for _ in range(options.rounds):
            for target, path in targets:
                pool = signed_pool(options.requests)
                figures["serial"][target].append(serial_round(call, path, pool))
        for _ in range(options.rounds):
            for target, path in targets:
                pool = signed_pool(options.requests)
                figures["threads"][target].append(threaded_round(call, path, pool, options.threads))
        report: dict = {
            "calls_per_request": {
                target: round(calls_per_request(call, path, signed_pool(500)), 1)
                for target, path in targets
            }
        }
        for mode, by_target in figures.items():
            medians = {target: statistics.median(values) for target, values in by_target.items()}
            report[mode] = {
                "cpu_ms_per_request_median": {t: round(m, 4) for t, m in medians.items()},
                "callback_over_minimal": round(medians["callback"] / medians["minimal"], 3),
                "rounds": {t: [round(v, 4) for v in values] for t, values in by_target.items()},
            }
        report["threads"]["callbacks_per_send"] = round(sends.entries / max(sends.calls, 1), 2)
        print(json.dumps(report, indent=1))
        if options.profile:
            import cProfile
            import pstats

            pool = signed_pool(options.requests)
            environs = [environ_of(CALLBACK_PATH, body, signature) for body, signature in pool]
            profile = cProfile.Profile()
            profile.enable()
            for environ in environs:
                call(environ)
            profile.disable()
            out = io.StringIO()
            pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(
                options.profile_lines
            )
            print(out.getvalue())
    finally:
        server.stop()
        shutil.rmtree(os.environ["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


if __name__ == "__main__":
    main()
