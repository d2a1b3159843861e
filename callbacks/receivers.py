"""Receivers of the payments app's signals, connected in ``CallbacksConfig.ready()``."""

import logging

from django.db import DatabaseError

from callbacks.outbox import outbox_relay_publish_ids

logger = logging.getLogger(__name__)


def publish_committed_outbox(sender, message_ids, **kwargs) -> None:
    """Publish outbox rows right after their transaction committed (best effort).

    Queue failures are recorded on the rows by the publisher; a database error here is only
    logged. Either way the rows stay unpublished and the relay publishes them later.
    """
    try:
        outbox_relay_publish_ids(message_ids)
    except DatabaseError as exc:
        logger.warning(
            "publishing outbox rows %s after commit failed, left for the relay: %s",
            message_ids,
            exc,
            extra={"outbox_ids": list(message_ids), "outcome": "left_for_relay"},
        )
