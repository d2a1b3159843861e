"""After a hostile run: where, in the database or in the admin, a bank number planted in foreign
input can still be read whole.

A test plants numbers it chose (an account number in a free-text field, a file name, a
statement's text) and asks ``bank_number_scan`` for every place that shows one of them: each
table's rows read as PostgreSQL writes them as text (every column, JSON members included;
sealed bytes are ciphertext, shown as hex), and every admin changelist and change page the
superuser can open. A number written in another script's digits is also looked for in ASCII
digits, and a number written in groups (``7766-8056-8693``) also as its digits alone. The answer
is a list of places; a test asserts it is empty.
"""

from __future__ import annotations

import html
import unicodedata
from collections.abc import Iterable

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.urls import NoReverseMatch, reverse

# Change pages opened per admin model: enough to cover what a hostile run wrote.
CHANGE_PAGES_PER_MODEL = 20


def _forms(needle: str) -> set[str]:
    ascii_digits = "".join(
        str(unicodedata.digit(c)) if unicodedata.digit(c, None) is not None else c for c in needle
    )
    forms = {needle, ascii_digits}
    forms |= {"".join(c for c in form if c not in " -") for form in list(forms)}
    return {form for form in forms if form}


def _table_hits(forms: set[str]) -> list[str]:
    hits = []
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            quoted = connection.ops.quote_name(table)
            for form in sorted(forms):
                cursor.execute(
                    f"SELECT count(*) FROM {quoted} AS r WHERE strpos(r::text, %s) > 0",  # noqa: S608
                    [form],
                )
                if count := cursor.fetchone()[0]:
                    hits.append(f"table {table}: {count} row(s) hold {form!r}")
    return hits


def _admin_client() -> Client:
    user_model = get_user_model()
    user = user_model.objects.filter(username="bank-number-scan").first()
    if user is None:
        user = user_model.objects.create_superuser("bank-number-scan", "scan@example.com", "x")
    client = Client(raise_request_exception=True)
    client.force_login(user)
    return client


def _page_hits(client: Client, url: str, forms: set[str]) -> list[str]:
    response = client.get(url)
    if response.status_code != 200:
        return [f"admin page {url} answered {response.status_code}"]
    text = html.unescape(response.content.decode())
    return [f"admin page {url} shows {form!r}" for form in sorted(forms) if form in text]


def _admin_hits(forms: set[str]) -> list[str]:
    client = _admin_client()
    hits = []
    for model, model_admin in admin.site._registry.items():
        opts = model._meta
        try:
            changelist = reverse(f"admin:{opts.app_label}_{opts.model_name}_changelist")
        except NoReverseMatch:
            continue
        hits += _page_hits(client, changelist, forms)
        for pk in model_admin.get_queryset(_Request(client)).values_list("pk", flat=True)[
            :CHANGE_PAGES_PER_MODEL
        ]:
            url = reverse(f"admin:{opts.app_label}_{opts.model_name}_change", args=[quote(pk)])
            hits += _page_hits(client, url, forms)
    return hits


class _Request:
    """Enough of a request for ``ModelAdmin.get_queryset``: the scanning superuser."""

    def __init__(self, client: Client) -> None:
        self.user = get_user_model().objects.get(username="bank-number-scan")
        self.GET: dict = {}


def bank_number_scan(planted: Iterable[str], *, admin_pages: bool = True) -> list[str]:
    """Every place in the database (and, unless ``admin_pages`` is False, the admin) where one
    of the ``planted`` numbers can be read whole; empty when every one was masked."""
    forms: set[str] = set()
    for needle in planted:
        forms |= _forms(needle)
    hits = _table_hits(forms)
    if admin_pages:
        hits += _admin_hits(forms)
    return hits
