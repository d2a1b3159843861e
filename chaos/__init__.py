"""``make chaos`` (``python -m chaos``): payments through the real stack while faults are injected,
then the invariants.

The stack, every part a real process on 127.0.0.1, on a fresh PostgreSQL database:

- fauxqs (the local SQS server), reached by every other process through a small TCP proxy
  (``chaos.processes``), so the queue endpoint can be cut and restored without losing fauxqs'
  in-memory queues (restarting fauxqs itself would be data loss, not an outage);
- the sandbox processor (``chaos.recorded_sandbox``: the product's SandboxProcessor with seeded
  faults, recording every callback it delivers);
- gunicorn serving the web app (payments API and callback endpoint);
- two ``run_sqs_worker`` processes (which also relay the outbox) with a 3 s visibility timeout.

Faults, all bounded in count and time: processor 5xx, 4xx, timeouts and latencies above the
visibility timeout; duplicate and delayed callbacks; returns, before settlement and some seconds
after it (duplicated and delayed like any callback); source-token rules (tok_fail5xx_2,
tok_timeout_1, tok_reject, tok_return, tok_nsf, tok_unauth, tok_dupcb); a worker SIGKILLed every
few seconds and restarted; a window in which the queue endpoint refuses connections (the
callback endpoint answers 503 and the processor retries its callbacks; payments created
meanwhile are published by the outbox relay afterwards); a processor outage (every API call has
its connection dropped) lasting PROCESSOR_OUTAGE_SECONDS, more than three times the workers'
whole retry budget, which the processor's circuit breaker must turn into one incident and no
dead letter, followed by PROCESSOR_FLAP_SECONDS of flapping (every other debit fails), one
incident too; the run's database refusing every connection for DATABASE_OUTAGE_SECONDS (no
receive spent, no dead letter); PostgreSQL backends of the run's database terminated a few
times; two gunicorn workers SIGKILLed; and a faulty processor's callbacks (``settled`` for a
payment it rejected, an event for an unknown payment, a reused event id with another amount),
which must end in triage; and the processor's answers to dishonors of returned payments
(``return_dishonored``, ``dishonor_contested``) out of order and redelivered, which must move
money exactly once each. Beat's fold of the available totals runs every three seconds beside
all of it, and ``balances_match_entries`` holds the totals it wrote to the ledger.
Payments are created through ``POST /api/payments/`` with an Idempotency-Key, retried with the
same key on 5xx, 409 ``idempotency_key_in_use`` and connection errors; any other 409 (past an
exposure limit) is the create's answer, recorded as refused.

Risk controls under the same faults (``review``): three merchants have exposure limits the load
reaches (single-entry, daily or 5-banking-day debit caps, a credit daily cap that payouts race
across), ``first_large_debit`` holds some debits of the others, and a reviewer approves and
rejects the held ones while the faults run and the creates race on, some approvals racing the
merchant's cancel. ``limits_never_exceeded`` and ``held_payments_never_sent_unapproved`` are
told the run was configured with both: a run that reached no limit or held nothing fails them.

Account validation under the same faults (``validation``): about 12 % of the payments are WEB
debits from new accounts, held (``UNVALIDATED_WEB_DEBITS = "hold"``) until each account is
validated by a flapping validation service or by micro-entries verified through the API by
racing clients, some failing (the service's no, too many wrong tries) and refusing the next
create. ``web_debits_validated_first`` (against the processor's record of its debits),
``held_debits_decided_once``, ``refused_web_debits_left_nothing`` and
``micro_entry_attempts_bounded`` are told the run was configured with it.

Then it waits (bounded) until nothing moves, runs ``ingest_dlq``, stops the processor to read
its record, and runs ``chaos.invariants``. Output: a summary, the invariant report, and
``bench/results/chaos/`` (every process's log, ``report.json``).

Settings (environment): CHAOS_PAYMENTS (default 1000), CHAOS_SECONDS (length of the fault
window; default 60 + payments / 4: payments are created over its first 70 %), CHAOS_QUIESCE_SECONDS
(longest wait for the system to settle afterwards, default 300; it stops sooner when nothing
finished for 60 s), CHAOS_SEED (default a new random seed each run, printed in the summary and
kept in report.json, so CHAOS_SEED=<it> replays the run's draw), CHAOS_DATABASE (default
payments_chaosrun; dropped and created by the run).

Exit status: 0 all invariants hold; 1 an invariant is violated or the API lost or doubled a
payment; 3 the system did not settle within CHAOS_QUIESCE_SECONDS (the invariants are still
checked and printed); 2 the run itself could not be set up, or a fault could not be injected.

Where each part lives: ``config`` (the settings and the run's environment), ``processes`` (the
children and the queue proxy), ``load`` (the payments the run creates), ``faults`` (the fault
schedule), ``review`` (limits, holds and the reviewer), ``validation`` (the WEB debits held
for their accounts' validation, the validation service's double), ``settling`` (waiting until
nothing moves), ``summary`` (what the run prints and keeps), ``run`` (the run from start to end),
``invariants`` (the checker).
"""
