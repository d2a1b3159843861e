"""The bulk confirmation pages: one action on exactly the listed dead letters, a background job
on every open dead letter of the changelist's filter, and cancelling or resuming that job.

Wired and guarded as the single dead-letter pages are (``triage.views.dead_letters``): through
``get_urls()``, ``admin_site.admin_view`` and the ``triage.act_on_deadletter`` right.
"""

from __future__ import annotations

import copy
import enum

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

from triage import bulk, services
from triage.exceptions import TriageError
from triage.models import BulkTriageJob, DeadLetter, DeadLetterStatus
from triage.views.common import (
    ACTION_TEXT,
    ID_MAX,
    ID_PATTERN,
    RELEASE_EXPLAIN,
    NoteForm,
    action_parse,
    admin_context,
    object_id_parse,
    require_act,
)


class BadIds(Exception):
    """A malformed id in an action URL: answered with 400 and the offending value."""


def _parse_ids(raw: str) -> list[int]:
    ids = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        if not ID_PATTERN.fullmatch(part) or int(part) > ID_MAX:
            raise BadIds(f"{part[:40]!r} is not a dead letter id (ids are positive whole numbers)")
        ids.append(int(part))
    return ids


def _changelist_url(filters: str) -> str:
    """The dead-letter changelist with the operator's filters, where a bulk page returns."""
    changelist = reverse("admin:triage_deadletter_changelist")
    return f"{changelist}?{filters}" if filters else changelist


def dead_letters_bulk_action(request, model_admin, *, action: str):
    """Confirm, then apply one action to exactly the listed dead letters."""
    action = action_parse(action)
    require_act(request, model_admin)
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
        admin_context(
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
    action = action_parse(action)
    require_act(request, model_admin)
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
        admin_context(
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
