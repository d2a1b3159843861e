"""The Celery peer: what a Django team writes today instead of this module, measured beside it.

A callback view verifies the signature, validates the body and publishes one Celery task per
callback on kombu's SQS transport (``views``); a Celery worker, its default prefork pool with
concurrency 2, applies the event with the ORM in ``transaction.atomic()`` and
``select_for_update()`` (``tasks``). Written as the Celery and Django documentation show it, so
the comparison is with the real alternative, not a strawman. Run the worker with
``celery -A bench.peer worker --concurrency 2``.
"""

# The line the worker logs once it consumes (bench.peer.celery), which the benchmark waits for.
READY_LINE = "peer worker ready"
