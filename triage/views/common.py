"""What every triage admin page shares: the wording of each action, the note form, the act
permission, the admin's page context and the parsing of ids from URLs."""

from __future__ import annotations

import re

from django import forms
from django.core.exceptions import PermissionDenied
from django.http import Http404

from payments.admin_base import note_field
from triage import services
from triage.exceptions import NoteRequired
from triage.models import TriageActionKind

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


class NoteForm(forms.Form):
    note = note_field(
        "Why: the ticket, what you checked, what you decided. It goes in the audit log.",
        required_message=str(NoteRequired()),
    )


def require_act(request, model_admin) -> None:
    if not model_admin.has_act_permission(request):
        raise PermissionDenied("Acting on dead letters needs the triage.act_on_deadletter right.")


def admin_context(request, model_admin, **extra) -> dict:
    """The admin's own page context (site header, permissions, breadcrumbs), plus ``extra``."""
    return {
        **model_admin.admin_site.each_context(request),
        "opts": model_admin.opts,
        "app_label": model_admin.opts.app_label,
        **extra,
    }


def action_parse(action: str) -> TriageActionKind:
    """The operator's decision named in the URL; 404 for anything else."""
    if action not in services.ACTIONS:
        raise Http404(f"unknown action {action!r}")
    return TriageActionKind(action)


# Dead letter ids are PostgreSQL bigints: ASCII digits only (``str.isdigit`` also accepts "²"
# and other digits ``int()`` refuses), and no larger than the column holds.
ID_PATTERN = re.compile(r"[0-9]{1,19}")
ID_MAX = 2**63 - 1


def object_id_parse(raw: str) -> int:
    """An id from a URL path; 404 for anything that cannot be a row's id."""
    if not ID_PATTERN.fullmatch(raw) or int(raw) > ID_MAX:
        raise Http404(f"{raw[:40]!r} is not an id")
    return int(raw)
