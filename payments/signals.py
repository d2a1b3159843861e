"""Signals the payments app sends; other apps (the queue layer) connect to them.

``outbox_committed`` is sent after the transaction that wrote outbox rows has committed, with
``message_ids``: a publisher may send them at once instead of waiting for the relay's next poll.
"""

from django.dispatch import Signal

outbox_committed = Signal()

# Sent by ``payments.alerts.alert_raise`` with ``severity``, ``key``, ``summary``, ``details`` and
# ``payment_id``; the operations layer routes alerts to sinks and stores their history.
alert_raised = Signal()

# The host application's hooks on money moving. Both are sent with ``payment``, ``from_state``,
# ``to_state`` and ``event`` (the ``PaymentEvent`` row that records the transition: its kind,
# event type, processor event id and payload), sender ``Payment``.
#
# ``payment_transitioned`` is sent inside the transaction that makes the transition, with the
# payment's row lock held. A receiver's own writes commit or roll back with the transition, so
# they happen exactly once however often the event is delivered. A receiver that raises rolls
# the transition back; the message is retried like any other failure. Keep receivers short and
# free of network calls: the row lock is held while they run.
payment_transitioned = Signal()

# ``payment_transition_committed`` is sent after that transaction has committed (on_commit), for
# side effects outside the database (an e-mail, a webhook). It is never sent for a rolled-back
# transition, and at most once per transition: a crash between the commit and the send loses
# it. Anything that must not be lost belongs in a ``payment_transitioned`` receiver (an outbox
# row of the host's own). Receivers' exceptions are logged, never raised.
payment_transition_committed = Signal()

# ``payment_dishonor_booked`` is sent inside the transaction that records a processor's answer
# to a dishonor (``return_dishonored``, ``dishonor_contested``), with the payment's row lock
# held, sender ``Payment``, with ``payment``, ``event`` (its ``PaymentEvent`` row), ``dishonor``
# (the ``ReturnDishonor``) and ``entries`` (the ``LedgerEntry`` rows it wrote: a re-credit, its
# reversal, both, or none when a contest came first). These answers move money without a
# transition, so ``payment_transitioned`` is not sent for them. As with it, a receiver's writes
# happen exactly once and a receiver that raises rolls the answer back.
payment_dishonor_booked = Signal()

# Sent by ``payments.alerts.alert_clear`` with ``key`` and ``reason`` when the condition behind
# an alert has ended (the processor breaker closed).
alert_cleared = Signal()
