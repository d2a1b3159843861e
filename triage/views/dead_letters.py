"""The confirmation pages for one dead letter: redrive, resolve or discard it, and release its
payment's hold.

Each view is wired through ``DeadLetterAdmin.get_urls()`` and wrapped in ``admin_site.admin_view``
(login, staff, CSRF). Acting needs ``triage.act_on_deadletter`` on GET and POST alike (403
otherwise); the views parse the form, call one service and report with ``message_user``.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from triage import selectors, services
from triage.exceptions import TriageError
from triage.models import DeadLetter, DeadLetterStatus
from triage.views.common import (
    ACTION_TEXT,
    RELEASE_EXPLAIN,
    NoteForm,
    action_parse,
    admin_context,
    require_act,
)


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


def dead_letter_action(request, model_admin, *, object_id: int, action: str):
    """Confirm, then redrive / resolve / discard one dead letter."""
    action = action_parse(action)
    require_act(request, model_admin)
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
        admin_context(
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


def dead_letter_hold_release(request, model_admin, *, object_id: int):
    """Confirm, then release the payment's hold from a closed dead letter."""
    require_act(request, model_admin)
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
        admin_context(
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
