"""Idempotency-Key semantics for POST requests, as in the IETF Idempotency-Key draft.

Same key + same body: the stored first answer. Same key + other body: 422. Same key while the
first request still runs: 409. Only a request that began to execute stores its answer (as
Stripe does): a refusal before that (validation, permission) releases the key, so the client's
corrected or later-authorised retry with the same key executes instead of replaying the refusal.
On PostgreSQL the key is claimed by the first statement of the work's transaction: one
statement takes a transaction-level advisory lock on the user's key (``pg_try_advisory_xact_lock``,
never waiting) and inserts the key's row. A concurrent request with the key finds the lock held
and answers 409 at once, however long the first one runs, so a live request is never taken over
and its work never done twice; the work, its answer and the key's row commit together, so a
crash leaves either all of them or none (nothing to take over). Elsewhere (SQLite, the one-machine
quick start) the key row is committed on its own first, so a concurrent request sees it, and the
work's transaction then locks it until its commit. A key left in flight that way by a crashed
request (its row unlocked, its answer never stored) is taken over after
``PAYMENTS["API_IDEMPOTENCY_LEASE"]``.
"""

import enum
import functools
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass

from django.db import DatabaseError, IntegrityError, OperationalError, connection, transaction
from django.utils import timezone

from payments import conf
from payments.models import ApiIdempotencyKey


class IdempotentOutcome(enum.StrEnum):
    ANSWERED = "answered"  # the request ran now; its answer is stored under the key, if any
    REPLAYED = "replay"  # same key, same body: the stored first answer
    MISMATCH = "mismatch"  # same key, another body
    IN_FLIGHT = "in_flight"  # same key while the first request still runs


@dataclass(frozen=True)
class Replay:
    status: int
    body: dict | None
    reason: IdempotentOutcome  # replay, mismatch or in_flight


@dataclass(frozen=True)
class Answer:
    """What a request answered: an HTTP status and its JSON body, as stored under the key.

    ``store=False`` for a refusal before the request began to execute: nothing was done, so
    nothing is bound to the key.
    """

    status: int
    body: dict
    store: bool = True


@dataclass(frozen=True)
class IdempotentResult:
    outcome: IdempotentOutcome
    answer: Answer | None  # None when the outcome is mismatch or in_flight


def request_fingerprint(data: object) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def idempotency_key_run(
    *, user, key: str | None, request_data: object, work: Callable[[], Answer]
) -> IdempotentResult:
    """Run ``work`` at most once per user and ``key``, or say what to answer instead.

    With a key: claim it (committed on its own), then run ``work`` and store its answer in one
    transaction; if ``work`` raises or refuses before executing (``Answer.store`` false), the
    claim is released so the client may retry with the key.
    Without one, ``work`` just runs in a transaction.
    """
    if key is not None and connection.vendor == "postgresql":
        return _run_claimed_in_transaction(
            user=user, key=key, fingerprint=request_fingerprint(request_data), work=work
        )
    record = None
    if key is not None:
        claim = idempotency_key_claim(
            user=user, key=key, fingerprint=request_fingerprint(request_data)
        )
        if isinstance(claim, Replay):
            replayed = claim.reason == IdempotentOutcome.REPLAYED
            return IdempotentResult(
                claim.reason, Answer(claim.status, claim.body) if replayed else None
            )
        record = claim
    try:
        with transaction.atomic():
            if record is not None and not _claim_locked(record):
                # Taken over between our claim and this lock: the other request runs the work.
                return IdempotentResult(IdempotentOutcome.IN_FLIGHT, None)
            answer = work()
            if record is not None and answer.store:
                idempotency_key_complete(record=record, status=answer.status, body=answer.body)
            elif record is not None:
                idempotency_key_release(record=record)
    except BaseException:
        if record is not None:
            idempotency_key_release(record=record)
        raise
    return IdempotentResult(IdempotentOutcome.ANSWERED, answer)


def _run_claimed_in_transaction(
    *, user, key: str, fingerprint: str, work: Callable[[], Answer]
) -> IdempotentResult:
    """``work`` under ``key`` in one transaction that claims the key in its first statement
    (``_claim_in_transaction``) and stores the answer before its commit. A refusal deletes the
    claim in the same transaction; an exception rolls the claim back with the work."""
    with transaction.atomic():
        claim = _claim_in_transaction(user=user, key=key, fingerprint=fingerprint)
        if isinstance(claim, Replay):
            replayed = claim.reason == IdempotentOutcome.REPLAYED
            return IdempotentResult(
                claim.reason, Answer(claim.status, claim.body) if replayed else None
            )
        answer = work()
        if answer.store:
            idempotency_key_complete(record=claim, status=answer.status, body=answer.body)
        else:
            idempotency_key_release(record=claim)
    return IdempotentResult(IdempotentOutcome.ANSWERED, answer)


# The first of the two keys of the claim's advisory lock: PostgreSQL keeps two-key advisory locks
# apart from one-key ones, and this first key from the outbox's (callbacks.outbox).
CLAIM_LOCK_NAMESPACE = 0x1D3C

# The lock and the insert in one statement: the lock is tried first (its CTE is materialized,
# and the insert reads from it), so the row is inserted only by the holder of the lock. A row
# already there (committed: answered, or left by a request claiming the old way) is left alone
# (``ON CONFLICT DO NOTHING``) and read after.
CLAIM_SQL = """WITH held AS MATERIALIZED (
    SELECT pg_try_advisory_xact_lock(%s, hashtext(%s)) AS held
), claimed AS (
    INSERT INTO {table} (user_id, key, request_hash, created_at)
    SELECT %s, %s, %s, %s FROM held WHERE held.held
    ON CONFLICT (user_id, key) DO NOTHING
    RETURNING id
)
SELECT (SELECT held FROM held), (SELECT id FROM claimed)
"""


def _claim_in_transaction(*, user, key: str, fingerprint: str) -> ApiIdempotencyKey | Replay:
    """Claim ``key`` inside the work's transaction, in one statement, or say what to answer.

    The advisory lock is the user's key's (hashed: two keys of one hash at the same moment only
    make one of them answer 409, and the client retries it) and is held to the transaction's
    end, with the uncommitted row: a second request with the key cannot take the lock, so it
    answers 409 without waiting for the row. A request that takes the lock after the first one
    committed finds its row, and replays it (or refuses another body)."""
    for _ in range(CLAIM_ATTEMPTS):
        now = timezone.now()
        with connection.cursor() as cursor:
            cursor.execute(
                _statement(CLAIM_SQL),
                [CLAIM_LOCK_NAMESPACE, f"{user.pk}:{key}", user.pk, key, fingerprint, now],
            )
            held, claimed_id = cursor.fetchone()
        if not held:
            return Replay(409, None, IdempotentOutcome.IN_FLIGHT)
        if claimed_id is not None:
            return ApiIdempotencyKey(
                id=claimed_id, user=user, key=key, request_hash=fingerprint, created_at=now
            )
        answer = _taken_answer(user=user, key=key, fingerprint=fingerprint)
        if answer is not None:
            return answer
    return Replay(409, None, IdempotentOutcome.IN_FLIGHT)


def _claim_locked(record: ApiIdempotencyKey) -> bool:
    """Lock our claim's row until the work's transaction ends; False if it is no longer ours
    (another request took it over, or it was answered)."""
    mine = ApiIdempotencyKey.objects.select_for_update().filter(
        pk=record.pk, created_at=record.created_at, completed_at__isnull=True
    )
    return bool(list(mine.values_list("pk", flat=True)))


def idempotency_key_claim(*, user, key: str, fingerprint: str) -> ApiIdempotencyKey | Replay:
    """Claim ``key`` for this request, or say what to answer instead. A key released between
    our insert failing and our read (its request was refused, so nothing is bound to it) is
    free again: claimed anew, a few times, then answered as in flight."""
    for _ in range(CLAIM_ATTEMPTS):
        try:
            return _claim_insert(user=user, key=key, fingerprint=fingerprint)
        except IntegrityError:
            pass
        answer = _taken_answer(user=user, key=key, fingerprint=fingerprint)
        if answer is not None:
            return answer
    return Replay(409, None, IdempotentOutcome.IN_FLIGHT)


def _taken_answer(*, user, key: str, fingerprint: str) -> ApiIdempotencyKey | Replay | None:
    """What to answer for a key another request holds; None when it was freed between our
    insert and this read (a refused request's key, the purge): claim it again."""
    try:
        return _claim_taken(user=user, key=key, fingerprint=fingerprint)
    except ApiIdempotencyKey.DoesNotExist:
        return None
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) != LOCK_NOT_AVAILABLE:
            raise
        # The first request's work holds the row: it is running, whatever its age.
        return Replay(409, None, IdempotentOutcome.IN_FLIGHT)


CLAIM_ATTEMPTS = 3


def _claim_insert(*, user, key: str, fingerprint: str) -> ApiIdempotencyKey:
    """The claim's row, committed on its own: outside a transaction its one INSERT is one (no
    BEGIN and COMMIT around it), inside one (a caller's) a savepoint keeps a lost race from
    breaking the caller's transaction."""
    if not connection.in_atomic_block:
        return ApiIdempotencyKey.objects.create(user=user, key=key, request_hash=fingerprint)
    with transaction.atomic():
        return ApiIdempotencyKey.objects.create(user=user, key=key, request_hash=fingerprint)


# PostgreSQL's SQLSTATE for a NOWAIT lock that another transaction holds.
LOCK_NOT_AVAILABLE = "55P03"


def _claim_taken(*, user, key: str, fingerprint: str) -> ApiIdempotencyKey | Replay:
    """The key is someone's already: replay, refuse, or take over a claim left by a request
    that died (unlocked and older than the lease)."""
    with transaction.atomic():
        record = ApiIdempotencyKey.objects.select_for_update(nowait=True).get(user=user, key=key)
        if record.request_hash != fingerprint:
            return Replay(422, None, IdempotentOutcome.MISMATCH)
        if record.completed_at is not None:
            return Replay(record.response_status, record.response_body, IdempotentOutcome.REPLAYED)
        if timezone.now() - record.created_at < conf.API_IDEMPOTENCY_LEASE:
            return Replay(409, None, IdempotentOutcome.IN_FLIGHT)
        # The first request died before finishing: nothing it did was committed. Take it over.
        record.created_at = timezone.now()
        record.save(update_fields=["created_at"])
        return record


def idempotency_key_complete(*, record: ApiIdempotencyKey, status: int, body: dict) -> None:
    """Store the answer; call inside the transaction that did the work. On PostgreSQL by a
    statement written once (``COMPLETE_SQL``): the ORM's ``save`` built the same ``UPDATE`` anew
    for every keyed create (no receiver listens to this model's saves)."""
    record.response_status = status
    record.response_body = body
    record.completed_at = timezone.now()
    if connection.vendor != "postgresql":
        record.save(update_fields=["response_status", "response_body", "completed_at"])
        return
    with connection.cursor() as cursor:
        cursor.execute(
            _statement(COMPLETE_SQL),
            [
                status,
                _BODY_FIELD.get_db_prep_save(body, connection=connection),
                record.completed_at,
                record.pk,
            ],
        )
        if cursor.rowcount != 1:
            # As ``save(update_fields=...)`` says it: the claim's row is gone.
            raise DatabaseError("Save with update_fields did not affect any rows.")


COMPLETE_SQL = (
    "UPDATE {table} SET response_status = %s, response_body = %s, completed_at = %s WHERE id = %s"
)
_BODY_FIELD = ApiIdempotencyKey._meta.get_field("response_body")


@functools.cache
def _statement(template: str) -> str:
    """``template`` with the keys' table, written once per process (PostgreSQL's quoting)."""
    return template.format(table=connection.ops.quote_name(ApiIdempotencyKey._meta.db_table))


def idempotency_key_release(*, record: ApiIdempotencyKey) -> None:
    """Forget a claim whose request failed unexpectedly, so the client may retry with the key."""
    ApiIdempotencyKey.objects.filter(
        pk=record.pk, created_at=record.created_at, completed_at__isnull=True
    ).delete()
