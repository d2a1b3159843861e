"""Reading the bank's return and NOC files into processor events, all or nothing.

``nacha_inbound_store`` keeps every file it is given, whole and sealed by the vault (the bytes
of a return carry the DFI account number). A malformed one (the parser's
refusal, or an entry that is no return or NOC) is stored as refused with its record number and
reason, and nothing of it is imported. A good one becomes one ``NachaInboundEvent`` per entry
in the same transaction: a return (addenda 99) is a ``returned`` event, a dishonored return
(R61-R69) ``return_dishonored``, a contested one (R71-R77) ``dishonor_contested``, a NOC
(addenda 98) ``notification_of_change`` with ``change_code`` and ``corrected_data``. The
events are published by the callbacks app (``bank.collect``), which knows the queue.

No account number leaves this module in an event: a NOC's corrected account or routing
number is sealed in the vault as a new account, and the event carries its token and last 4
digits. The same file read twice is the same row; the same return in another file is the same
event (its deduplication id is unique).

A return or NOC of one of our prenotes (``NachaPrenote``) is no payment's event: it is applied
to the account's validation in the import's transaction, once (its row, with the same unique
deduplication id, is written published). A return fails the validation with its code, and each
debit held on it once; a NOC is a ``NotificationOfChange`` of the validation (kept, shown and
applied as a payment's is, and named in the validation's evidence), and one that changes the
account number (C01/C03/C06/C07) makes the account new, unvalidated (its corrected account
vaulted as another token, as a payment's NOC's is).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from datetime import UTC, datetime

from bank.nacha import layouts as L
from bank.nacha.accounts import AccountUnavailable
from bank.nacha.models import (
    InboundStatus,
    NachaEntry,
    NachaInboundEvent,
    NachaInboundFile,
    NachaPrenote,
)
from bank.nacha.parser import Entry, NachaFile, NachaFormatError, parse_nacha
from bank.nacha.received import received_file_store, received_name_shown
from bank.nacha.sealing import inbound_aad
from bank.nacha.windows import EASTERN
from payments import catalogue
from payments.alerts import AlertSeverity, alert_key_bounded, alert_raise
from payments.change_codes import corrected_data_problems
from payments.services.nocs import noc_record_of_prenote
from payments.services.validation import prenote_returned

logger = logging.getLogger(__name__)

# The catalogue's types a bank's return file reports (payments.catalogue).
RETURNED = catalogue.RETURNED.name
RETURN_DISHONORED = catalogue.RETURN_DISHONORED.name
DISHONOR_CONTESTED = catalogue.DISHONOR_CONTESTED.name
NOTIFICATION_OF_CHANGE = catalogue.NOTIFICATION_OF_CHANGE.name

# What each change code corrects (NACHA's table), in the order the corrected data holds it:
# (field, start, end) within the 29 columns.
CHANGE_CODE_FIELDS: dict[str, tuple[tuple[str, int, int], ...]] = {
    "C01": (("account_number", 0, 17),),
    "C02": (("routing_number", 0, 9),),
    "C03": (("routing_number", 0, 9), ("account_number", 12, 29)),
    "C04": (("individual_name", 0, 22),),
    "C05": (("transaction_code", 0, 2),),
    "C06": (("account_number", 0, 17), ("transaction_code", 20, 22)),
    "C07": (("routing_number", 0, 9), ("account_number", 9, 26), ("transaction_code", 26, 28)),
    "C08": (("receiving_dfi_identification", 0, 11),),
    "C09": (("individual_identification_number", 0, 22),),
    "C10": (("company_name", 0, 16),),
    "C11": (("company_identification", 0, 10),),
    "C12": (("company_name", 0, 16), ("company_identification", 16, 26)),
    "C13": (("addenda_format", 0, 29),),
    "C14": (("sec_code", 0, 3),),
}
ACCOUNT_TYPES = {"2": "checking", "3": "savings", "4": "general_ledger", "5": "loan"}


@dataclass(frozen=True)
class InboundResult:
    file: NachaInboundFile
    created: bool  # False: this exact file was stored before


def event_type_of(code: str) -> str:
    if code.startswith("C"):
        return NOTIFICATION_OF_CHANGE
    if code in L.DISHONORED_RETURN_CODES:
        return RETURN_DISHONORED
    if code in L.CONTESTED_RETURN_CODES:
        return DISHONOR_CONTESTED
    return RETURNED


def _file_moment(parsed: NachaFile) -> datetime:
    """When the bank wrote the file (its header, Eastern time): the events' timestamp, the
    same however often the file is read."""
    header = parsed.header
    day = header["file_creation_date"]
    hhmm = header["file_creation_time"] if header["file_creation_time"].isdigit() else "0000"
    try:
        moment = datetime.strptime(day + hhmm, "%y%m%d%H%M")
    except ValueError:
        raise NachaFormatError(
            1, "file header creation date or time is not a real moment"
        ) from None
    return moment.replace(tzinfo=EASTERN).astimezone(UTC)


def _corrected_data(code: str, text: str, payment_token: str) -> dict:
    """The NOC's corrections under the contract's names (``payments.change_codes``): a
    corrected account or routing number is sealed in the vault and named by its token and last
    4 digits (``bank.vault``), never carried itself. A value the contract would refuse (an
    account type it does not take, an identification number that reads as a bank number) is
    left out and logged by name: the NOC is still recorded, and the bank's file is kept whole
    for the person who applies it. A refused or unknown code carries nothing."""
    fields = CHANGE_CODE_FIELDS.get(code)
    if fields is None:
        return {}
    values = {name: text[start:end].strip() for name, start, end in fields}
    data: dict = {}
    if "transaction_code" in values:
        tx = values.pop("transaction_code")
        data["transaction_code"] = tx
        data["account_type"] = ACCOUNT_TYPES.get(tx[:1], "")
    routing = values.pop("routing_number", None)
    account = values.pop("account_number", None)
    if routing:
        data["routing_number_last4"] = routing[-4:]
    if account:
        data["account_number_last4"] = account[-4:]
    if routing is not None or account is not None:
        token = _vaulted_correction(payment_token, routing, account, data.get("account_type"))
        if token:
            data["source_token"] = token
    for name, value in values.items():
        data[_CONTRACT_NAMES.get(name, name)] = value
    kept = {}
    for key, value in data.items():
        if value and not corrected_data_problems(code, {key: value}):
            kept[key] = value
        elif value:
            logger.warning("NOC %s: corrected %s left out, not of the contract's form", code, key)
    return kept


# The bank file's field names where the contract names them otherwise.
_CONTRACT_NAMES = {
    "receiving_dfi_identification": "receiving_dfi_identification_last4",
    "addenda_format": "addenda_information",
}


def _vaulted_correction(
    payment_token: str, routing: str | None, account: str | None, account_type: str | None
) -> str:
    """The vault token of the corrected account, or "" when the payment's account is not in
    the vault or the correction cannot be stored (logged: the NOC is recorded all the same)."""
    from bank.vault.models import VaultAccount
    from bank.vault.services import (
        VaultInputError,
        vault_account_reveal,
        vault_account_store,
    )

    original = VaultAccount.objects.filter(token=payment_token).first()
    if original is None:
        return ""
    try:
        current = vault_account_reveal(payment_token)
        corrected = vault_account_store(
            merchant_id=original.merchant_id,
            routing_number=routing or current.routing_number,
            account_number=account or current.account_number,
            account_type=account_type
            if account_type in ("checking", "savings")
            else original.account_type,
            holder_name=current.holder_name,
            sec_code=original.sec_code,
        )
    except (VaultInputError, AccountUnavailable) as exc:
        logger.warning("NOC correction of %s not stored in the vault: %s", payment_token, exc)
        return ""
    return corrected.token


def _fingerprint(*parts: str) -> str:
    return hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]


def _event_for(entry: Entry, moment: datetime) -> tuple[str, str, NachaEntry | None, dict, str]:
    addenda = entry.return_addenda
    if addenda is None:
        raise NachaFormatError(
            entry.record.number, "an entry of a bank file without a return or NOC addenda"
        )
    is_noc = addenda["addenda_type_code"] == "98"
    code = addenda.text("change_code" if is_noc else "return_reason_code")
    original_trace = addenda["original_entry_trace_number"]
    ours = NachaEntry.objects.select_related("payment").filter(trace_number=original_trace).first()
    event_type = event_type_of(code)
    amount = f"{entry.amount_cents / 100:.2f}"
    if ours is not None and is_noc:
        amount = f"{ours.payment.amount:.2f}"  # a NOC carries no amount; the payment's stands
    event: dict = {
        "payment_id": str(ours.payment_id) if ours else "",
        "event_type": event_type,
        "processor_event_id": f"ach.{original_trace}.{code}",
        "amount": amount,
        "timestamp": moment.isoformat(),
        "reason_code": "" if is_noc else code,
        "message": f"ACH {'NOC' if is_noc else 'return'} {code}, bank trace {entry.trace_number}",
    }
    if not is_noc and addenda.fields.get("addenda_information", "").strip():
        # The bank's words: an R17 marked QUESTIONABLE blocks the account (payments.services.fraud).
        event["message"] += f": {addenda.text('addenda_information')[:44]}"
    if entry.transaction_code in L.CREDIT_CODES:
        # The bank answers one of our credits (a refund or payout): stated, so a return of a
        # credit matched to a debit of ours is a mismatch for a person, never applied as one.
        event["direction"] = "credit"
    if is_noc:
        token = ours.payment.source_token if ours else ""
        event["change_code"] = code
        event["corrected_data"] = _corrected_data(code, addenda["corrected_data"], token)
    dedup = f"{original_trace}.{_fingerprint(event_type, code, amount, entry.trace_number)}"
    return code, event_type, ours, event, dedup


def nacha_inbound_store(*, name: str, content: bytes) -> InboundResult:
    """Keep the file and turn it into events, or keep it refused; see the module docstring.

    The bytes are sealed by the vault first, outside any transaction (the key holder may be a
    network away): a holder that cannot be asked raises ``VaultUnavailable`` before anything is
    stored, and the caller leaves the file in the bank's drop for the next round."""
    stored, created = received_file_store(
        model=NachaInboundFile,
        name=name,
        content=content,
        aad=lambda sha: inbound_aad(sha256=sha),
        read=_import,
        format_error=NachaFormatError,
        refused_status=InboundStatus.REFUSED,
        refused=_refused,
    )
    return InboundResult(stored, created=created)


def _refused(stored: NachaInboundFile) -> None:
    logger.error(
        "nacha file refused: %s",
        f"record {stored.refused_record}: {stored.refused_reason}",
        extra={"file": stored.name, "record": stored.refused_record},
    )
    _refused_alert(stored)


def refused_file_key(stored: NachaInboundFile) -> str:
    """The file's name and the start of its hash: a bank that resends a corrected file under
    the same name is another alert, the same bytes read again none."""
    return alert_key_bounded(f"nacha.inbound_refused:{stored.name}:{stored.sha256[:12]}")


def _refused_alert(stored: NachaInboundFile) -> None:
    # Raised where the refused row is created, once per file's bytes: reading them again finds
    # the row and raises nothing. The reason names a record and a field, never a value.
    alert_raise(
        severity=AlertSeverity.HIGH,
        key=refused_file_key(stored),
        summary=(
            f"bank file {stored.name} refused whole at record {stored.refused_record}: "
            f"{stored.refused_reason}. Nothing of it was imported; it is kept (inbound file "
            f"{stored.pk}) for a human, and its returns and NOCs wait until the bank resends it."
        ),
        details={
            "file": stored.name,
            "inbound_file_id": stored.pk,
            "sha256": stored.sha256,
            "record": stored.refused_record,
            "reason": stored.refused_reason,
        },
    )


def stray_entry_key(name: str) -> str:
    """One alert per name of the drop that is no regular file (a bank file's refusal keys by
    its bytes; this entry has none we read)."""
    return alert_key_bounded(f"nacha.inbound_refused:{name}:not-a-regular-file")


def nacha_inbound_stray_refuse(*, name: str, kind: str, set_aside_to: str | None) -> None:
    """Say that the drop's entry ``name`` is a ``kind`` (a link, a pipe, ...) and was not read.

    The collector calls this once it has moved the entry aside, so the next round does not
    meet it: one alert per entry. An entry that could not be moved is met, and raised, again."""
    # Names the bank chose: shown with their bank numbers masked, as the stored files' are.
    name = received_name_shown(name)
    set_aside_to = received_name_shown(set_aside_to) if set_aside_to else set_aside_to
    where = (
        f"it was moved to {set_aside_to} for a human"
        if set_aside_to
        else "it could not be moved aside and will be refused again next round"
    )
    alert_raise(
        severity=AlertSeverity.HIGH,
        key=stray_entry_key(name),
        summary=(
            f"{name} in the bank's drop is a {kind}, not a regular file: it was not read and "
            f"nothing of it was imported; {where}. Ask the bank what it meant to send."
        ),
        details={"file": name, "kind": kind, "set_aside_to": set_aside_to or ""},
    )
    logger.error("nacha drop entry refused: %s is a %s", name, kind, extra={"file": name})


def _import(name: str, content: bytes, sha: str, sealed: dict) -> NachaInboundFile:
    parsed = parse_nacha(content)
    moment = _file_moment(parsed)
    stored = NachaInboundFile.objects.create(
        name=name[:255], sha256=sha, status=InboundStatus.IMPORTED, **sealed
    )
    count = 0
    for entry in parsed.entries():
        if _prenote_answer(entry, moment, stored):
            count += 1
            continue
        code, event_type, ours, event, dedup = _event_for(entry, moment)
        count += 1
        if NachaInboundEvent.objects.filter(deduplication_id=dedup).exists():
            continue  # read before, from another file: one event
        NachaInboundEvent.objects.create(
            file=stored,
            record_number=entry.record.number,
            original_trace_number=entry.return_addenda["original_entry_trace_number"],
            code=code,
            event_type=event_type,
            payment=ours.payment if ours else None,
            deduplication_id=dedup,
            event=event,
        )
    stored.entry_count = count
    stored.save(update_fields=["entry_count"])
    return stored


def _prenote_answer(entry: Entry, moment: datetime, stored: NachaInboundFile) -> bool:
    """Apply ``entry`` to its prenote's validation if it answers one of our prenotes (see the
    module docstring); False when it answers no prenote."""
    addenda = entry.return_addenda
    if addenda is None:
        return False
    original_trace = addenda["original_entry_trace_number"]
    prenote = NachaPrenote.objects.filter(trace_number=original_trace).first()
    if prenote is None:
        return False
    is_noc = addenda["addenda_type_code"] == "98"
    code = addenda.text("change_code" if is_noc else "return_reason_code")
    event_type = event_type_of(code)
    dedup = f"{original_trace}.{_fingerprint(event_type, code, 'prenote', entry.trace_number)}"
    if NachaInboundEvent.objects.filter(deduplication_id=dedup).exists():
        return True  # read before, from another file: applied once
    event: dict = {
        "account_validation_id": prenote.validation_id,
        "event_type": event_type,
        "timestamp": moment.isoformat(),
        "reason_code": "" if is_noc else code,
        "message": f"ACH {'NOC' if is_noc else 'return'} {code} of prenote {original_trace}, "
        f"bank trace {entry.trace_number}",
    }
    if is_noc:
        event["change_code"] = code
        event["corrected_data"] = _corrected_data(
            code, addenda["corrected_data"], prenote.account_token
        )
    NachaInboundEvent.objects.create(
        file=stored,
        record_number=entry.record.number,
        original_trace_number=original_trace,
        code=code,
        event_type=event_type,
        prenote=prenote,
        deduplication_id=dedup,
        event=event,
        published_at=moment,
        message_id="applied to the account validation",
    )
    if not is_noc:
        applied = prenote_returned(
            account_token=prenote.account_token,
            return_code=code,
            now=moment,
            trace_number=original_trace,
        )
        note = "" if applied else " (its validation no longer waits on it)"
    else:
        # Kept as any NOC is (its deadline, the debits it blocks, the account made new by a
        # change of its number), naming the validation: the same id a payment's NOC has.
        _, applied = noc_record_of_prenote(
            validation=prenote.validation,
            processor_event_id=f"ach.{original_trace}.{code}",
            change_code=code,
            corrected_data=event["corrected_data"],
            received_at=moment,
        )
        note = "" if applied else " (its NOC was recorded before)"
    logger.info(
        "prenote %s answered %s%s",
        original_trace,
        code,
        note,
        extra={"merchant_id": prenote.merchant_id, "trace": original_trace},
    )
    return True
