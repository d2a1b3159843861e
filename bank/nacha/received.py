"""A whole file taken from one of the bank's drops, kept once: the bank's return and NOC files
(``bank.nacha.inbound``) and its statements (``bank.books``) are stored the same way."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from typing import TypeVar

from django.db import IntegrityError, transaction

from bank.nacha.models import ReceivedFile
from bank.nacha.sealing import content_seal
from payments.kernel.bank_numbers import mask_bank_numbers

F = TypeVar("F", bound=ReceivedFile)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def received_name_shown(name: str) -> str:
    """A name the bank chose (a file in its drop), as it is stored and shown: its bank numbers
    masked as every foreign text's are (``mask_bank_numbers``), and what PostgreSQL cannot hold
    or a log line should not carry written out instead (a byte that was not UTF-8 arrives as a
    lone surrogate: ``\\udcff``; a NUL or another control character: ``\\x00``)."""
    name = name.encode("utf-8", "backslashreplace").decode("utf-8")
    name = _CONTROL.sub(lambda found: f"\\x{ord(found.group()):02x}", name)
    return mask_bank_numbers(name)


def received_file_store(
    *,
    model: type[F],
    name: str,
    content: bytes,
    aad: Callable[[str], bytes],
    read: Callable[[str, bytes, str, dict], F],
    format_error: type[Exception],
    refused_status: str,
    refused: Callable[[F], None],
) -> tuple[F, bool]:
    """``(row, created)`` of the file ``content``: the row of the same bytes stored before
    (``created`` False), or a new one. The bytes are sealed first, outside any transaction (the
    key holder may be a network away): one that cannot be asked raises ``VaultUnavailable``
    before anything is stored, and the file stays in the drop for the next round. ``read(name,
    content, sha256, sealed)`` stores it and what it holds in one transaction; when it raises
    ``format_error`` (with ``record_number`` and ``reason``) nothing of it is imported and the
    file is kept refused, naming the record, then ``refused(row)`` tells a person (once per
    file's bytes: reading them again finds the row). The same bytes stored by a concurrent
    reader are that reader's row. ``read`` and ``refused`` are given the name masked."""
    name = received_name_shown(name)[:255]
    sha = hashlib.sha256(content).hexdigest()
    existing = model.objects.filter(sha256=sha).first()
    if existing is not None:
        return existing, False
    sealed = content_seal(content, aad=aad(sha))
    try:
        with transaction.atomic():
            return read(name, content, sha, sealed), True
    except format_error as exc:
        row = model.objects.create(
            name=name[:255],
            sha256=sha,
            status=refused_status,
            refused_record=exc.record_number,
            refused_reason=exc.reason,
            **sealed,
        )
        refused(row)
        return row, True
    except IntegrityError:
        return model.objects.get(sha256=sha), False
