"""The triage dashboard: open dead letters, queue depths, holds, re-processing, latency, stuck
payments, errors, return rates, notifications of change due and the processor's breaker, on one
admin page.

Wired through ``TriageDashboardAdmin.changelist_view``; seeing it needs the right to view dead
letters. Each panel reads one selector (or ``return_rates_panel``); the page writes nothing.
"""

from __future__ import annotations

from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from payments.selectors import nocs_due_count
from triage import selectors
from triage.operations import charts, return_rates
from triage.operations.charts import human_age
from triage.views.common import admin_context


def dashboard(request, model_admin):
    """Open dead letters, queue depths, holds, re-processing, latency, stuck payments, errors."""
    if not model_admin.has_view_permission(request):
        raise PermissionDenied("The triage dashboard needs the right to view dead letters.")
    now = timezone.now()
    open_summary = selectors.dead_letters_open_summary(now=now)
    rate = selectors.reprocessing_rate(now=now)
    latency = selectors.enqueue_to_applied_buckets(now=now)
    errors = selectors.error_classes_ranked(now=now)
    dead_by_class = selectors.dead_letters_by_error_class()
    holds = list(selectors.payments_on_hold())
    stuck = [
        {"payment": p, "age": human_age(now - p.state_changed_at)}
        for p in selectors.payments_stuck()
    ]
    short = [(label.rsplit(".", 1)[-1], n) for label, n in errors]
    breaker = selectors.processor_breaker_status(now=now)
    return TemplateResponse(
        request,
        "admin/triage/dashboard.html",
        admin_context(
            request,
            model_admin,
            title="Triage dashboard",
            now=now,
            open_summary=open_summary,
            oldest_open_age=human_age(open_summary.oldest_age),
            depths=selectors.queue_depths(),
            oldest_unfinished_age=human_age(selectors.oldest_unfinished_age(now=now)),
            holds=[{"hold": h, "age": human_age(now - h.created_at)} for h in holds],
            rate=rate,
            rate_chart=charts.ratio_bar(
                rate.reprocessed, rate.total, title="Messages that needed more than one attempt"
            ),
            latency=latency,
            latency_chart=charts.bar_chart(latency, title="Enqueue-to-applied latency, 24 h"),
            errors=errors,
            errors_chart=charts.bar_chart(short, title="Processing errors by class, 24 h"),
            dead_by_class=dead_by_class,
            stuck=stuck,
            changelist_url=reverse("admin:triage_deadletter_changelist"),
            **return_rates.return_rates_panel(now=now),
            nocs=nocs_due_count(now=now),
            nocs_url=reverse("admin:payments_notificationofchange_changelist"),
            breaker=breaker,
            breaker_open_for=human_age(breaker.open_for),
            breaker_next_probe=human_age(breaker.next_probe_in),
            breaker_paused_for=human_age(breaker.paused_for),
        ),
    )
