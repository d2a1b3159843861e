"""The payments API while PostgreSQL is down: 503 with Retry-After, never Django's 500 page.

Real parts throughout: gunicorn as production starts it, on a PostgreSQL cluster of the
session's own (``pg_cluster``), which the tests stop and start. Each outage is the server going
away under a running web process, so the API meets it as in production: on the connection
health check, in authentication (the token table), in the Idempotency-Key claim.
"""

import concurrent.futures
import contextlib
import json
import time
import types
import uuid

import boto3
import psycopg
import pytest
import requests

from payments import signing
from payments.api.errors import DATABASE_RETRY_AFTER_SECONDS, DATABASE_UNAVAILABLE_MESSAGE
from tests.callbacks.test_endpoint import SECRET, event_body
from tests.gunicorn_support import free_port, gunicorn_running
from tests.pg_cluster import django_env, django_run

pytestmark = pytest.mark.subprocess

MERCHANT = "m-outage"
UNAVAILABLE = {
    "type": "api_error",
    "code": "database_unavailable",
    "param": None,
    "message": DATABASE_UNAVAILABLE_MESSAGE,
    "errors": {},
}
LOG_MARK = "payments API answered 503, database unavailable"

API_USER = """
from rest_framework.authtoken.models import Token
from payments.models import MerchantAccess
from tests.factories import UserFactory

user = UserFactory()
MerchantAccess.objects.get_or_create(user=user, merchant_id={merchant!r})
print(Token.objects.get_or_create(user=user)[0].key)
"""


@pytest.fixture(scope="module")
def web(pg_cluster_session, local_sqs, tmp_path_factory):
    """gunicorn on the cluster, an API user with a token and a grant for MERCHANT, and a queue
    for the callback endpoint."""
    cluster = pg_cluster_session
    cluster.start()
    token = django_run(cluster.url, API_USER.format(merchant=MERCHANT)).strip()
    suffix = uuid.uuid4().hex[:12]
    queue_name = f"payments-outage-{suffix}.fifo"
    sqs = boto3.client("sqs", endpoint_url=local_sqs.endpoint_url, region_name="us-east-1")
    queue = sqs.create_queue(QueueName=queue_name, Attributes={"FifoQueue": "true"})
    env = django_env(
        cluster.url,
        SQS_ENDPOINT_URL=local_sqs.endpoint_url,
        SQS_QUEUE_NAME=queue_name,
        SQS_DLQ_NAME=f"payments-outage-dlq-{suffix}.fifo",
        CALLBACK_SIGNING_SECRETS=SECRET,
        GUNICORN_BIND=f"127.0.0.1:{free_port()}",
        GUNICORN_WORKERS="1",
        GUNICORN_THREADS="2",
    )
    env.pop("PROMETHEUS_MULTIPROC_DIR", None)
    log_path = tmp_path_factory.mktemp("outage") / "gunicorn.log"
    with gunicorn_running(env, log_path) as base:
        yield types.SimpleNamespace(
            base=base, token=token, log_path=log_path, sqs=sqs, queue_url=queue["QueueUrl"]
        )


def call(web, method, path, *, token=None, key=None, body=None) -> requests.Response:
    headers = {"Authorization": f"Token {token or web.token}"}
    if key is not None:
        headers["Idempotency-Key"] = key
    return requests.request(method, f"{web.base}{path}", json=body, headers=headers, timeout=30)


def payment_body(**overrides) -> dict:
    return {"merchant_id": MERCHANT, "amount": "12.34", "source_token": "tok_outage", **overrides}


def assert_unavailable(response: requests.Response) -> None:
    assert response.status_code == 503, response.text
    assert response.headers["Retry-After"] == str(DATABASE_RETRY_AFTER_SECONDS)
    assert response.headers["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error.pop("request_id") == response.headers["Request-Id"]
    assert error == UNAVAILABLE


def test_every_payments_call_answers_503_while_the_database_is_down_then_serves_again(
    pg_cluster, web
):
    created = call(web, "POST", "/api/payments/", body=payment_body())
    assert created.status_code == 201, created.text
    detail = f"/api/payments/{created.json()['id']}/"
    balance = f"/api/merchants/{MERCHANT}/balance/"
    log_before = len(web.log_path.read_text())

    pg_cluster.stop()
    outage = [
        call(web, "POST", "/api/payments/", body=payment_body()),
        call(web, "POST", "/api/payments/", key=str(uuid.uuid4()), body=payment_body()),
        call(web, "GET", detail),
        call(web, "GET", balance),
        # The token is looked up in the database: an unknown one is no 401 while it is down.
        call(web, "GET", balance, token="0" * 40),
    ]
    for response in outage:
        assert_unavailable(response)
    # No credentials at all needs no database: still the 401 it always was.
    assert requests.get(f"{web.base}{balance}", timeout=30).status_code == 401

    pg_cluster.start()
    assert call(web, "POST", "/api/payments/", body=payment_body()).status_code == 201
    assert call(web, "GET", detail).status_code == 200
    assert call(web, "GET", balance).status_code == 200

    # One line per 503, no traceback, nothing that says where the database is.
    log = web.log_path.read_text()[log_before:]
    lines = [line for line in log.splitlines() if LOG_MARK in line]
    assert len(lines) == len(outage), log
    assert "Traceback" not in log
    for line in lines:
        assert str(pg_cluster.port) not in line and pg_cluster.database not in line
        assert "127.0.0.1" not in line


def test_a_create_refused_during_the_outage_executes_when_retried_with_its_key(pg_cluster, web):
    key = str(uuid.uuid4())
    pg_cluster.stop()
    assert_unavailable(call(web, "POST", "/api/payments/", key=key, body=payment_body()))

    pg_cluster.start()
    retried = call(web, "POST", "/api/payments/", key=key, body=payment_body())
    assert retried.status_code == 201, retried.text
    assert "Idempotent-Replayed" not in retried.headers
    # From now on the key replays the payment it created.
    replayed = call(web, "POST", "/api/payments/", key=key, body=payment_body())
    assert (replayed.status_code, replayed.json()["id"]) == (201, retried.json()["id"])
    assert replayed.headers["Idempotent-Replayed"] == "true"


def test_the_callback_endpoint_needs_no_database(pg_cluster, web):
    event = event_body()
    raw = json.dumps(event).encode()
    pg_cluster.stop()
    response = requests.post(
        f"{web.base}/callbacks/processor/",
        data=raw,
        headers={"Content-Type": "application/json", signing.HEADER: signing.sign(raw, [SECRET])},
        timeout=30,
    )
    assert response.status_code == 202, response.text
    queued = [e["processor_event_id"] for e in queued_events(web)]
    assert event["processor_event_id"] in queued


def queued_events(web) -> list[dict]:
    """The processor events on the queue (beside the submissions the created payments queued)."""
    events = []
    while got := web.sqs.receive_message(
        QueueUrl=web.queue_url, MaxNumberOfMessages=10, VisibilityTimeout=60
    ).get("Messages"):
        bodies = [json.loads(message["Body"]) for message in got]
        events += [body["event"] for body in bodies if body["kind"] == "processor_event"]
    return events


# A data error raised by the server itself, for one description only: the row, not the database.
REFUSE_DESCRIPTION = """
CREATE OR REPLACE FUNCTION outage_test_refuse() RETURNS trigger AS $$
BEGIN
    IF NEW.description = 'data-error' THEN
        RAISE EXCEPTION 'value out of range' USING ERRCODE = 'numeric_value_out_of_range';
    ELSIF NEW.description = 'integrity-error' THEN
        RAISE EXCEPTION 'check violated' USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END $$ LANGUAGE plpgsql;
CREATE OR REPLACE TRIGGER outage_test_refuse BEFORE INSERT ON payments_payment
    FOR EACH ROW EXECUTE FUNCTION outage_test_refuse();
"""


@pytest.mark.parametrize("description", ["data-error", "integrity-error"])
def test_a_data_error_is_no_outage_and_answers_500_as_before(pg_cluster, web, description):
    pg_cluster.execute(REFUSE_DESCRIPTION)
    try:
        key = str(uuid.uuid4())
        body = payment_body(description=description)
        response = call(web, "POST", "/api/payments/", key=key, body=body)
        assert response.status_code == 500
        assert "Retry-After" not in response.headers
        # As before, the key was released: the same request runs again (and fails again).
        assert call(web, "POST", "/api/payments/", key=key, body=body).status_code == 500
    finally:
        pg_cluster.execute("DROP TRIGGER IF EXISTS outage_test_refuse ON payments_payment")
    assert call(web, "POST", "/api/payments/", body=payment_body()).status_code == 201


def test_a_create_cut_off_by_the_outage_mid_way_executes_when_retried_with_its_key(pg_cluster, web):
    key = str(uuid.uuid4())
    # Holding back the payment's insert keeps the request inside its work, after its key's
    # claim, until the server goes away under it.
    with (
        # closing(), not the connection's own exit, which would commit on a server now gone.
        contextlib.closing(psycopg.connect(pg_cluster.url)) as blocker,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        blocker.execute("LOCK TABLE payments_payment IN SHARE MODE")
        pending = pool.submit(call, web, "POST", "/api/payments/", key=key, body=payment_body())
        deadline = time.monotonic() + 10
        while not pg_cluster.execute(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
        ):
            assert time.monotonic() < deadline, "the request never reached the payment's insert"
            time.sleep(0.02)
        # Immediate, as a crash: no session ends cleanly, so none releases its locks. A fast
        # stop ends the blocker's session cleanly, which releases its lock; on a loaded machine
        # the server can reach the request's session only after it took the lock and committed.
        pg_cluster.stop(mode="immediate")
        assert_unavailable(pending.result())

    # Its claim was in the work's transaction, which the outage rolled back: nothing is bound to
    # the key, so the retry executes at once, and once only.
    pg_cluster.start()
    retried = call(web, "POST", "/api/payments/", key=key, body=payment_body())
    assert retried.status_code == 201, retried.text
    again = call(web, "POST", "/api/payments/", key=key, body=payment_body())
    assert again.status_code == 201 and again.json()["id"] == retried.json()["id"], again.text
