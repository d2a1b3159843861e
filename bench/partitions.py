"""The partitioning experiment: the same queue-message records in a plain table and in one
partitioned by day, purged by batched DELETE and by detaching and dropping whole partitions."""

import time
from datetime import UTC, datetime, timedelta

import psycopg


def partition_experiment(db_url: str, rows: int) -> dict:
    """Copy ``rows`` queue-message records (the preloaded ones, oldest first) into a plain table
    and a table partitioned by day of ``first_started_at``, both with the product's indexes; then
    remove everything past QUEUE_MESSAGE_RETENTION from each: the plain one by the purge's
    batched DELETE (1000 ids a transaction), the partitioned one by detaching and dropping the
    partitions wholly past it. Reports both rates and the plain table's VACUUM afterwards."""
    from callbacks import conf as callbacks_conf

    cutoff = datetime.now(UTC) - callbacks_conf.QUEUE_MESSAGE_RETENTION
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_qm_plain, bench_qm_parted")
        conn.execute("CREATE TABLE bench_qm_plain (LIKE callbacks_queuemessage INCLUDING ALL)")
        conn.execute(
            "INSERT INTO bench_qm_plain SELECT * FROM callbacks_queuemessage ORDER BY id LIMIT %s",
            (rows,),
        )
        first, last = conn.execute(
            "SELECT min(first_started_at), max(first_started_at) FROM bench_qm_plain"
        ).fetchone()
        _parted_create(conn, first, last)
        conn.execute("INSERT INTO bench_qm_parted SELECT * FROM bench_qm_plain")
        conn.execute("VACUUM (ANALYZE) bench_qm_plain")
        conn.execute("VACUUM (ANALYZE) bench_qm_parted")
        plain = _plain_purge(conn, cutoff)
        parted = _parted_purge(conn, cutoff)
        conn.execute("DROP TABLE bench_qm_plain, bench_qm_parted")
    return {
        "rows_copied": rows,
        "cutoff": cutoff.isoformat(),
        "plain": plain,
        "partitioned": parted,
    }


def _parted_create(conn: psycopg.Connection, first: datetime, last: datetime) -> None:
    conn.execute(
        "CREATE TABLE bench_qm_parted (LIKE callbacks_queuemessage INCLUDING DEFAULTS) "
        "PARTITION BY RANGE (first_started_at)"
    )
    # By first_started_at, which is never empty (finished_at is, while a message runs). A unique
    # key must hold the partition key: message_id alone cannot be unique across partitions.
    conn.execute("ALTER TABLE bench_qm_parted ADD PRIMARY KEY (id, first_started_at)")
    conn.execute("CREATE UNIQUE INDEX ON bench_qm_parted (message_id, first_started_at)")
    for columns in (
        "status, enqueued_at",
        "group_id, status",
        "group_id, sequence_number",
        "payment_id",
    ):
        conn.execute(f"CREATE INDEX ON bench_qm_parted ({columns})")
    day = datetime(first.year, first.month, first.day, tzinfo=UTC)
    while day <= last:
        after = day + timedelta(days=1)
        conn.execute(
            f"CREATE TABLE bench_qm_p{day:%Y%m%d} PARTITION OF bench_qm_parted "
            f"FOR VALUES FROM ('{day.isoformat()}') TO ('{after.isoformat()}')"
        )
        day = after
    # No DEFAULT partition: it would forbid DETACH ... CONCURRENTLY. Production would create
    # each day's partition ahead of time instead.


def _plain_purge(conn: psycopg.Connection, cutoff: datetime) -> dict:
    began, deleted = time.time(), 0
    while True:
        n = conn.execute(
            "DELETE FROM bench_qm_plain WHERE id IN (SELECT id FROM bench_qm_plain "
            "WHERE finished_at < %s ORDER BY id LIMIT 1000)",
            (cutoff,),
        ).rowcount
        deleted += n
        if n < 1000:
            break
    seconds = time.time() - began
    began = time.time()
    conn.execute("VACUUM bench_qm_plain")
    return {
        "rows": deleted,
        "seconds": round(seconds, 2),
        "rows_per_second": round(deleted / seconds) if seconds else None,
        "vacuum_seconds": round(time.time() - began, 2),
    }


def _parted_purge(conn: psycopg.Connection, cutoff: datetime) -> dict:
    partitions = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = 'bench_qm_parted'::regclass "
        "ORDER BY c.relname"
    ).fetchall()
    # Which partitions lie wholly past the cutoff, and their rows, counted for the report before
    # the clock starts (a real purge knows by the partitions' bounds alone).
    expired = []
    for name, _bound in partitions:
        newest, rows = conn.execute(
            f"SELECT max(finished_at), count(*) FROM {name}"  # noqa: S608
        ).fetchone()
        if newest is not None and newest < cutoff:
            expired.append((name, rows))
    began = time.time()
    for name, _ in expired:
        conn.execute(f"ALTER TABLE bench_qm_parted DETACH PARTITION {name} CONCURRENTLY")
        conn.execute(f"DROP TABLE {name}")
    deleted, dropped = sum(rows for _, rows in expired), len(expired)
    seconds = time.time() - began
    return {
        "rows": deleted,
        "partitions_dropped": dropped,
        "seconds": round(seconds, 2),
        "rows_per_second": round(deleted / seconds) if seconds else None,
    }
