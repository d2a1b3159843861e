"""One trace from the callback to the ledger: the endpoint's request id and the caller's
``traceparent`` ride in the SQS message attributes, through the real local SQS server, to the
real worker, which writes them on every record of that message and, with OpenTelemetry, starts
its span in the caller's trace."""

import io
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from callbacks import tracing
from callbacks.models import PaymentHold
from callbacks.outbox import outbox_relay_publish
from callbacks.services import hold_release
from payments.kernel import propagation
from payments.kernel.logcontext import LogContextFilter
from payments.kernel.logformat import JsonLineFormatter
from payments.models import OutboxMessage, Payment, PaymentState
from tests.callbacks.test_endpoint import event_body, post_json
from tests.callbacks.worker_support import run_worker, run_worker_until, send_body
from tests.factories import PaymentFactory, grant

ROOT = Path(__file__).resolve().parents[2]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"


@pytest.fixture
def worker_log():
    """The records this process writes, as LOGGING's JSON handler writes them."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonLineFormatter())
    handler.addFilter(LogContextFilter())
    root = logging.getLogger()
    previous = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        yield lambda: [json.loads(line) for line in stream.getvalue().splitlines()]
    finally:
        root.removeHandler(handler)
        root.setLevel(previous)


@pytest.fixture
def without_otel(monkeypatch):
    """The module as it runs when the otel extra is not installed."""
    for module in (tracing, propagation):
        monkeypatch.setattr(module, "propagate", None)
        monkeypatch.setattr(module, "trace", None)


@pytest.fixture(scope="module")
def spans():
    """An in-memory exporter on the process's tracer provider (set once per process)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()


def settle_through_the_worker(**headers):
    """Post a signed ``settled`` callback for a submitted payment and let the worker apply it;
    returns (payment, the answer's request id)."""
    payment = PaymentFactory(state=PaymentState.SUBMITTED)
    response = post_json(
        event_body(payment_id=str(payment.id), amount=str(payment.amount)), **headers
    )
    assert response.status_code == 202
    run_worker_until(
        lambda: payment.__class__.objects.get(pk=payment.pk).state == PaymentState.CONFIRMED
    )
    return payment, response["Request-Id"]


@pytest.mark.parametrize("window", [0, 0.01], ids=["alone", "coalesced"])
@pytest.mark.usefixtures("without_otel")
def test_the_message_carries_the_request_id_and_traceparent(sqs_queues, module_settings, window):
    module_settings.CALLBACK_SEND_COALESCE_SECONDS = window

    response = post_json(event_body(), HTTP_TRACEPARENT=TRACEPARENT)

    assert response.status_code == 202
    [message] = sqs_queues.client.receive_message(
        QueueUrl=sqs_queues.url, MessageAttributeNames=["All"], WaitTimeSeconds=0
    )["Messages"]
    assert tracing.carried(message["MessageAttributes"]) == {
        "request_id": response["Request-Id"],
        "traceparent": TRACEPARENT,
    }


@pytest.mark.usefixtures("without_otel")
def test_a_malformed_traceparent_is_not_passed_on(sqs_queues):
    response = post_json(event_body(), HTTP_TRACEPARENT="00-not-a-trace\n-01")

    assert response.status_code == 202
    [message] = sqs_queues.client.receive_message(
        QueueUrl=sqs_queues.url, MessageAttributeNames=["All"], WaitTimeSeconds=0
    )["Messages"]
    assert tracing.carried(message["MessageAttributes"]) == {"request_id": response["Request-Id"]}


@pytest.mark.django_db(transaction=True)  # the worker commits its own transactions
@pytest.mark.usefixtures("without_otel")
def test_every_record_the_worker_writes_for_the_message_carries_the_request_id(
    sqs_queues, worker_log
):
    payment, request_id = settle_through_the_worker(HTTP_TRACEPARENT=TRACEPARENT)

    records = worker_log()
    accepted = next(r for r in records if r["message"] == "callback accepted")
    message_id = accepted["message_id"]
    of_message = [r for r in records if r.get("message_id") == message_id]
    assert len(of_message) >= 2  # the endpoint's record and the worker's at least
    assert {r["request_id"] for r in of_message} == {request_id}
    [done] = [r for r in of_message if r["logger"] == "callbacks.worker" and "outcome" in r]
    assert done["payment_id"] == str(payment.id)
    assert done["outcome"] == "applied"
    assert done["trace_id"] == TRACE_ID
    assert {"attempt", "duration_ms"} <= set(done)


@pytest.mark.django_db(transaction=True)
def test_a_callback_with_a_traceparent_gives_a_worker_span_in_its_trace(
    sqs_queues, worker_log, spans
):
    spans.clear()

    payment, request_id = settle_through_the_worker(HTTP_TRACEPARENT=TRACEPARENT)

    [span] = [s for s in spans.get_finished_spans() if s.name == "process processor_event"]
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert format(span.parent.span_id, "016x") == PARENT_ID
    [done] = [
        r
        for r in worker_log()
        if r["logger"] == "callbacks.worker" and r.get("payment_id") == str(payment.id)
    ]
    assert done["trace_id"] == TRACE_ID and done["request_id"] == request_id


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("without_otel", "sandbox")
def test_a_created_payments_submission_is_logged_in_the_create_requests_trace(
    sqs_queues, api_client, user, worker_log
):
    """The create request's id and trace wait with the submit command in the outbox, go with
    it through SQS, and name every record the worker writes while it submits the payment."""
    grant(user, "m-1")
    response = api_client.post(
        "/api/payments/",
        {"merchant_id": "m-1", "amount": "25.00", "source_token": "tok_abcdef12"},
        format="json",
        HTTP_TRACEPARENT=TRACEPARENT,
    )
    assert response.status_code == 201
    payment_id = response.json()["id"]
    request_id = response["Request-Id"]
    [row] = OutboxMessage.objects.filter(group_id=payment_id)
    assert row.carried == {"request_id": request_id, "traceparent": TRACEPARENT}

    outbox_relay_publish()
    run_worker_until(lambda: Payment.objects.get(pk=payment_id).state == PaymentState.SUBMITTED)

    of_message = [r for r in worker_log() if r.get("payment_id") == payment_id]
    assert {r["logger"] for r in of_message} >= {"callbacks.worker", "payments.services.calls"}
    assert {(r["request_id"], r["trace_id"]) for r in of_message} == {(request_id, TRACE_ID)}
    [done] = [r for r in of_message if r["logger"] == "callbacks.worker" and "outcome" in r]
    assert done["outcome"] == "submitted"


@pytest.mark.django_db(transaction=True)
@pytest.mark.usefixtures("without_otel")
def test_a_parked_message_is_released_with_the_request_id_and_trace_it_arrived_with(sqs_queues):
    payment = PaymentFactory(state=PaymentState.PENDING)
    # A message of an unknown kind is dead-lettered and puts its payment on hold.
    send_body(sqs_queues.client, sqs_queues.url, payment.id, {"kind": "refund_payment"})
    run_worker()
    hold = PaymentHold.objects.get(payment_id=str(payment.id), released_at=None)
    sqs_queues.client.send_message(
        QueueUrl=sqs_queues.url,
        MessageBody=json.dumps({"kind": "submit_payment", "payment_id": str(payment.id)}),
        MessageGroupId=str(payment.id),
        MessageDeduplicationId="submit-1",
        MessageAttributes=carrying("req_parked"),
    )
    run_worker()
    [parked] = hold.parked.all()
    assert parked.carried == {"request_id": "req_parked", "traceparent": TRACEPARENT}

    assert hold_release(payment_id=payment.id, released_by="ops@example.com", note="ok") == 1

    [message] = sqs_queues.client.receive_message(
        QueueUrl=sqs_queues.url, MessageAttributeNames=["All"], WaitTimeSeconds=1
    )["Messages"]
    assert message["MessageId"] == hold.parked.get().republished_message_id
    assert tracing.carried(message["MessageAttributes"]) == {
        "request_id": "req_parked",
        "traceparent": TRACEPARENT,
    }


def test_values_held_in_a_column_are_bounded_again_when_sent():
    """A column may have been written by anything (an older release, a person in the shell):
    what is sent from it is checked as what arrives from outside is."""
    assert propagation.message_attributes(
        {"request_id": "x" * 10_000, "traceparent": TRACEPARENT, "other": "y", "tracestate": 5}
    ) == {"traceparent": {"DataType": "String", "StringValue": TRACEPARENT}}


def carrying(request_id: str, traceparent: str = TRACEPARENT) -> dict:
    return {
        "request_id": {"DataType": "String", "StringValue": request_id},
        "traceparent": {"DataType": "String", "StringValue": traceparent},
    }


@pytest.mark.django_db(transaction=True)
def test_a_message_on_the_one_by_one_path_is_logged_and_traced_in_its_context(
    sqs_queues, worker_log, spans
):
    """A body no handler takes goes the per-message path to the dead-letter queue: its records,
    the worker's and the triage hold's (another logger), carry its request id and trace."""
    spans.clear()
    message_id = sqs_queues.client.send_message(
        QueueUrl=sqs_queues.url,
        MessageBody=json.dumps({"kind": "no_such_kind"}),
        MessageGroupId="group-1",
        MessageDeduplicationId="dedup-1",
        MessageAttributes=carrying("req_from_upstream"),
    )["MessageId"]

    run_worker()

    of_message = [r for r in worker_log() if r.get("message_id") == message_id]
    assert {r["logger"] for r in of_message} >= {"callbacks.worker", "callbacks.services.holds"}
    assert {(r["request_id"], r["trace_id"], r["payment_id"]) for r in of_message} == {
        ("req_from_upstream", TRACE_ID, "group-1")
    }
    [done] = [r for r in of_message if r["logger"] == "callbacks.worker" and "outcome" in r]
    assert done["outcome"] == "dead_lettered"
    [span] = [s for s in spans.get_finished_spans() if s.name == "process no_such_kind"]
    assert format(span.context.trace_id, "032x") == TRACE_ID


@pytest.mark.parametrize(
    "attributes",
    [
        carrying("x" * 10_000),
        {"request_id": {"DataType": "Number", "StringValue": None}},
        {"other": {"DataType": "String", "StringValue": "ignored"}},
    ],
    ids=["too-long", "not-a-string", "not-carried"],
)
def test_a_carried_value_from_outside_that_is_no_id_is_left_out(attributes):
    assert "request_id" not in tracing.carried(attributes)
    assert "other" not in tracing.carried(attributes)


def test_attributes_count_toward_a_messages_size():
    from callbacks.sqs_messages import OutgoingMessage

    bare = OutgoingMessage(body={"kind": "k"}, group_id="g", deduplication_id="d")
    carried = OutgoingMessage(
        body={"kind": "k"}, group_id="g", deduplication_id="d", attributes=carrying("req_1")
    )

    assert carried.size == bare.size + len("request_idStringreq_1traceparentString" + TRACEPARENT)


@pytest.mark.subprocess
def test_the_module_imports_and_passes_a_traceparent_on_without_opentelemetry():
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"
        "from callbacks import tracing\n"
        "assert tracing.trace is None\n"
        f"print(tracing.outgoing_attributes(request_id='req_1', headers={{'traceparent': "
        f"'{TRACEPARENT}'}})['traceparent']['StringValue'])"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == TRACEPARENT


def test_with_opentelemetrys_default_propagators_a_traceparent_is_passed_on():
    assert propagation.outgoing_values(
        request_id="req_1", headers={"traceparent": TRACEPARENT}
    ) == {"request_id": "req_1", "traceparent": TRACEPARENT}


def test_without_a_traceparent_the_default_propagators_are_not_asked(monkeypatch):
    """W3C Trace Context and Baggage find no trace in a request without a traceparent: the
    endpoint's hot path skips their extract and inject."""

    def refused(*args, **kwargs):
        raise AssertionError("extract called for a request without a traceparent")

    monkeypatch.setattr(propagation.propagate, "extract", refused)

    assert propagation.outgoing_values(
        request_id="req_1", headers={"tracestate": "a=b", "baggage": "k=v"}
    ) == {"request_id": "req_1"}


def test_another_propagators_trace_is_passed_on_without_a_traceparent_header():
    """A host's propagator may read headers of its own (B3, Jaeger, ...): its trace reaches the
    message as a traceparent, whatever the request's own headers."""
    from opentelemetry import propagate, trace
    from opentelemetry.propagators.textmap import TextMapPropagator, default_getter
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    class HostPropagator(TextMapPropagator):
        def extract(self, carrier, context=None, getter=default_getter):
            [value] = getter.get(carrier, "x-host-trace") or [None]
            if value is None:
                return context or {}
            trace_id, span_id = value.split(":")
            span = trace.NonRecordingSpan(
                trace.SpanContext(
                    int(trace_id, 16),
                    int(span_id, 16),
                    is_remote=True,
                    trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
                )
            )
            return trace.set_span_in_context(span, context)

        def inject(self, carrier, context=None, setter=None):
            TraceContextTextMapPropagator().inject(carrier, context)

        @property
        def fields(self):
            return {"x-host-trace", "traceparent"}

    before = propagate.get_global_textmap()
    propagate.set_global_textmap(HostPropagator())
    try:
        values = propagation.outgoing_values(
            request_id="req_1", headers={"x-host-trace": f"{TRACE_ID}:{PARENT_ID}"}
        )
    finally:
        propagate.set_global_textmap(before)

    assert values == {"request_id": "req_1", "traceparent": TRACEPARENT}
