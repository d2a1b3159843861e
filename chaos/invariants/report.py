"""The invariant checker's report: which checks ran, what each counted, every violation with the
ids it concerns, and notes on what is still moving."""

from dataclasses import dataclass, field
from typing import Any

CHECKS = (
    "charged_at_most_once",
    "event_applied_at_most_once",
    "transitions_valid",
    "ledger_matches_confirmed",
    "returns_reversed",
    "dishonors_booked",
    "callbacks_accounted",
    "dropped_callbacks_recovered",
    "final_states_match_processor",
    "dead_letters_have_history",
    "dead_letters_have_error_rows",
    "no_outage_dead_letters",
    "nocs_recorded_once",
    "reinitiations_within_limits",
    "credits_sent_at_most_once",
    "refunds_within_collected",
    "double_losses_flagged",
    "payouts_never_overdraw",
    "balances_match_entries",
    "webhooks_delivered_at_least_once",
    "webhook_ids_stable",
    "limits_never_exceeded",
    "held_payments_never_sent_unapproved",
    "web_debits_validated_first",
    "held_debits_decided_once",
    "refused_web_debits_left_nothing",
    "micro_entry_attempts_bounded",
    "prenotes_waited",
)

# How many offending ids a violation lists before it summarises the rest.
MAX_IDS = 10


@dataclass(frozen=True)
class Violation:
    check: str
    detail: str
    ids: tuple[str, ...] = ()

    def __str__(self) -> str:
        return f"{self.check}: {self.detail}{ids_suffix(self.ids)}"


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    # check name -> what was checked (counts shown in the report)
    checked: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def violations_of(self, check: str) -> list[Violation]:
        return [v for v in self.violations if v.check == check]

    def add(self, check: str, detail: str, ids: list[str] | tuple[str, ...] = ()) -> None:
        self.violations.append(Violation(check, detail, tuple(str(i) for i in ids)))

    def render(self) -> str:
        lines = ["invariant check"]
        for check in CHECKS:
            failed = self.violations_of(check)
            counts = ", ".join(f"{k} {v}" for k, v in self.checked.get(check, {}).items())
            status = "FAIL" if failed else "ok"
            lines.append(f"  {status:4} {check}: {counts}")
            for violation in failed:
                lines.append(f"         - {violation.detail}" + ids_suffix(violation.ids))
        for note in self.notes:
            lines.append(f"  note {note}")
        verdict = "PASSED" if self.ok else f"FAILED ({len(self.violations)} violation(s))"
        lines.append(f"invariants {verdict}")
        return "\n".join(lines)

    def as_dict(self) -> dict:
        return {
            "ok": self.ok,
            "violations": [
                {"check": v.check, "detail": v.detail, "ids": list(v.ids)} for v in self.violations
            ],
            "checked": self.checked,
            "notes": self.notes,
        }


def ids_suffix(ids: tuple[str, ...]) -> str:
    if not ids:
        return ""
    shown = ", ".join(ids[:MAX_IDS])
    more = f" (+{len(ids) - MAX_IDS} more)" if len(ids) > MAX_IDS else ""
    return f": {shown}{more}"
