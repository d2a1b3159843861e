"""Text from outside (a processor's reason code, a message) reaches people escaped for each
sink and bounded: it cannot mention a channel, plant a link, add a line or inject a header."""

import pytest

from payments.models import PaymentState
from payments.services import payment_apply_event
from tests.factories import PaymentFactory, processor_event
from tests.triage.test_alerting import AFTER_WINDOW, webhook  # noqa: F401 - the receiver fixture
from triage.models import AlertNotification
from triage.operations.alerting import alert_fire

HOSTILE = "<!channel> <https://evil.example/|Open triage> & more"


@pytest.fixture(autouse=True)
def alert_settings(settings, module_settings):
    module_settings.SETTLEMENT_WINDOW = ""
    settings.ADMINS = [("Ops", "ops@example.com")]


@pytest.mark.django_db(transaction=True)
def test_a_processors_reason_code_reaches_the_webhook_escaped(webhook):  # noqa: F811
    payment = PaymentFactory(state=PaymentState.CONFIRMED)
    event = processor_event(payment, "returned", reason_code=HOSTILE, message="x\n*bold*")

    payment_apply_event(event=event)

    [posted] = [b["body"] for b in webhook.bodies if "return_unknown_code" in b["body"]["text"]]
    raw = str(posted)
    assert "<!channel>" not in raw and "<https://" not in raw and "|Open triage>" not in raw
    assert (
        "&lt;!channel&gt; &lt;https://evil.example/|Open triage&gt; &amp; more" in (posted["text"])
    )
    assert posted["attachments"][0]["fallback"] == posted["text"]


@pytest.mark.django_db
def test_every_outside_value_is_bounded_in_the_webhook(webhook):  # noqa: F811
    alert_fire(
        key="payment.return_unknown_code:" + "k" * 220,
        severity="medium",
        summary="unknown reason " + "<" * 5000,
        now=AFTER_WINDOW,
    )
    [posted] = webhook.bodies
    assert len(posted["body"]["text"]) < 200 + 500 * len("&lt;") + 50
    assert posted["body"]["text"].endswith("…")
    key = {f["title"]: f["value"] for f in posted["body"]["attachments"][0]["fields"]}["Key"]
    assert len(key) == 200 and key.endswith("…")


@pytest.mark.django_db
def test_the_email_subject_is_one_line_and_the_body_cannot_forge_a_detail(mailoutbox):
    alert_fire(
        key="queue.dead_letter:m1",
        severity="high",
        summary="dead letter\r\nBcc: victim@example.com\u2028next",
        details={"reason": "bad\nseverity: low", "note": "\x1b[31mred\x85", "n": 3},
        now=AFTER_WINDOW,
    )

    [mail] = mailoutbox
    assert "\n" not in mail.subject and "\r" not in mail.subject
    assert "\\r\\nBcc: victim@example.com\\u2028next" in mail.subject
    assert mail.bcc == [] and mail.to == ["ops@example.com"]
    lines = mail.body.splitlines()
    assert 'reason: "bad\\nseverity: low"' in lines
    assert 'note: "\\x1b[31mred\\x85"' in lines
    assert "n: 3" in lines
    assert not any(line.startswith("severity:") for line in lines)
    assert AlertNotification.objects.get(sink="email").ok


@pytest.mark.django_db
def test_a_flood_of_details_is_cut_in_the_email(mailoutbox):
    alert_fire(
        key="queue.dead_letter:m2",
        severity="high",
        summary="s",
        details={f"d{i:03}": "v" * 1000 for i in range(100)},
        now=AFTER_WINDOW,
    )
    [mail] = mailoutbox
    assert len(mail.body) < 20 * 280
    assert "... and 81 more details, in the admin" in mail.body
