"""Admin pages of triage: action confirmations (single, bulk, hold release) and the dashboard.

Each view is wired through ``DeadLetterAdmin.get_urls()`` and wrapped in ``admin_site.admin_view``
(login, staff, CSRF). Acting needs ``triage.act_on_deadletter`` on GET and POST alike (403
otherwise); the views parse the form, call one service and report with ``message_user``.
"""

from __future__ import annotations

import copy
import enum
import re
from datetime import timedelta

from django import forms
from django.contrib import messages
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import (
    ERROR_FLAG,
    ORDER_VAR,
    PAGE_VAR,
    ChangeListSearchForm,
)
from django.core.exceptions import PermissionDenied
from django.http import (
    Http404,
    HttpResponseBadRequest,
    HttpResponseNotAllowed,
    HttpResponseRedirect,
    QueryDict,
)
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from triage import bulk, charts, return_rates, selectors, services
from triage.exceptions import NoteRequired, TriageError
from triage.models import BulkTriageJob, DeadLetter, DeadLetterStatus, TriageActionKind

ACTION_TEXT = {
    TriageActionKind.REDRIVE: {
        "title": "Redrive",
        "verb": "redriven",
        "explain": (
            "The message is published again to the main FIFO queue: same message group (the "
            "payment), a new deduplication id. The worker applies it before any of the "
            "payment's parked messages."
        ),
    },
    TriageActionKind.RESOLVE: {
        "title": "Resolve",
        "verb": "resolved",
        "explain": (
            "The problem was fixed elsewhere. Nothing is published and nothing is applied for "
            "this message."
        ),
    },
    TriageActionKind.DISCARD: {
        "title": "Discard",
        "verb": "discarded",
        "explain": (
            "The message will never be applied. Its body and its whole history stay here for audit."
        ),
    },
}
RELEASE_EXPLAIN = (
    "When this is the payment's last open dead letter, its hold is released afterwards: the "
    "messages parked behind it are republished in their original order, behind this one."
)


def human_age(delta: timedelta | None) -> str:
    if delta is None:
        return "—"
    seconds = int(delta.total_seconds())
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


class NoteForm(forms.Form):
    note = forms.CharField(
        label="Note (required)",
        widget=forms.Textarea(attrs={"rows": 4, "cols": 80, "required": True}),
        strip=True,
        error_messages={"required": str(NoteRequired())},
        help_text="Why: the ticket, what you checked, what you decided. It goes in the audit log.",
    )


def _require_act(request, model_admin) -> None:
    if not model_admin.has_act_permission(request):
        raise PermissionDenied("Acting on dead letters needs the triage.act_on_deadletter right.")


def _change_url(dead_letter_id: int) -> str:
    return reverse("admin:triage_deadletter_change", args=[dead_letter_id])


def _report(request, model_admin, result: services.ActionResult, verb: str) -> None:
    dl = result.dead_letter
    text = f"Dead letter {dl.pk} {verb}."
    if dl.redrive_message_id:
        text += f" Published as message {dl.redrive_message_id}."
    model_admin.message_user(request, text, messages.SUCCESS)
    if result.released is not None:
        model_admin.message_user(
            request,
            f"Hold on payment {dl.group_id} released: {result.released} parked message(s) "
            "republished in their original order.",
            messages.SUCCESS,
        )
    elif result.release_failed:
        model_admin.message_user(request, result.release_note, messages.ERROR)
    elif result.release_note:
        model_admin.message_user(request, result.release_note, messages.INFO)


def _context(request, model_admin, **extra) -> dict:
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "app_label": model_admin.opts.app_label,
        **extra,
    }


def _action_parse(action: str) -> TriageActionKind:
    """The operator's decision named in the URL; 404 for anything else."""
    if action not in services.ACTIONS:
        raise Http404(f"unknown action {action!r}")
    return TriageActionKind(action)


def dead_letter_action(request, model_admin, *, object_id: int, action: str):
    """Confirm, then redrive / resolve / discard one dead letter."""
    action = _action_parse(action)
    _require_act(request, model_admin)
    dead_letter = DeadLetter.objects.filter(pk=object_id).first()
    if dead_letter is None:
        raise Http404(f"dead letter {object_id} does not exist")
    text = ACTION_TEXT[action]
    if dead_letter.status != DeadLetterStatus.OPEN:
        model_admin.message_user(
            request,
            f"Dead letter {dead_letter.pk} is {dead_letter.status}: only open dead letters can "
            f"be {text['verb']}.",
            messages.ERROR,
        )
        return HttpResponseRedirect(_change_url(dead_letter.pk))
    form = NoteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            result = services.ACTIONS[action](
                dead_letter=dead_letter, user=request.user, note=form.cleaned_data["note"]
            )
        except TriageError as exc:
            form.add_error(None, str(exc))
        else:
            _report(request, model_admin, result, text["verb"])
            return HttpResponseRedirect(_change_url(dead_letter.pk))
    story = selectors.dead_letter_story(dead_letter)
    return TemplateResponse(
        request,
        "admin/triage/deadletter/confirm_action.html",
        _context(
            request,
            model_admin,
            title=f"{text['title']} dead letter {dead_letter.pk}?",
            action=action,
            action_text=text,
            release_explain=RELEASE_EXPLAIN,
            dead_letters=[dead_letter],
            story=story,
            form=form,
            cancel_url=_change_url(dead_letter.pk),
            redrive_deduplication_id=services.redrive_deduplication_id(dead_letter),
            original=dead_letter,
        ),
    )


# Dead letter ids are PostgreSQL bigints: ASCII digits only (``str.isdigit`` also accepts "²"
# and other digits ``int()`` refuses), and no larger than the column holds.
_ID = re.compile(r"[0-9]{1,19}")
ID_MAX = 2**63 - 1


class BadIds(Exception):
    """A malformed id in an action URL: answered with 400 and the offending value."""


def _parse_ids(raw: str) -> list[int]:
    ids = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        if not _ID.fullmatch(part) or int(part) > ID_MAX:
            raise BadIds(f"{part[:40]!r} is not a dead letter id (ids are positive whole numbers)")
        ids.append(int(part))
    return ids


def object_id_parse(raw: str) -> int:
    """An id from a URL path; 404 for anything that cannot be a row's id."""
    if not _ID.fullmatch(raw) or int(raw) > ID_MAX:
        raise Http404(f"{raw[:40]!r} is not an id")
    return int(raw)


def _changelist_url(filters: str) -> str:
    """The dead-letter changelist with the operator's filters, where a bulk page returns."""
    changelist = reverse("admin:triage_deadletter_changelist")
    return f"{changelist}?{filters}" if filters else changelist


def dead_letters_bulk_action(request, model_admin, *, action: str):
    """Confirm, then apply one action to exactly the listed dead letters."""
    action = _action_parse(action)
    _require_act(request, model_admin)
    source = request.POST if request.method == "POST" else request.GET
    try:
        ids = _parse_ids(source.get("ids", ""))
    except BadIds as exc:
        return HttpResponseBadRequest(str(exc), content_type="text/plain; charset=utf-8")
    filters = source.get("_changelist_filters", "")
    back = _changelist_url(filters)
    if not ids:
        return HttpResponseBadRequest(
            "No dead letter ids were given (ids=1,2,3).", content_type="text/plain; charset=utf-8"
        )
    form = NoteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            result = services.dead_letters_act(
                action=action,
                dead_letter_ids=ids,
                user=request.user,
                note=form.cleaned_data["note"],
            )
        except TriageError as exc:
            form.add_error(None, str(exc))
        else:
            _bulk_result_report(request, model_admin, result, verb=ACTION_TEXT[action]["verb"])
            return HttpResponseRedirect(back)
    return _bulk_action_confirm(
        request, model_admin, action=action, ids=ids, form=form, filters=filters, back=back
    )


def _bulk_result_report(request, model_admin, result: services.BulkResult, *, verb: str) -> None:
    """Tell the operator what was done, which holds were released, and what was refused."""
    if result.done:
        model_admin.message_user(
            request, f"{len(result.done)} dead letter(s) {verb}.", messages.SUCCESS
        )
    released = [r for r in result.done if r.released is not None]
    if released:
        model_admin.message_user(
            request,
            f"{len(released)} payment hold(s) released, "
            f"{sum(r.released for r in released)} parked message(s) republished.",
            messages.SUCCESS,
        )
    for r in result.done:
        if r.release_failed:
            model_admin.message_user(request, r.release_note, messages.ERROR)
    for pk, reason in result.refused:
        model_admin.message_user(request, f"Dead letter {pk}: {reason}", messages.ERROR)


def _bulk_action_confirm(
    request, model_admin, *, action: str, ids: list[int], form, filters: str, back: str
):
    """The confirmation page listing exactly these dead letters (and which cannot be acted on)."""
    dead_letters = list(DeadLetter.objects.filter(pk__in=ids).order_by("ingested_at", "id"))
    if not dead_letters:
        raise Http404("none of these dead letters exists")
    text = ACTION_TEXT[action]
    return TemplateResponse(
        request,
        "admin/triage/deadletter/confirm_action.html",
        _context(
            request,
            model_admin,
            title=f"{text['title']} {len(dead_letters)} dead letter(s)?",
            action=action,
            action_text=text,
            release_explain=RELEASE_EXPLAIN,
            dead_letters=dead_letters,
            not_open=[d for d in dead_letters if d.status != DeadLetterStatus.OPEN],
            missing=sorted(set(ids) - {d.pk for d in dead_letters}),
            form=form,
            bulk=True,
            ids=",".join(str(i) for i in ids),
            changelist_filters=filters,
            cancel_url=back,
        ),
    )


class BulkAllForm(NoteForm):
    expected = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    max_id = forms.IntegerField(min_value=0, max_value=ID_MAX, widget=forms.HiddenInput)


def _filtered_queryset(request, model_admin, filters: str):
    """The changelist's queryset for this querystring: the same filters, search and permission
    scoping the operator saw, built by the admin's own ``ChangeList``."""
    params = QueryDict(filters, mutable=True)
    for key in (PAGE_VAR, ERROR_FLAG, ORDER_VAR):
        params.pop(key, None)
    # The changelist drops a search it cannot use (a NUL character, say) with a message and
    # lists everything; acting on everything instead of the search would be wrong: refuse it.
    search = ChangeListSearchForm(params)
    if not search.is_valid():
        problems = "; ".join(str(e) for errors in search.errors.values() for e in errors)
        raise IncorrectLookupParameters(f"the search cannot be used: {problems}")
    listing = copy.copy(request)
    listing.GET = params
    changelist = model_admin.get_changelist_instance(listing)
    return changelist.queryset, params.urlencode()


def dead_letters_bulk_all(request, model_admin, *, action: str):
    """Confirm, then start a background job acting on every open dead letter of the filter."""
    action = _action_parse(action)
    _require_act(request, model_admin)
    source = request.POST if request.method == "POST" else request.GET
    raw_filters = source.get("_changelist_filters", "")
    try:
        queryset, filters = _filtered_queryset(request, model_admin, raw_filters)
    except IncorrectLookupParameters as exc:
        return HttpResponseBadRequest(
            f"The filter cannot be applied: {exc or 'unknown or malformed filter parameter'}",
            content_type="text/plain; charset=utf-8",
        )
    back = _changelist_url(filters)
    form = BulkAllForm(request.POST or None)
    error = ""
    max_id = None
    if request.method == "POST" and form.is_valid():
        max_id = form.cleaned_data["max_id"]
        try:
            job = bulk.bulk_job_create(
                action=action,
                queryset=queryset,
                filters=filters,
                note=form.cleaned_data["note"],
                user=request.user,
                expected_total=form.cleaned_data["expected"],
                max_id=max_id,
            )
        except TriageError as exc:
            error = str(exc)
        else:
            return _bulk_job_started(request, model_admin, job, verb=ACTION_TEXT[action]["verb"])
    elif form.is_bound:
        # The note is missing: keep the boundary the operator was shown, when it came intact.
        max_id = form.cleaned_data.get("max_id")
    selection = bulk.bulk_selection(queryset=queryset, max_id=max_id)
    if selection.open_count == 0:
        model_admin.message_user(
            request, "No open dead letter matches this filter: nothing to do.", messages.WARNING
        )
        return HttpResponseRedirect(back)
    return _bulk_all_confirm(
        request,
        model_admin,
        action=action,
        queryset=queryset,
        selection=selection,
        form=form,
        error=error,
        filters=filters,
        back=back,
    )


def _bulk_job_started(request, model_admin, job: BulkTriageJob, *, verb: str):
    model_admin.message_user(
        request,
        f"Bulk job {job.pk} started: {job.total} dead letter(s) to be {verb} in "
        "the background. Follow it here.",
        messages.SUCCESS,
    )
    return HttpResponseRedirect(reverse("admin:triage_bulktriagejob_change", args=[job.pk]))


def _bulk_all_confirm(
    request,
    model_admin,
    *,
    action: str,
    queryset,
    selection: bulk.Selection,
    form: BulkAllForm,
    error: str,
    filters: str,
    back: str,
):
    """The confirmation page: how many open dead letters the job would act on, a sample of them,
    and the boundary (count and highest id) the operator confirms."""
    text = ACTION_TEXT[action]
    shown = BulkAllForm(
        initial={
            "note": request.POST.get("note", ""),
            "expected": selection.open_count,
            "max_id": selection.max_id,
        }
    )
    sample = list(
        queryset.order_by("ingested_at", "id").filter(
            status=DeadLetterStatus.OPEN, pk__lte=selection.max_id
        )[:20]
    )
    return TemplateResponse(
        request,
        "admin/triage/deadletter/confirm_bulk_all.html",
        _context(
            request,
            model_admin,
            title=f"{text['title']} all {selection.open_count} open dead letter(s) matching "
            "this filter?",
            action=action,
            action_text=text,
            release_explain=RELEASE_EXPLAIN,
            selection=selection,
            sample=sample,
            form=shown,
            note_errors=form.errors.get("note") if form.is_bound else None,
            error=error,
            changelist_filters=filters,
            cancel_url=back,
            rate=bulk.bulk_rate_per_second(),
        ),
    )


class BulkJobOperation(enum.StrEnum):
    """What an operator can do to a bulk job from its page."""

    CANCEL = "cancel"
    RESUME = "resume"


def bulk_job_control(request, model_admin, *, object_id: str, operation: BulkJobOperation):
    """POST only: cancel or resume a bulk job."""
    if request.method != "POST":
        return HttpResponseNotAllowed(["POST"])
    if not request.user.has_perm(services.ACT_PERMISSION):
        raise PermissionDenied("Controlling bulk jobs needs the triage.act_on_deadletter right.")
    job = BulkTriageJob.objects.filter(pk=object_id_parse(object_id)).first()
    if job is None:
        raise Http404(f"bulk job {object_id} does not exist")
    try:
        if operation == BulkJobOperation.CANCEL:
            bulk.bulk_job_cancel(job=job, user=request.user)
            text = (
                f"Bulk job {job.pk} cancelled: it stops before its next batch. "
                "What it did stays done."
            )
        else:
            bulk.bulk_job_resume(job=job, user=request.user)
            text = f"Bulk job {job.pk} resumed: it continues where it stopped."
    except TriageError as exc:
        model_admin.message_user(request, str(exc), messages.ERROR)
    else:
        model_admin.message_user(request, text, messages.SUCCESS)
    return HttpResponseRedirect(reverse("admin:triage_bulktriagejob_change", args=[job.pk]))


def dead_letter_hold_release(request, model_admin, *, object_id: int):
    """Confirm, then release the payment's hold from a closed dead letter."""
    _require_act(request, model_admin)
    dead_letter = DeadLetter.objects.filter(pk=object_id).first()
    if dead_letter is None:
        raise Http404(f"dead letter {object_id} does not exist")
    form = NoteForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            sent = services.dead_letter_hold_release(
                dead_letter=dead_letter, user=request.user, note=form.cleaned_data["note"]
            )
        except TriageError as exc:
            form.add_error(None, str(exc))
        else:
            model_admin.message_user(
                request,
                f"Hold on payment {dead_letter.group_id} released: {sent} parked message(s) "
                "republished in their original order.",
                messages.SUCCESS,
            )
            return HttpResponseRedirect(_change_url(dead_letter.pk))
    story = selectors.dead_letter_story(dead_letter)
    return TemplateResponse(
        request,
        "admin/triage/deadletter/confirm_release.html",
        _context(
            request,
            model_admin,
            title=f"Release the hold on payment {dead_letter.group_id}?",
            dead_letter=dead_letter,
            story=story,
            form=form,
            cancel_url=_change_url(dead_letter.pk),
            original=dead_letter,
        ),
    )


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
        _context(
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
            breaker=breaker,
            breaker_open_for=human_age(breaker.open_for),
            breaker_next_probe=human_age(breaker.next_probe_in),
            breaker_paused_for=human_age(breaker.paused_for),
        ),
    )
