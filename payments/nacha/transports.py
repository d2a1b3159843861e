"""How files reach the bank and come back: a small interface, a directory, and SFTP.

Delivery is idempotent by name: a file is written under a temporary name and linked to its
own only when whole, so the bank never picks up half a file, and a name already there with the
same bytes counts as delivered (a retry after a crash between the write and our record sends
nothing again); with other bytes it is a ``DeliveryConflict`` for a human, never overwritten.

Collection lists only whole files: not our temporary names, not hidden ones, and none that
may still be being written. A directory on this machine compares a file's mtime with this
machine's clock, the one that stamped it; SFTP (``sftp``) trusts no clock of the server's and
takes a file only once its size and mtime are unchanged across two listings ``min_age_seconds``
apart.
"""

from __future__ import annotations

import abc
import hashlib
import os
import secrets
import time
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

PARTIAL_SUFFIX = ".partial"


class TransportError(Exception):
    """The transport could not do it now: retry later."""


class DeliveryConflict(TransportError):
    """A file of that name is already at the bank with other bytes: a human must look."""


def temporary_name(name: str) -> str:
    """Hidden and suffixed, so no pickup pattern of the bank's matches it; unique per attempt,
    so two deliverers never write into one another's file."""
    return f".{name}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}"


def is_collectable(name: str) -> bool:
    return not name.startswith(".") and not name.endswith(PARTIAL_SUFFIX)


def check_name(name: str) -> None:
    if not name or "/" in name or "\\" in name or name in (".", "..") or name.startswith("."):
        raise ValueError("a file name is one path segment that does not start with a dot")


class Transport(abc.ABC):
    @abc.abstractmethod
    def deliver(self, name: str, content: bytes) -> str:
        """Put ``content`` at ``name`` at the bank, whole or not at all; the location."""

    @abc.abstractmethod
    def incoming(self, *, min_age_seconds: float = 60.0) -> list[str]:
        """The names of the whole files waiting for us, sorted: none that changed within
        the last ``min_age_seconds`` (0 takes every file there)."""

    @abc.abstractmethod
    def read(self, name: str) -> bytes: ...

    @abc.abstractmethod
    def collected(self, name: str) -> None:
        """Move ``name`` out of the way (to ``processed/``) once its content is stored here."""

    def close(self) -> None:  # noqa: B027 - optional
        """Release the connection, if any."""


def same_bytes(existing: bytes, content: bytes) -> bool:
    return hashlib.sha256(existing).digest() == hashlib.sha256(content).digest()


class DirectoryTransport(Transport):
    """Two directories on this machine (development, tests, a bank share mounted here)."""

    def __init__(self, *, outbound: str, inbound: str, **_: Any) -> None:
        self.outbound, self.inbound = Path(outbound), Path(inbound)

    def deliver(self, name: str, content: bytes) -> str:
        check_name(name)
        self.outbound.mkdir(parents=True, exist_ok=True)
        final = self.outbound / name
        if final.exists():
            return self._already_there(final, content)
        temporary = self.outbound / temporary_name(name)
        try:
            with open(temporary, "xb") as handle:
                handle.write(content)
                handle.flush()
                os.fsync(handle.fileno())
            try:
                # A link, not a rename: it fails when the name exists, so a racing
                # deliverer's whole file is never replaced.
                os.link(temporary, final)
            except FileExistsError:
                return self._already_there(final, content)
        except OSError as exc:
            raise TransportError(f"cannot write {name}: {exc.strerror}") from exc
        finally:
            temporary.unlink(missing_ok=True)
        directory = os.open(self.outbound, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
        return str(final)

    def _already_there(self, final: Path, content: bytes) -> str:
        if same_bytes(final.read_bytes(), content):
            return str(final)
        raise DeliveryConflict(f"{final.name} is already delivered with other bytes")

    def incoming(self, *, min_age_seconds: float = 60.0) -> list[str]:
        if not self.inbound.is_dir():
            return []
        now = time.time()
        return sorted(
            p.name
            for p in self.inbound.iterdir()
            if p.is_file() and is_collectable(p.name) and now - p.stat().st_mtime >= min_age_seconds
        )

    def read(self, name: str) -> bytes:
        check_name(name)
        return (self.inbound / name).read_bytes()

    def collected(self, name: str) -> None:
        check_name(name)
        processed = self.inbound / "processed"
        processed.mkdir(exist_ok=True)
        os.replace(self.inbound / name, processed / name)


TRANSPORT_KINDS = {
    "directory": "payments.nacha.transports.DirectoryTransport",
    "sftp": "payments.nacha.sftp.SftpTransport",
}
_KEYS = {
    "directory": {"kind", "outbound", "inbound"},
    "sftp": {
        "kind",
        "host",
        "port",
        "username",
        "private_key_path",
        "host_key",
        "outbound",
        "inbound",
        "timeout_seconds",
    },
}
_REQUIRED = {
    "directory": {"kind", "outbound", "inbound"},
    "sftp": {"kind", "host", "username", "private_key_path", "host_key", "outbound", "inbound"},
}
TRANSPORT_ACCEPTED = (
    "None, {'kind': 'directory', 'outbound': path, 'inbound': path}, or {'kind': 'sftp', "
    "'host', 'port' (22), 'username', 'private_key_path', 'host_key' ('<type> <base64>'), "
    "'outbound', 'inbound', 'timeout_seconds' (30)}"
)


def parse_transport(value: Any) -> dict[str, Any] | None:
    """``NACHA_TRANSPORT`` checked; ValueError names the key at fault."""
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("kind") not in TRANSPORT_KINDS:
        raise ValueError("must be a dict whose kind is 'directory' or 'sftp'")
    kind = value["kind"]
    if unknown := sorted(set(value) - _KEYS[kind]):
        raise ValueError(f"unknown key(s) {unknown} for kind {kind!r}")
    if missing := sorted(_REQUIRED[kind] - set(value)):
        raise ValueError(f"missing key(s) {missing} for kind {kind!r}")
    port = value.get("port", 22)
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise ValueError("port must be 1-65535")
    for key in _KEYS[kind] - {"kind", "port", "timeout_seconds"}:
        if key in value and not (isinstance(value[key], str) and value[key]):
            raise ValueError(f"{key} must be a non-empty string")
    return dict(value)


def transport_open(options: dict[str, Any] | None = None) -> Transport:
    """A transport of ``NACHA_TRANSPORT``'s kind, or of ``options`` (checked by
    ``parse_transport``) when given: the bank's statements may wait elsewhere. The caller
    closes it."""
    if options is None:
        from payments import conf  # not at import: payments.conf checks the setting here

        options = parse_transport(conf.NACHA_TRANSPORT)
        if options is None:
            raise ImproperlyConfigured("PAYMENTS['NACHA_TRANSPORT'] is not set")
    return import_string(TRANSPORT_KINDS[options["kind"]])(**options)
