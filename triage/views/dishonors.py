"""The operator's dishonor of a payment's return, from the payment's admin page.

Wired through the triage app's payment admin (``triage.admin.PaymentTriageAdmin.get_urls``),
wrapped in ``admin_site.admin_view`` (login, staff, CSRF). Acting needs the triage right,
``triage.act_on_deadletter``, on GET and POST alike (403 otherwise). The view parses the form,
calls one service (``payments.services.dishonors``) and reports with ``message_user``; a
refusal is shown on the form naming the rule, a processor that did not take the request is
shown as an error with the attempt recorded on the payment.
"""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import Http404, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import reverse

from payments.admin_base import note_field
from payments.exceptions import DishonorRefused, PaymentNotFound
from payments.models import DishonorRequestStatus, Payment, PaymentReturn, ReturnDishonor
from payments.return_codes import DISHONOR_CODES, dishonor_deadline, return_code_label
from payments.services.dishonors import (
    DishonorResult,
    return_dishonor_request,
    return_dishonor_resend,
)
from triage.services import ACT_PERMISSION
from triage.views.common import admin_context

PERMISSION_MESSAGE = (
    "Asking for a dishonor needs the triage right triage.act_on_deadletter: viewing the "
    "payment is allowed, acting is not."
)


class DishonorForm(forms.Form):
    reason_code = forms.ChoiceField(
        label="Reason code",
        choices=[("", "—")] + [(code, return_code_label(code)) for code in DISHONOR_CODES],
        help_text="R68 (untimely) only for a return flagged late.",
    )
    note = note_field(
        "Why the return is wrong: the ticket, what you checked. It stays with the request.",
        required_message="A dishonor request needs a note: why the return is wrong.",
    )


def _change_url(payment_id) -> str:
    return reverse("admin:payments_payment_change", args=[payment_id])


def _report(request, model_admin, result: DishonorResult) -> None:
    dishonor = result.dishonor
    if result.sent:
        model_admin.message_user(
            request,
            f"Dishonor {dishonor.reason_code} of the return of payment {dishonor.payment_id} "
            "sent to the processor; its answer comes as a callback.",
            messages.SUCCESS,
        )
        return
    model_admin.message_user(
        request,
        f"The processor did not take the dishonor request for payment {dishonor.payment_id}: "
        f"{result.error}. The request is kept as failed, with its attempt on this page; send "
        "it again from the dishonor page.",
        messages.ERROR,
    )


def payment_dishonor(request, model_admin, *, object_id: str):
    """Show the return and the dishonor rules; on POST ask for the dishonor or send a failed
    request again."""
    if not request.user.has_perm(ACT_PERMISSION):
        raise PermissionDenied(PERMISSION_MESSAGE)
    payment = Payment.objects.filter(pk=object_id).first()
    if payment is None:
        raise Http404(f"payment {object_id} does not exist")
    ach_return = PaymentReturn.objects.filter(payment=payment).first()
    dishonor = ReturnDishonor.objects.filter(payment=payment).first()
    form = DishonorForm(request.POST or None)
    error = ""
    if request.method == "POST":
        try:
            if "resend" in request.POST:
                _report(request, model_admin, return_dishonor_resend(payment_id=payment.pk))
                return HttpResponseRedirect(_change_url(payment.pk))
            if form.is_valid():
                result = return_dishonor_request(
                    payment_id=payment.pk,
                    reason_code=form.cleaned_data["reason_code"],
                    note=form.cleaned_data["note"],
                    user=request.user,
                )
                _report(request, model_admin, result)
                return HttpResponseRedirect(_change_url(payment.pk))
        except (DishonorRefused, PaymentNotFound) as exc:
            error = str(exc)
            form.add_error(None, error)
    resendable = dishonor is not None and dishonor.request_status in (
        DishonorRequestStatus.REQUESTED,
        DishonorRequestStatus.FAILED,
    )
    return TemplateResponse(
        request,
        "admin/triage/payment/dishonor.html",
        admin_context(
            request,
            model_admin,
            title=f"Dishonor the return of payment {payment.pk}?",
            payment=payment,
            ach_return=ach_return,
            return_label=return_code_label(ach_return.reason_code) if ach_return else "",
            deadline=dishonor_deadline(ach_return.returned_at) if ach_return else None,
            dishonor=dishonor,
            resendable=resendable,
            form=form,
            error=error,
            cancel_url=_change_url(payment.pk),
            original=payment,
        ),
        status=400 if error else 200,
    )
