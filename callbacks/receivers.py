"""Receivers of the payments app's signals, connected in ``CallbacksConfig.ready()``."""

import logging

from django.db import DatabaseError, connection

from callbacks import conf
from callbacks.outbox import outbox_relay_publish_ids
from callbacks.outbox_after_commit import publisher

logger = logging.getLogger(__name__)


def publish_committed_outbox(sender, message_ids, **kwargs) -> None:
    """Publish outbox rows right after their transaction committed (best effort).

    On PostgreSQL the rows go to this process's publisher thread
    (``callbacks.outbox_after_commit``), which publishes the rows of many commits with one
    claim; with ``OUTBOX_PUBLISH_LINGER_SECONDS = 0``, or on a database without advisory locks,
    they are published here. Queue failures are recorded on the rows by the publisher; a
    database error is only logged. Either way the rows stay unpublished and the relay publishes
    them later.
    """
    if conf.OUTBOX_PUBLISH_LINGER_SECONDS > 0 and connection.vendor == "postgresql":
        publisher().submit(message_ids)
        return
    try:
        outbox_relay_publish_ids(message_ids)
    except DatabaseError as exc:
        logger.warning(
            "publishing outbox rows %s after commit failed, left for the relay: %s",
            message_ids,
            exc,
            extra={"outbox_ids": list(message_ids), "outcome": "left_for_relay"},
        )
