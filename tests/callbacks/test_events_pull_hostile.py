"""The pull against a processor whose events API misbehaves: a scripted HTTP server answers each
``GET /v1/events`` from a script (malformed events, a cursor that does not move, ``has_more``
that lies, 5xx, timeouts, pages over the limit), with the local SQS server and PostgreSQL real.
"""

import json
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from callbacks.events_pull import PullOutcome, processor_events_pull
from callbacks.models import ProcessorEventsCursor
from payments import conf as payments_conf
from payments.models import PaymentState
from payments.processor.backend import ProcessorBackend
from tests.callbacks.worker_support import ROOT, queue_counts, run_worker, worker_env
from tests.factories import PaymentFactory
from tests.waiting import wait_for
from triage.ingestion import dead_letters_ingest
from triage.models import Alert, DeadLetter

pytestmark = pytest.mark.django_db(transaction=True)


class ScriptedEvents:
    """Answers ``GET /v1/events`` with ``answer(after, limit)`` -> (status, body, delay)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.requests: list[dict] = []
        scripted = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                url = urlparse(self.path)
                query = parse_qs(url.query)
                after = (query.get("after") or [None])[0]
                limit = int((query.get("limit") or ["0"])[0])
                scripted.requests.append({"after": after, "limit": limit})
                status, body, delay = scripted.answer(after, limit)
                time.sleep(delay)
                payload = json.dumps(body).encode() if not isinstance(body, bytes) else body
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def scripted(module_settings):
    from payments.processor.backends.http import reset_client

    servers = []

    def start(answer) -> ScriptedEvents:
        server = ScriptedEvents(answer)
        servers.append(server)
        module_settings.PROCESSOR_BASE_URL = server.base_url
        module_settings.PROCESSOR_TIMEOUT_SECONDS = 0.5
        reset_client()
        return server

    yield start
    for server in servers:
        server.stop()
    reset_client()


def event(payment, event_type: str, **fields) -> dict:
    return {
        "payment_id": str(payment.id),
        "event_type": event_type,
        "processor_event_id": f"evt_{uuid.uuid4().hex}",
        "amount": f"{payment.amount:.2f}",
        "timestamp": datetime.now(UTC).isoformat(),
        **fields,
    }


def page(data, next_cursor, has_more=False) -> tuple[int, dict, float]:
    return 200, {"data": data, "next_cursor": next_cursor, "has_more": has_more}, 0.0


def stored_cursor() -> str:
    return ProcessorEventsCursor.objects.values_list("cursor", flat=True).first() or ""


def test_a_malformed_event_is_dead_lettered_with_its_error_and_the_others_applied(
    sqs_queues, scripted
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    bad = event(payment, "settled", amount="12.5")  # one decimal place
    scripted(lambda after, limit: page([bad, event(payment, "settled")], "c1"))

    result = processor_events_pull()

    assert (result.outcome, result.new, result.malformed) == ("done", 1, 1)
    assert stored_cursor() == "c1"
    run_worker()
    payment.refresh_from_db()
    assert payment.state == PaymentState.CONFIRMED
    assert dead_letters_ingest() == 1
    dead = DeadLetter.objects.get()
    assert dead.processor_event_id == bad["processor_event_id"]
    assert dead.payment_id == payment.id
    assert dead.last_error_class == "InvalidPulledEvent"
    assert "amount" in dead.last_error_message
    assert dead.body["event"] == bad  # as the processor listed it
    # Pulled again (the cursor lost, say): the same dead letter, not a second one.
    ProcessorEventsCursor.objects.update(cursor="")
    processor_events_pull()
    dead_letters_ingest()
    assert DeadLetter.objects.count() == 1


def test_an_event_that_is_not_an_object_is_dead_lettered_too(sqs_queues, scripted):
    scripted(lambda after, limit: page(["settled", 7], "c1"))

    result = processor_events_pull()

    assert (result.outcome, result.malformed) == ("done", 2)
    assert dead_letters_ingest() == 2
    assert set(DeadLetter.objects.values_list("group_id", flat=True)) == {"events-pull"}


def test_a_cursor_that_does_not_advance_stops_the_pass_with_an_alert(sqs_queues, scripted):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    events = [event(payment, "settled")]
    ProcessorEventsCursor.objects.create(source=payments_conf.PROCESSOR_BACKEND, cursor="c1")
    server = scripted(lambda after, limit: page(events, after, has_more=True))

    result = processor_events_pull()

    assert result.outcome == PullOutcome.STALLED
    assert len(server.requests) == 1  # not asked again and again for the same page
    assert stored_cursor() == "c1"
    assert ProcessorEventsCursor.objects.get().pulled_at is None  # not a success
    assert Alert.objects.filter(key="processor_events_pull.stalled").exists()


def test_has_more_that_never_ends_is_bounded_by_the_pages_of_a_pass(
    sqs_queues, scripted, module_settings
):
    module_settings.PROCESSOR_EVENTS_PULL_MAX_PAGES = 4
    server = scripted(
        lambda after, limit: page([], f"c{int((after or 'c0')[1:]) + 1}", has_more=True)
    )

    result = processor_events_pull()

    assert (result.outcome, result.pages) == ("done", 4)
    assert [r["after"] for r in server.requests] == [None, "c1", "c2", "c3"]
    assert stored_cursor() == "c4"  # the next pass goes on from there


def test_has_more_false_with_more_to_come_is_picked_up_by_the_next_pass(sqs_queues, scripted):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    pages = {None: ([event(payment, "settled")], "c1"), "c1": ([], "c1")}
    scripted(lambda after, limit: page(*pages[after], has_more=False))

    assert processor_events_pull().pulled == 1
    assert processor_events_pull().pulled == 0
    assert stored_cursor() == "c1"


@pytest.mark.parametrize(
    ("answer", "error"),
    [
        ((503, {"error": "down"}, 0.0), "HTTP 503"),
        ((200, {"data": [], "next_cursor": "c9", "has_more": False}, 1.0), "no answer within"),
        ((200, b'{"data": [], "next_cursor": "c9", "has_more": NaN}', 0.0), "unusable"),
        ((200, {"data": {}, "next_cursor": "c9", "has_more": False}, 0.0), "data must be a list"),
    ],
    ids=["5xx", "timeout", "not-json", "not-a-page"],
)
def test_a_failing_events_api_fails_the_pass_cleanly_and_leaves_the_cursor(
    sqs_queues, scripted, answer, error
):
    ProcessorEventsCursor.objects.create(source=payments_conf.PROCESSOR_BACKEND, cursor="c1")
    scripted(lambda after, limit: answer)

    result = processor_events_pull()

    assert result.outcome == PullOutcome.FAILED
    assert error in result.error
    row = ProcessorEventsCursor.objects.get()
    assert (row.cursor, row.pulled_at) == ("c1", None)
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_a_page_over_the_limit_asked_for_is_refused_whole(sqs_queues, scripted, module_settings):
    module_settings.PROCESSOR_EVENTS_PULL_PAGE_SIZE = 5
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    huge = [event(payment, "settled") for _ in range(500)]
    server = scripted(lambda after, limit: page(huge, "c500"))

    result = processor_events_pull()

    assert server.requests == [{"after": None, "limit": 5}]
    assert result.outcome == PullOutcome.FAILED
    assert "500 events on a page asked for at most 5" in result.error
    assert stored_cursor() == ""
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (0, 0)


def test_a_queue_that_refuses_fails_the_pass_and_leaves_the_cursor(
    sqs_queues, scripted, module_settings
):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    scripted(lambda after, limit: page([event(payment, "settled")], "c1"))
    module_settings.SQS_QUEUE_NAME = "no-such-queue.fifo"
    from callbacks import sqs

    sqs.reset()

    result = processor_events_pull()

    assert result.outcome == PullOutcome.FAILED
    assert "queue unavailable" in result.error
    assert stored_cursor() == ""


def test_a_refused_cursor_fails_the_pass_with_an_alert(sqs_queues, scripted):
    scripted(lambda after, limit: (400, {"error": "unknown cursor"}, 0.0))

    result = processor_events_pull()

    assert result.outcome == PullOutcome.FAILED
    assert Alert.objects.filter(key="processor_events_pull.refused").exists()


class NoEventsBackend(ProcessorBackend):
    """A processor without an events API (as the NACHA bank backend)."""

    def debit_create(self, **kwargs):
        raise NotImplementedError

    def debit_get(self, **kwargs):
        raise NotImplementedError

    def callback_verify(self, request):
        raise NotImplementedError

    def callback_parse(self, data, request):
        raise NotImplementedError


def test_a_backend_without_an_events_api_makes_the_pull_say_so_and_do_nothing(
    sqs_queues, module_settings, client
):
    from bank.nacha.backend import NachaBankBackend

    assert NachaBankBackend.events_list is ProcessorBackend.events_list
    module_settings.PROCESSOR_BACKEND = f"{__name__}.NoEventsBackend"

    result = processor_events_pull()

    assert result.outcome == PullOutcome.UNSUPPORTED
    assert not ProcessorEventsCursor.objects.exists()
    assert "payments_processor_events_pull_success_timestamp_seconds" not in gauges(client)


def gauges(client) -> dict[str, float]:
    text = client.get("/metrics").content.decode()
    return {
        sample.name: sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith("payments_processor_events_pull_")
        and sample.name.endswith("_timestamp_seconds")
    }


def test_the_pull_counts_its_events_and_serves_its_lag(sqs_queues, scripted, client):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    known = PaymentFactory(state=PaymentState.SUBMITTED)
    first = event(known, "settled", timestamp="2026-11-30T12:00:00+00:00")
    scripted(lambda after, limit: page([first], "c1") if after is None else page([], after))
    assert gauges(client)["payments_processor_events_pull_success_timestamp_seconds"] == 0
    processor_events_pull()
    run_worker()

    def sample(outcome):
        return (
            REGISTRY.get_sample_value(
                "payments_processor_events_pulled_total", {"outcome": outcome}
            )
            or 0.0
        )

    before = {o: sample(o) for o in ("new", "known", "malformed")}
    newest = "2026-12-01T08:00:00+00:00"
    scripted(
        lambda after, limit: page(
            [first, event(payment, "settled", timestamp=newest), {"bad": 1}], "c2"
        )
    )
    ProcessorEventsCursor.objects.update(cursor="")
    processor_events_pull()

    assert {o: sample(o) - before[o] for o in before} == {"new": 1, "known": 1, "malformed": 1}
    served = gauges(client)
    pulled_at = ProcessorEventsCursor.objects.get().pulled_at.timestamp()
    assert served == {
        "payments_processor_events_pull_success_timestamp_seconds": pytest.approx(pulled_at),
        "payments_processor_events_pull_newest_event_timestamp_seconds": pytest.approx(
            datetime.fromisoformat(newest).timestamp()
        ),
    }


def test_two_pullers_at_once_pull_each_page_once(sqs_queues, scripted, tmp_path):
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    pages = {
        None: ([event(payment, "settled")], "c1", True),
        "c1": ([event(payment, "returned", reason_code="R01")], "c2", True),
        "c2": ([], "c2", False),
    }
    server = scripted(lambda after, limit: (*page(*pages[after])[:2], 2.0))

    def puller(name: str) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "processor_events_pull"],
            cwd=ROOT,
            env=worker_env(PROCESSOR_TIMEOUT_SECONDS="10"),
            stdout=(tmp_path / f"{name}.log").open("w"),
            stderr=subprocess.STDOUT,
        )

    first = puller("first")
    wait_for(lambda: server.requests, 60, "the first puller's first page", watch=[first])
    second = puller("second")  # starts while the first holds its pass

    assert first.wait(60) == 0
    assert second.wait(60) == 0
    afters = [r["after"] for r in server.requests]
    assert afters == [None, "c1", "c2"]  # each page once, by one of them
    assert "skipped: " in (tmp_path / "second.log").read_text()
    assert stored_cursor() == "c2"
    assert queue_counts(sqs_queues.client, sqs_queues.url) == (2, 0)


def test_a_cursor_set_by_hand_is_where_the_next_pass_starts(sqs_queues, scripted, capsys):
    from django.core.management import CommandError, call_command

    server = scripted(lambda after, limit: page([], after or "c0"))

    call_command("processor_events_pull", set_cursor="c41")
    processor_events_pull()
    with pytest.raises(CommandError, match="1-512 characters"):
        call_command("processor_events_pull", set_cursor="c 42")

    assert "the next pass starts after 'c41' (was '(the first event)')" in capsys.readouterr().out
    assert [r["after"] for r in server.requests] == ["c41"]
    assert stored_cursor() == "c41"
