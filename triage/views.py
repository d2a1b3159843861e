"""Admin pages of triage: action confirmations (single, bulk, hold release) and the dashboard.

Each view is wired through ``DeadLetterAdmin.get_urls()`` and wrapped in ``admin_site.admin_view``
(login, staff, CSRF). Acting needs ``triage.act_on_deadletter`` on GET and POST alike (403
otherwise); the views parse the form, call one service and report with ``message_user``.
"""

from __future__ import annotations

from datetime import timedelta

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse
from django.utils import timezone

from triage import charts, selectors, services
from triage.exceptions import NoteRequired, TriageError
from triage.models import DeadLetter, DeadLetterStatus

ACTION_TEXT = {
    "redrive": {
        "title": "Redrive",
        "verb": "redriven",
        "explain": (
            "The message is published again to the main FIFO queue: same message group (the "
            "payment), a new deduplication id. The worker applies it before any of the "
            "payment's parked messages."
        ),
    },
    "resolve": {
        "title": "Resolve",
        "verb": "resolved",
        "explain": (
            "The problem was fixed elsewhere. Nothing is published and nothing is applied for "
            "this message."
        ),
    },
    "discard": {
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


def dead_letter_action(request, model_admin, *, object_id: int, action: str):
    """Confirm, then redrive / resolve / discard one dead letter."""
    if action not in services.ACTIONS:
        raise Http404(f"unknown action {action!r}")
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


def _parse_ids(raw: str) -> list[int]:
    ids = []
    for part in raw.split(","):
        part = part.strip()
        if not part:
            continue
        if not part.isdigit():
            raise Http404(f"{part!r} is not a dead letter id")
        ids.append(int(part))
    return ids


def dead_letters_bulk_action(request, model_admin, *, action: str):
    """Confirm, then apply one action to exactly the listed dead letters."""
    if action not in services.ACTIONS:
        raise Http404(f"unknown action {action!r}")
    _require_act(request, model_admin)
    source = request.POST if request.method == "POST" else request.GET
    ids = _parse_ids(source.get("ids", ""))
    filters = source.get("_changelist_filters", "")
    changelist = reverse("admin:triage_deadletter_changelist")
    back = f"{changelist}?{filters}" if filters else changelist
    if not ids:
        model_admin.message_user(request, "No dead letters were selected.", messages.WARNING)
        return HttpResponseRedirect(back)
    text = ACTION_TEXT[action]
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
            if result.done:
                model_admin.message_user(
                    request, f"{len(result.done)} dead letter(s) {text['verb']}.", messages.SUCCESS
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
            return HttpResponseRedirect(back)
    dead_letters = list(DeadLetter.objects.filter(pk__in=ids).order_by("ingested_at", "id"))
    missing = sorted(set(ids) - {d.pk for d in dead_letters})
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
            missing=missing,
            form=form,
            bulk=True,
            ids=",".join(str(i) for i in ids),
            changelist_filters=filters,
            cancel_url=back,
        ),
    )


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
            breaker=breaker,
            breaker_open_for=human_age(breaker.open_for),
            breaker_next_probe=human_age(breaker.next_probe_in),
            breaker_paused_for=human_age(breaker.paused_for),
        ),
    )
