"""``GET /api/payments/``: the caller's merchants only, newest first, cursor pages, filters
refused by name."""

import base64
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from payments.models import Payment, PaymentState
from tests.factories import PaymentFactory, grant

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)


def payment_at(merchant_id: str, at: datetime, **fields) -> Payment:
    payment = PaymentFactory(merchant_id=merchant_id, **fields)
    # created_at is auto_now_add: set it after the insert.
    Payment.objects.filter(pk=payment.pk).update(created_at=at)
    payment.refresh_from_db()
    return payment


def ids(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [p["id"] for p in response.json()["results"]]


def bad_param(response) -> str:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error["param"]


def test_lists_only_the_callers_merchants_newest_first(api_client, user):
    grant(user, "acme")
    grant(user, "globex")
    old = payment_at("acme", T0)
    new = payment_at("globex", T0 + timedelta(hours=1))
    payment_at("initech", T0 + timedelta(hours=2))  # not granted: never listed

    response = api_client.get("/api/payments/")

    assert ids(response) == [str(new.id), str(old.id)]
    listed = response.json()["results"][0]
    assert set(listed) >= {"id", "state", "merchant_id", "amount", "metadata", "created_at"}
    assert response.json()["next"] is None


def test_a_user_without_grants_gets_an_empty_list(api_client):
    payment_at("acme", T0)
    assert ids(api_client.get("/api/payments/")) == []


def test_filtering_on_a_merchant_not_granted_answers_403_naming_it(api_client, user):
    grant(user, "acme")
    payment_at("globex", T0)
    response = api_client.get("/api/payments/", {"merchant": "globex"})
    assert response.status_code == 403
    assert response.json()["error"]["param"] == "merchant"


def test_filters_merchant_state_and_created_range(api_client, user):
    grant(user, "acme")
    grant(user, "globex")
    early = payment_at("acme", T0)
    middle = payment_at("acme", T0 + timedelta(days=1), state=PaymentState.SUBMITTED)
    payment_at("acme", T0 + timedelta(days=2))
    payment_at("globex", T0 + timedelta(days=1))

    assert len(ids(api_client.get("/api/payments/", {"merchant": "acme"}))) == 3
    assert ids(api_client.get("/api/payments/", {"merchant": "acme", "state": "submitted"})) == [
        str(middle.id)
    ]
    window = {
        "merchant": "acme",
        "created_gte": T0.isoformat(),
        "created_lt": (T0 + timedelta(days=1)).isoformat(),
    }
    assert ids(api_client.get("/api/payments/", window)) == [str(early.id)]
    # Without an offset a time is UTC, whatever the server's TIME_ZONE.
    naive = {"merchant": "acme", "created_lt": "2026-03-01T12:00:01"}
    assert ids(api_client.get("/api/payments/", naive)) == [str(early.id)]


def test_cursor_pages_walk_every_payment_once_while_new_ones_arrive(api_client, user):
    grant(user, "acme")
    # Ties on created_at (one transaction's rows) and distinct times.
    made = [payment_at("acme", T0 + timedelta(minutes=i // 2)) for i in range(7)]
    expected = [str(p.id) for p in sorted(made, key=lambda p: (p.created_at, p.id), reverse=True)]

    seen: list[str] = []
    response = api_client.get("/api/payments/", {"limit": 3})
    while True:
        page = ids(response)
        assert len(page) <= 3
        seen.extend(page)
        payment_at("acme", T0 + timedelta(days=9))  # newer than every page: not in this walk
        assert response.json()["object"] == "list"
        assert response.json()["has_more"] is (response.json()["next"] is not None)
        if response.json()["next"] is None:
            break
        response = api_client.get(response.json()["next"])

    assert sorted(seen) == sorted(expected) and len(seen) == len(set(seen)) == 7


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "101"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"state": "paid"}, "state"),
        ({"merchant": "bad merchant!"}, "merchant"),
        ({"merchant": "m-021000021"}, "merchant"),
        ({"created_gte": "yesterday"}, "created_gte"),
        ({"created_lt": "2026-13-01T00:00:00Z"}, "created_lt"),
        (
            {"created_gte": "2026-03-02T00:00:00Z", "created_lt": "2026-03-01T00:00:00Z"},
            "created_lt",
        ),
        ({"cursor": "not-a-cursor"}, "cursor"),
        ({"merchant": "a\x00b"}, "merchant"),
        ({"sort": "amount"}, "sort"),
    ],
)
def test_each_bad_filter_is_a_400_naming_it(api_client, user, query, param):
    grant(user, "acme")
    assert bad_param(api_client.get("/api/payments/", query)) == param


def forged_cursor(query: str) -> str:
    """A cursor in DRF's encoding (base64 of a query string) that this API never gave."""
    return base64.b64encode(query.encode()).decode()


@pytest.mark.parametrize(
    "query", ["p=not-a-date", "p=\x00", "p=2026-13-01 00:00:00%2B00:00", "o=1&p=NaN"]
)
def test_a_forged_cursor_position_is_a_400_naming_the_cursor(api_client, user, query):
    grant(user, "acme")
    payment_at("acme", T0)

    assert bad_param(api_client.get("/api/payments/", {"cursor": forged_cursor(query)})) == "cursor"


def _real_cursor(api_client) -> str:
    """The cursor of a next link this API gave."""
    from urllib.parse import parse_qs, urlsplit

    next_link = api_client.get("/api/payments/", {"limit": 1}).json()["next"]
    return parse_qs(urlsplit(next_link).query)["cursor"][0]


HOSTILE_CURSORS = {
    # Characters outside base64's alphabet: DRF's decoder drops them and reads nothing.
    "not-base64": "!!!***",
    "base64-of-junk": base64.b64encode(b"hello world").decode(),
    "base64-of-binary": base64.b64encode(bytes(range(256))).decode(),
    "base64-of-nothing-known": forged_cursor("x=1&y=2"),
    "unknown-key-beside-a-real-one": forged_cursor("o=1&z=1"),
    "offset-zero-written-out": forged_cursor("o=0"),
    "offset-negative": forged_cursor("o=-1"),
    "offset-past-the-cutoff": forged_cursor("o=5000"),
    "offset-not-digits": forged_cursor("o=1e3"),
    "reverse-not-one": forged_cursor("r=2"),
    "reverse-zero-written-out": forged_cursor("r=0"),
    "key-given-twice": forged_cursor("o=1&o=2"),
    "position-a-date-only": forged_cursor("p=2026-03-01"),
    "position-another-offset": forged_cursor("p=2026-03-01+12%3A00%3A00%2B02%3A00"),
    "position-iso-t-and-z": forged_cursor("p=2026-03-01T12%3A00%3A00Z"),
    "position-naive": forged_cursor("p=2026-03-01+12%3A00%3A00"),
    "position-empty": forged_cursor("p="),
    "unpadded": base64.b64encode(b"o=12").decode().rstrip("="),
    "urlsafe-alphabet": base64.urlsafe_b64encode(b"p=\xff\xfe?>").decode(),
    "with-a-newline": forged_cursor("o=1")[:2] + "\n" + forged_cursor("o=1")[2:],
    "nul": "\x00",
    "nul-inside-base64": forged_cursor("o=1") + "\x00",
    "lone-surrogate-bytes": "%ED%A0%80",
    "non-ascii": "ÿÿÿÿ",
    "huge": "A" * 100_000,
    "huge-but-valid-base64": forged_cursor("p=" + "1" * 600),
    "empty": "",
}


@pytest.mark.parametrize("cursor", HOSTILE_CURSORS.values(), ids=HOSTILE_CURSORS.keys())
def test_every_forged_cursor_is_a_400_naming_the_cursor(api_client, user, cursor):
    grant(user, "acme")
    for at in range(3):
        payment_at("acme", T0 + timedelta(minutes=at))

    if cursor == "%ED%A0%80":  # raw bytes in the query string, not a Python string
        response = api_client.get("/api/payments/", QUERY_STRING="cursor=%ED%A0%80")
    else:
        response = api_client.get("/api/payments/", {"cursor": cursor})

    assert bad_param(response) == "cursor"
    assert response.json()["error"]["errors"].keys() == {"cursor"}


def test_a_cursor_given_with_its_characters_tampered_is_refused(api_client, user):
    grant(user, "acme")
    for at in range(3):
        payment_at("acme", T0 + timedelta(minutes=at))
    real = _real_cursor(api_client)
    assert ids(api_client.get("/api/payments/", {"cursor": real, "limit": 1}))  # it works
    for tampered in (real + "!", "*" + real, real.replace("=", ""), real + "=="):
        assert bad_param(api_client.get("/api/payments/", {"cursor": tampered})) == "cursor"


def test_the_next_and_previous_links_read_back_both_ways(api_client, user):
    grant(user, "acme")
    made = [payment_at("acme", T0 + timedelta(minutes=i)) for i in range(5)]
    newest_first = [str(p.id) for p in sorted(made, key=lambda p: (p.created_at, p.id))][::-1]

    pages = [api_client.get("/api/payments/", {"limit": 2})]
    while pages[-1].json()["next"]:
        pages.append(api_client.get(pages[-1].json()["next"]))
    back = [pages[-1]]
    while back[-1].json()["previous"]:
        back.append(api_client.get(back[-1].json()["previous"]))

    assert [i for page in pages for i in ids(page)] == newest_first
    assert [i for page in reversed(back) for i in ids(page)] == newest_first


def test_a_cursor_from_another_merchants_list_reads_only_the_callers_payments(api_client, user):
    # The cursor carries a moment and an offset, nothing of a merchant: taken from another
    # merchant's list, it is a moment in the caller's own list, never a way into the other's.
    from rest_framework.test import APIClient

    from tests.factories import UserFactory

    other = UserFactory()
    grant(other, "globex")
    grant(user, "acme")
    for at in range(3):
        payment_at("globex", T0 + timedelta(minutes=at))
    mine = payment_at("acme", T0 - timedelta(minutes=1))
    payment_at("acme", T0 + timedelta(hours=1))  # newer than the cursor's moment
    theirs = APIClient()
    theirs.force_authenticate(other)
    cursor = _real_cursor(theirs)

    assert ids(api_client.get("/api/payments/", {"cursor": cursor})) == [str(mine.id)]


def test_a_filter_given_twice_is_refused(api_client, user):
    grant(user, "acme")
    assert bad_param(api_client.get("/api/payments/?state=pending&state=failed")) == "state"


def test_a_policy_that_cannot_list_merchants_needs_the_merchant_filter(api_client, module_settings):
    module_settings.PAYMENTS_MERCHANT_ACCESS_POLICY = "tests.payments.test_api_tenancy.only_globex"
    payment = payment_at("globex", T0)
    assert bad_param(api_client.get("/api/payments/")) == "merchant"
    assert ids(api_client.get("/api/payments/", {"merchant": "globex"})) == [str(payment.id)]


def test_the_list_query_uses_the_merchant_index(api_client, user):
    grant(user, "acme")
    with CaptureQueriesContext(connection) as queries:
        ids(api_client.get("/api/payments/", {"merchant": "acme", "limit": 5}))
    [listing] = [
        q["sql"] for q in queries.captured_queries if 'FROM "payments_payment"' in q["sql"]
    ]
    # A few rows leave the planner free to sort whatever it scans; with scans and sorts priced
    # out, only an index that is both filter and order can serve the query: ours.
    with connection.cursor() as cursor:
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("SET LOCAL enable_sort = off")
        # An incremental sort over the creation date's index is a sort too.
        cursor.execute("SET LOCAL enable_incremental_sort = off")
        cursor.execute(f"EXPLAIN {listing}")
        plan = "\n".join(row[0] for row in cursor.fetchall())
    assert "payment_merchant_created" in plan, plan


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("created_gte=%D9%A2%D9%A0%D9%A2%D9%A6-12-01T00:00:00Z", "created_gte"),  # Arabic-Indic
        ("limit=%EF%BC%92%EF%BC%95", "limit"),  # full-width 25
        ("created_lt=2026-12-01T00:00:00%EF%BC%BA", "created_lt"),  # a full-width Z
    ],
)
def test_a_number_written_in_another_script_is_a_400_naming_it(api_client, user, query, param):
    grant(user, "acme")

    response = api_client.get(f"/api/payments/?merchant=acme&{query}")

    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == param and "ASCII" in error["message"]
