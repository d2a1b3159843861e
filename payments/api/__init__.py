"""The payments API, one module per resource: its views, serializers and schema side by side
(``payments``, ``reinitiations``, ``refunds``, ``payouts``, ``balances``, ``limits``,
``accounts``), on one base for a create with an ``Idempotency-Key`` and one for reads scoped to
the caller's merchants (``base``), in one error envelope (``errors``). ``payments.urls`` routes
them; a host includes that."""
