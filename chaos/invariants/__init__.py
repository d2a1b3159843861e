"""The invariants an exactly-once payments pipeline must keep, checked against the database and
the processor's own record of what it charged and which callbacks it delivered.

``check_invariants(sandbox_stats=..., callbacks_sent=...)`` returns a ``Report``; ``python -m
chaos.invariants`` prints it and exits 1 on any violation. The checks, one module per concern
(``money``, ``event_log``, ``callbacks``, ``dead_letters``):

- ``charged_at_most_once``: the processor charged each idempotency key (and each payment) at
  most once, every charged key belongs to one of our payments, no payment it charged is
  recorded as rejected or canceled, and every confirmed payment was charged;
- ``event_applied_at_most_once``: each processor_event_id has at most one ``applied`` row in the
  event log, and the dedup record (ProcessedEvent) agrees with the log;
- ``transitions_valid``: replaying each payment's event log in order, every applied row starts
  where the previous one ended and is an allowed transition, every other row was written in the
  state the payment was in, a row marked stale really was stale, and the last state is the
  payment's state;
- ``ledger_matches_confirmed``: one credit per settled payment (confirmed, or returned after
  settlement) for its amount and merchant, no credit without confirmation, and each merchant's
  credits equal its settled total;
- ``returns_reversed``: every returned payment has exactly one reversal, for its amount and
  merchant; no reversal exists without a return; and so each merchant's ledger net (credits
  minus reversals) equals its confirmed total minus its returned total (checked as the
  reversals equal to the returned total, so a wrong credit fails the check above and a wrong
  reversal this one);
- ``dishonors_booked``: every returned payment whose log records a ``return_dishonored`` holds
  one re-credit of its amount, one whose log records a ``dishonor_contested`` too one reversal
  of it, nothing else holds either, and so each merchant's ledger net is its confirmed total
  plus its returned payments dishonored and not contested, whatever order the answers came in;
- ``callbacks_accounted``: every callback the processor delivered left a trace: applied, stale,
  dropped as duplicate, parked behind a hold, or in triage (dead letter or processing error), or
  (before the system has settled) started by a worker and not finished;
- ``dropped_callbacks_recovered``: every callback the processor dropped on purpose (never
  delivered; ``callbacks_dropped``) left such a trace all the same, through the pull of its
  events;
- ``final_states_match_processor``: every payment the processor made events for (delivered or
  dropped, never the run's injected ones) is in the state those events say, unless a person or
  the pipeline still has it (a dead letter, a hold, an error row, a message in hand);
- ``dead_letters_have_history``: every dead letter carries its error history (ProcessingError
  rows for its message or the error its dead-letter envelope carries);
- ``dead_letters_have_error_rows``: every message SQS's RedrivePolicy moved to the DLQ (no
  dead-letter envelope of the worker's) has a ProcessingError row of its own: none got there
  through receives that did no work (a wait for the processor, a database outage);
- ``no_outage_dead_letters``: no dead letter whose only errors are processor-unavailability
  errors raised while the processor's circuit breaker was open (an outage is one incident, not
  a dead letter per payment);
- ``nocs_recorded_once``: each recorded notification of change has exactly one NOC, for the
  payment its event named, and no NOC lacks its event or moved a state;
- ``reinitiations_within_limits``: at most two reinitiations per original entry, numbered in
  order, each for the original's merchant, amount and token, each made after the entry before
  it came back;
- ``credits_sent_at_most_once``: the processor sent each credit key (refund, payout) and each
  credit at most once, only credits of ours, none canceled here;
- ``refunds_within_collected``: per debit, the refunds holding money never exceed what it
  collected, and only a settled debit has refunds sent;
- ``double_losses_flagged``: a refund sent before its debit's return is a double loss, booked
  (recovery owed) and alerted; one not sent was canceled;
- ``payouts_never_overdraw``: each payout was covered by the available balance as the
  merchant's ledger stood when it was made (replayed from the entries before it);
- ``balances_match_entries``: every merchant's pending, posted, available and money-out
  balance as answered equals the one recomputed from its ledger rows;
- ``webhooks_delivered_at_least_once``: every event has a delivery to each enabled endpoint
  wanting it, none spent its retries, each marked delivered has a 2xx attempt and (given the
  receiver's receipts) was verified by the receiver;
- ``webhook_ids_stable``: an event has one delivery per endpoint, and (given the receipts)
  every request's ``webhook-id`` is its body's event id, of that type, and every repeat of an
  id carried the same body;
- ``limits_never_exceeded``: no entry that was not held for review passes the single-entry cap
  in force when it was made, nor takes its banking day or window past the daily or window cap;
  with ``expect_limits`` (the run set limits), no entry made under a limit fails it too;
- ``held_payments_never_sent_unapproved``: a payment held for review (held or rejected) has no
  attempt, no submission, no processor id and no key at the processor; an approved one was
  attempted only after its approval; with ``expect_holds`` (the run turned on a rule that
  holds), no payment held fails it too;
- ``web_debits_validated_first``: no debit of a class that needs its account validated (WEB,
  NACHA's rule, and any the host adds) reached the processor or a bank file before its account
  was validated; a reinitiation is exempt; given the processor's own record of its debits,
  none it took as WEB arrived before its account's validation was validated;
- ``held_debits_decided_once``: every debit held for its account's validation was released
  once and charged once, or failed once with its validation and never sent;
- ``refused_web_debits_left_nothing``: no such debit was made from an account after its
  validation failed, and no create answered ``account_not_validated`` made a payment;
- ``micro_entry_attempts_bounded``: no micro-entries validation counted, nor any client was
  answered, more wrong tries than ``MICRO_ENTRY_MAX_ATTEMPTS``, and none was validated after
  its last try.

Besides violations, the report lists notes: payments not in a final state and not in front of a
human, messages still unfinished, outbox rows unpublished. After a run has gone quiet these are
worth a look, but the processor may simply not have sent a final callback yet, so they are not
counted as violations.
"""

from chaos.invariants.callbacks import check_callbacks, check_dropped_callbacks
from chaos.invariants.dead_letters import check_dead_letters, check_outage_dead_letters
from chaos.invariants.dishonors import check_dishonors
from chaos.invariants.event_log import check_events_applied_once, check_transitions
from chaos.invariants.final_states import check_final_states
from chaos.invariants.lifecycle import check_nocs, check_reinitiations
from chaos.invariants.money import check_charges, check_ledger, check_returns_reversed
from chaos.invariants.money_out import (
    check_balances,
    check_credits_sent,
    check_double_losses,
    check_payouts,
    check_refunds_within_collected,
)
from chaos.invariants.notes import notes_unfinished
from chaos.invariants.report import CHECKS, Report, Violation
from chaos.invariants.risk import check_held_never_sent, check_limits
from chaos.invariants.validation import (
    check_held_debits_decided_once,
    check_micro_entry_attempts,
    check_prenotes_waited,
    check_refused_web_debits_left_nothing,
    check_web_debits_reached_processor_validated,
    check_web_debits_validated_first,
)
from chaos.invariants.webhooks import check_webhook_ids, check_webhooks_delivered

__all__ = ["CHECKS", "Report", "Violation", "check_invariants"]


def check_invariants(
    *,
    sandbox_stats: dict,
    callbacks_sent: list | None,
    callbacks_dropped: list | None = None,
    processor_events: list | None = None,
    webhook_receipts: list | None = None,
    expect_limits: bool = False,
    expect_holds: bool = False,
    processor_debits: list | None = None,
    refused_creates: list | None = None,
    verify_answers: list | None = None,
    expect_validation: bool = False,
) -> Report:
    """Check every invariant; ``callbacks_sent`` lists the callbacks the processor delivered
    (bodies with ``processor_event_id``, or the ids themselves). Without it, delivered callbacks
    are accounted for by count only, from ``sandbox_stats``. ``callbacks_dropped`` lists those
    it never delivered (the sandbox's drops); without it that check is not made.
    ``processor_events`` lists every event the processor made, delivered or dropped (not the
    run's injected ones); without it the final states are not compared. ``webhook_receipts``
    lists what a webhook receiver verified (``WebhookReceiver.receipts``); without it the
    webhook checks read the database alone. ``expect_limits`` and ``expect_holds`` say the run
    was configured with exposure limits and with a rule that holds: the risk checks then fail
    when they found nothing to check. ``processor_debits`` lists every debit the processor
    took (its account, class and arrival: the recorded sandbox's ``debits``);
    ``refused_creates`` the creates answered 409 ``account_not_validated``; ``verify_answers``
    the answers the clients got to their micro-entry amounts; ``expect_validation`` says the
    run validated a share of its accounts, held WEB debits on them and refused some: the
    validation checks then fail when they found nothing to check."""
    report = Report()
    if callbacks_sent is None:
        callbacks_sent = sandbox_stats.get("callbacks_delivered")
    check_charges(report, sandbox_stats)
    check_events_applied_once(report)
    check_transitions(report)
    check_ledger(report)
    check_returns_reversed(report)
    check_dishonors(report)
    check_callbacks(report, sandbox_stats, callbacks_sent)
    check_dropped_callbacks(report, callbacks_dropped)
    check_final_states(report, processor_events)
    check_dead_letters(report)
    check_outage_dead_letters(report)
    check_nocs(report)
    check_reinitiations(report)
    check_credits_sent(report, sandbox_stats)
    check_refunds_within_collected(report)
    check_double_losses(report)
    check_payouts(report)
    check_balances(report)
    check_webhooks_delivered(report, webhook_receipts)
    check_webhook_ids(report, webhook_receipts)
    check_limits(report, expected=expect_limits)
    check_held_never_sent(report, sandbox_stats, expected=expect_holds)
    check_web_debits_validated_first(report)
    check_web_debits_reached_processor_validated(
        report, processor_debits, expected=expect_validation
    )
    check_held_debits_decided_once(report, sandbox_stats, expected=expect_validation)
    check_refused_web_debits_left_nothing(report, refused_creates, expected=expect_validation)
    check_micro_entry_attempts(report, verify_answers, expected=expect_validation)
    check_prenotes_waited(report)
    notes_unfinished(report)
    return report
