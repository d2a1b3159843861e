"""Signals the payments app sends; other apps (the queue layer) connect to them.

``outbox_committed`` is sent after the transaction that wrote outbox rows has committed, with
``message_ids``: a publisher may send them at once instead of waiting for the relay's next poll.
"""

from django.dispatch import Signal

outbox_committed = Signal()

# Sent by ``payments.alerts.alert_raise`` with ``severity``, ``key``, ``summary``, ``details`` and
# ``payment_id``; the operations layer routes alerts to sinks and stores their history.
alert_raised = Signal()

# Sent by ``payments.alerts.alert_clear`` with ``key`` and ``reason`` when the condition behind
# an alert has ended (the processor breaker closed).
alert_cleared = Signal()
