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

Only regular files of the drop itself are read. A symbolic link (to anywhere: it names a file
the bank did not put in the drop), a pipe, a socket or a device is never opened: ``strays``
names each, and ``set_aside`` moves the entry itself (a rename never follows a link) into
``refused/``, so a human finds it and the next round does not meet it again. A name checked
regular and then swapped for a link before it is opened is caught at the opening
(``NotARegularFile``), never read.
"""

from __future__ import annotations

import abc
import errno
import hashlib
import os
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from bank import conf
from bank.nacha.transport_options import TRANSPORT_KINDS, parse_transport

PARTIAL_SUFFIX = ".partial"
REFUSED_DIRECTORY = "refused"


class TransportError(Exception):
    """The transport could not do it now: retry later."""


class DeliveryConflict(TransportError):
    """A file of that name is already at the bank with other bytes: a human must look."""


class NotARegularFile(TransportError):
    """The name in the drop is not a regular file (any more): it was not read."""

    def __init__(self, name: str, kind: str) -> None:
        super().__init__(f"{name} in the bank's drop is a {kind}, not a regular file")
        self.name, self.kind = name, kind


class FileChanged(TransportError):
    """The file changed while it was read: its bytes were dropped; the next round reads it."""


@dataclass(frozen=True, order=True)
class Stray:
    """An entry of the drop that is neither a regular file nor a directory."""

    name: str
    kind: str


def stray_kind(mode: int) -> str | None:
    """What an entry of the drop is, from its own (lstat) mode, when it is one we never read;
    None for a regular file or a directory (``processed/`` lives in the drop)."""
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return None
    if stat.S_ISLNK(mode):
        return "symbolic link"
    if stat.S_ISFIFO(mode):
        return "named pipe"
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "device"
    return "special file"


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
    def read(self, name: str) -> bytes:
        """The bytes of the regular file ``name`` of the drop; ``NotARegularFile`` when the
        name is (or became) anything else, without reading through it."""

    @abc.abstractmethod
    def strays(self) -> list[Stray]:
        """The collectable names of the drop that are neither a regular file nor a directory,
        sorted by name: links, pipes, sockets, devices."""

    @abc.abstractmethod
    def set_aside(self, name: str) -> str:
        """Move the entry ``name`` itself (never what a link names) into ``refused/`` of the
        drop; its new location."""

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

    def _entries(self) -> list[tuple[str, os.stat_result]]:
        """Each collectable name of the drop with its own status (lstat: a link is a link)."""
        if not self.inbound.is_dir():
            return []
        found = []
        with os.scandir(self.inbound) as entries:
            for entry in entries:
                if not is_collectable(entry.name):
                    continue
                try:
                    found.append((entry.name, entry.stat(follow_symlinks=False)))
                except FileNotFoundError:
                    continue  # gone since the listing
        return found

    def incoming(self, *, min_age_seconds: float = 60.0) -> list[str]:
        now = time.time()
        return sorted(
            name
            for name, status in self._entries()
            if stat.S_ISREG(status.st_mode) and now - status.st_mtime >= min_age_seconds
        )

    def strays(self) -> list[Stray]:
        return sorted(
            Stray(name, kind)
            for name, status in self._entries()
            if (kind := stray_kind(status.st_mode)) is not None
        )

    def read(self, name: str) -> bytes:
        """Checked (lstat) so that nothing but a regular file is opened, then opened without
        following a link (``O_NOFOLLOW``) nor waiting on a pipe (``O_NONBLOCK``) and checked
        again on the open descriptor: a name swapped after the first check is refused, never
        read through."""
        check_name(name)
        path = self.inbound / name
        checked = os.lstat(path)
        if (kind := stray_kind(checked.st_mode)) is not None:
            raise NotARegularFile(name, kind)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        try:
            descriptor = os.open(path, flags)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise NotARegularFile(name, "symbolic link") from None
            raise
        with os.fdopen(descriptor, "rb") as handle:
            opened = os.fstat(handle.fileno())
            if not stat.S_ISREG(opened.st_mode):
                raise NotARegularFile(name, stray_kind(opened.st_mode) or "directory")
            return handle.read()

    def collected(self, name: str) -> None:
        check_name(name)
        processed = self.inbound / "processed"
        processed.mkdir(exist_ok=True)
        os.replace(self.inbound / name, processed / name)

    def set_aside(self, name: str) -> str:
        check_name(name)
        refused = self.inbound / REFUSED_DIRECTORY
        try:
            refused.mkdir(exist_ok=True)
            # A link named refused would carry the entry out of the drop: a real directory only.
            if not stat.S_ISDIR(os.lstat(refused).st_mode):
                raise TransportError(f"cannot set {name} aside: {refused} is not a directory")
            os.replace(self.inbound / name, refused / name)  # renames the link, not its target
        except OSError as exc:
            raise TransportError(f"cannot set {name} aside: {exc.strerror}") from exc
        return str(refused / name)


def transport_open(options: dict[str, Any] | None = None) -> Transport:
    """A transport of ``NACHA_TRANSPORT``'s kind, or of ``options`` (checked by
    ``parse_transport``) when given: the bank's statements may wait elsewhere. The caller
    closes it."""
    if options is None:
        options = parse_transport(conf.NACHA_TRANSPORT)
        if options is None:
            raise ImproperlyConfigured("BANK['NACHA_TRANSPORT'] is not set")
    return import_string(TRANSPORT_KINDS[options["kind"]])(**options)
