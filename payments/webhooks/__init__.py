"""Events and signed webhooks: what happened to a merchant's money, listed by ``GET
/api/events/`` and pushed to the merchant's endpoints as Standard Webhooks.

An event row is written in the transaction of what it reports (``events.event_record``);
``delivery.events_dispatch`` numbers committed events in commit order and fans them out to
endpoints; ``delivery.delivery_attempt`` sends one delivery, outside any transaction.
"""
