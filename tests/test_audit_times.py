"""Every audit and history time of the four apps is the database's (``db_default=Now()``),
whichever way the row is inserted (``create``, ``save``, ``bulk_create``) and whatever the
inserting host's clock says. ``auto_now_add`` would read the host's clock: a worker two minutes
fast would stamp a submission after the confirmation that followed it. The real-stack proof,
with processes under libfaketime, is ``tests/callbacks/test_audit_clock.py``."""

from datetime import timedelta

import pytest
from django.apps import apps
from django.db import connection
from django.db.models.functions import Now
from django.utils import timezone

from tests import factories
from tests.history import history_rewritten

# The audit trail: (model, its time field, the factory that builds a row of it).
AUDIT_TIMES = [
    ("payments.PaymentEvent", "created_at", factories.PaymentEventFactory),
    ("payments.ProcessedEvent", "processed_at", factories.ProcessedEventFactory),
    ("payments.LedgerEntry", "created_at", factories.LedgerEntryFactory),
    ("payments.ProcessorAttempt", "recorded_at", factories.ProcessorAttemptFactory),
    ("payments.PaymentReturn", "created_at", None),
    ("payments.ReturnDishonor", "created_at", None),
    ("payments.NotificationOfChange", "created_at", None),
    ("payments.NocAction", "created_at", None),
    ("payments.CircuitBreakerTransition", "created_at", factories.CircuitBreakerTransitionFactory),
    ("callbacks.ProcessingError", "created_at", factories.ProcessingErrorFactory),
    ("callbacks.PaymentHold", "created_at", factories.PaymentHoldFactory),
    ("callbacks.ParkedMessage", "parked_at", factories.ParkedMessageFactory),
    ("triage.DeadLetter", "ingested_at", factories.DeadLetterFactory),
    ("triage.DeadLetter", "status_changed_at", factories.DeadLetterFactory),
    ("triage.TriageAction", "created_at", factories.TriageActionFactory),
]
SKEW = timedelta(minutes=2)
MARGIN = timedelta(seconds=10)


@pytest.mark.parametrize(("label", "name"), [(label, name) for label, name, _ in AUDIT_TIMES])
def test_each_audit_time_is_the_databases_default_and_never_the_hosts(label, name):
    field = apps.get_model(label)._meta.get_field(name)
    assert isinstance(field.db_default, Now), f"{label}.{name} is not db_default=Now()"
    assert not field.auto_now_add and not field.auto_now and not field.has_default()


@pytest.fixture
def fast_clock(monkeypatch):
    """This process's clock two minutes ahead of the database's, as a host's may be."""
    real = timezone.now
    monkeypatch.setattr(timezone, "now", lambda: real() + SKEW)


def db_now():
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement_timestamp()")
        return cursor.fetchone()[0]


def _within_now(times, before, after) -> None:
    for moment in times:
        assert before <= moment <= after + MARGIN, (moment, before, after)


BUILT = [(label, name, made) for label, name, made in AUDIT_TIMES if made is not None]


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_clock")
@pytest.mark.parametrize(
    ("label", "name", "made"), BUILT, ids=[f"{label}.{name}" for label, name, _ in BUILT]
)
def test_a_host_two_minutes_fast_stamps_no_audit_row_whichever_way_it_is_inserted(
    label, name, made
):
    model = apps.get_model(label)
    before = db_now()
    created = made()  # Model.objects.create
    built = _unsaved(made)  # Model(...).save()
    built.save()
    bulk = model.objects.bulk_create([_unsaved(made)])
    after = db_now()

    # The instances carry the database's value back (RETURNING), as the stored rows do.
    instances = [created, built, *bulk]
    _within_now([getattr(row, name) for row in instances], before, after)
    stored = model.objects.filter(pk__in=[row.pk for row in instances])
    _within_now(stored.values_list(name, flat=True), before, after)


def _unsaved(made):
    """An unsaved row of the factory ``made`` whose parents are saved: the parents of a row
    made and removed again (a row may be unique per parent)."""
    template = made()
    parents = {
        field.name: getattr(template, field.name)
        for field in template._meta.concrete_fields
        if field.many_to_one and getattr(template, field.attname) is not None
    }
    with history_rewritten():  # an audit row, which only maintenance removes
        template.delete()
    return made.build(**parents)
