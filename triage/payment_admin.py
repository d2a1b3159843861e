"""The payment's admin page with the operator's actions on it: the dishonor of its return.

The payments app registers a read-only payment admin; the operator's actions need the triage
right and live in triage (dependencies point triage -> payments), so triage registers the same
admin again with its pages added, as a host extends any app's admin. Without triage installed
the payment page stays read-only.
"""

from django.contrib import admin
from django.urls import path, reverse

from payments.admin import PaymentAdmin
from payments.models import Payment, PaymentState, ReturnDishonor
from payments.services.remedies import return_reinitiation
from triage.services import ACT_PERMISSION
from triage.views import dishonors as dishonor_views


class PaymentTriageAdmin(PaymentAdmin):
    change_form_template = "admin/triage/payment/change_form.html"

    def get_urls(self):
        wrap = self.admin_site.admin_view
        info = f"{self.opts.app_label}_{self.opts.model_name}"
        return [
            path(
                "<uuid:object_id>/dishonor/",
                wrap(self._dishonor_view),
                name=f"{info}_dishonor",
            ),
            *super().get_urls(),
        ]

    def _dishonor_view(self, request, object_id):
        return dishonor_views.payment_dishonor(request, self, object_id=object_id)

    def change_view(self, request, object_id, form_url="", extra_context=None):
        extra_context = extra_context or {}
        payment = self.get_object(request, object_id)
        if (
            payment is not None
            and payment.state == PaymentState.RETURNED
            and request.user.has_perm(ACT_PERMISSION)
        ):
            dishonor = ReturnDishonor.objects.filter(payment=payment).first()
            # A reinitiated return has its remedy (payments.services.remedies): no dishonor.
            open_ = dishonor is None or dishonor.request_status in ("requested", "failed")
            if open_ and return_reinitiation(payment) is None:
                extra_context["dishonor_url"] = reverse(
                    "admin:payments_payment_dishonor", args=[payment.pk]
                )
        return super().change_view(request, object_id, form_url, extra_context)


admin.site.unregister(Payment)
admin.site.register(Payment, PaymentTriageAdmin)
