"""SFTP to the bank's drop, with paramiko (the ``sftp`` extra).

The bank's host key is pinned in the settings (``host_key``: ``"ssh-ed25519 AAAA..."``): an
unknown or changed key refuses the connection, never trusts it on first use. We authenticate
with a private key file. Delivery follows ``transports``' rules: a temporary name, then an
SFTP rename, which OpenSSH's server refuses when the name exists (it links, it does not
replace), so a file already delivered is compared, never overwritten.

The server's links are refused as a directory's are: its listing carries each entry's own
(lstat) mode, so a link, pipe, socket or device is a ``Stray``, never collected. SFTP has no
``O_NOFOLLOW``: ``read`` checks the name with ``lstat`` before opening it (nothing but a regular
file is opened), the opened handle with ``fstat``, and the name with ``lstat`` again after the
read. Each must show a regular file (``NotARegularFile`` otherwise), and all three the same one
(size, mtime, owner, mode; ``FileChanged`` otherwise): the bytes of a link's target swapped in
between the checks are dropped, never stored.
"""

from __future__ import annotations

import errno
import posixpath
import stat
import threading
import time
from typing import Any

import paramiko

from bank.nacha.transports import (
    REFUSED_DIRECTORY,
    DeliveryConflict,
    FileChanged,
    NotARegularFile,
    Stray,
    Transport,
    TransportError,
    check_name,
    is_collectable,
    same_bytes,
    stray_kind,
    temporary_name,
)


def _missing(exc: OSError) -> bool:
    return isinstance(exc, FileNotFoundError) or getattr(exc, "errno", None) == errno.ENOENT


class SftpTransport(Transport):
    def __init__(
        self,
        *,
        host: str,
        username: str,
        private_key_path: str,
        host_key: str,
        outbound: str,
        inbound: str,
        port: int = 22,
        timeout_seconds: float = 30.0,
        **_: Any,
    ) -> None:
        self.host, self.port, self.username = host, port, username
        self.private_key_path = private_key_path
        self.outbound, self.inbound = outbound, inbound
        self.timeout = timeout_seconds
        key_type, _, key_text = host_key.partition(" ")
        try:
            self.host_key = paramiko.PKey.from_type_string(key_type, _b64(key_text.split()[0]))
        except (ValueError, IndexError, paramiko.SSHException) as exc:
            raise ValueError(f"host_key is not '<type> <base64>': {exc}") from None
        self._client: paramiko.SSHClient | None = None
        self._sftp: paramiko.SFTPClient | None = None
        self._lock = threading.Lock()

    def _connect(self) -> paramiko.SFTPClient:
        if self._sftp is not None:
            return self._sftp
        client = paramiko.SSHClient()
        client.set_missing_host_key_policy(paramiko.RejectPolicy())
        name = self.host if self.port == 22 else f"[{self.host}]:{self.port}"
        client.get_host_keys().add(name, self.host_key.get_name(), self.host_key)
        try:
            client.connect(
                self.host,
                port=self.port,
                username=self.username,
                key_filename=self.private_key_path,
                timeout=self.timeout,
                banner_timeout=self.timeout,
                auth_timeout=self.timeout,
                allow_agent=False,
                look_for_keys=False,
            )
            self._sftp = client.open_sftp()
            self._sftp.get_channel().settimeout(self.timeout)
        except (paramiko.SSHException, OSError) as exc:
            client.close()
            raise TransportError(f"cannot reach {name} over SFTP: {exc}") from exc
        self._client = client
        return self._sftp

    def _call(self, action):
        with self._lock:
            try:
                return action(self._connect())
            except (paramiko.SSHException, EOFError, ConnectionError) as exc:
                self.close()
                raise TransportError(f"SFTP to {self.host} failed: {exc}") from exc

    def deliver(self, name: str, content: bytes) -> str:
        check_name(name)
        final = posixpath.join(self.outbound, name)

        def go(sftp: paramiko.SFTPClient) -> str:
            if (existing := self._read_if_there(sftp, final)) is not None:
                return self._already_there(final, existing, content)
            temporary = posixpath.join(self.outbound, temporary_name(name))
            try:
                with sftp.open(temporary, "wbx") as handle:
                    handle.write(content)
                    handle.flush()
                if sftp.stat(temporary).st_size != len(content):
                    raise TransportError(f"{name}: the server kept a short copy")
                try:
                    sftp.rename(temporary, final)
                except OSError:
                    existing = self._read_if_there(sftp, final)
                    if existing is None:
                        raise
                    return self._already_there(final, existing, content)
            except OSError as exc:
                raise TransportError(f"cannot write {name} over SFTP: {exc}") from exc
            finally:
                try:
                    sftp.remove(temporary)
                except OSError:
                    pass  # renamed: nothing left under the temporary name
            return final

        return self._call(go)

    @staticmethod
    def _read_if_there(sftp: paramiko.SFTPClient, path: str) -> bytes | None:
        try:
            with sftp.open(path, "rb") as handle:
                return handle.read()
        except OSError as exc:
            if _missing(exc):
                return None
            raise

    @staticmethod
    def _already_there(final: str, existing: bytes, content: bytes) -> str:
        if same_bytes(existing, content):
            return final
        raise DeliveryConflict(f"{posixpath.basename(final)} is already delivered with other bytes")

    def incoming(self, *, min_age_seconds: float = 60.0) -> list[str]:
        """The whole files: each regular, collectable file whose size and mtime are the same
        in two listings ``min_age_seconds`` apart, timed by our monotonic clock.

        Never the server's mtime against our clock: the bank's clock may be ahead (its new
        files would wait for hours) or behind (a file still being written would look old),
        and a writer may set any mtime it likes. A file that changed between the listings is
        left for the next round."""
        first = self._call(self._listing)
        if not first or min_age_seconds <= 0:
            return sorted(first)
        time.sleep(min_age_seconds)
        second = self._call(self._listing)
        return sorted(name for name, seen in first.items() if second.get(name) == seen)

    def _listing(self, sftp: paramiko.SFTPClient) -> dict[str, tuple[int, int]]:
        try:
            entries = sftp.listdir_attr(self.inbound)
        except OSError as exc:
            raise TransportError(f"cannot list {self.inbound}: {exc}") from exc
        return {
            e.filename: (e.st_size or 0, e.st_mtime or 0)
            for e in entries
            if stat.S_ISREG(e.st_mode or 0) and is_collectable(e.filename)
        }

    def strays(self) -> list[Stray]:
        def go(sftp: paramiko.SFTPClient) -> list[Stray]:
            try:
                entries = sftp.listdir_attr(self.inbound)
            except OSError as exc:
                raise TransportError(f"cannot list {self.inbound}: {exc}") from exc
            return sorted(
                Stray(e.filename, kind)
                for e in entries
                if is_collectable(e.filename) and (kind := stray_kind(e.st_mode or 0)) is not None
            )

        return self._call(go)

    def read(self, name: str) -> bytes:
        """See the module docstring: lstat, open, fstat, read, lstat; one regular file or
        ``NotARegularFile``."""
        check_name(name)
        path = posixpath.join(self.inbound, name)

        def go(sftp: paramiko.SFTPClient) -> bytes:
            checked = _regular(name, sftp.lstat(path))
            with sftp.open(path, "rb") as handle:
                opened = _regular(name, handle.stat())
                content = handle.read()
            after = _regular(name, sftp.lstat(path))
            if not checked == opened == after:
                raise FileChanged(f"{name} changed while it was read: left for the next round")
            return content

        return self._call(go)

    def collected(self, name: str) -> None:
        check_name(name)

        def go(sftp: paramiko.SFTPClient) -> None:
            processed = posixpath.join(self.inbound, "processed")
            try:
                sftp.mkdir(processed)
            except OSError:
                pass  # already there
            sftp.posix_rename(posixpath.join(self.inbound, name), posixpath.join(processed, name))

        self._call(go)

    def set_aside(self, name: str) -> str:
        check_name(name)

        def go(sftp: paramiko.SFTPClient) -> str:
            refused = posixpath.join(self.inbound, REFUSED_DIRECTORY)
            try:
                sftp.mkdir(refused)
            except OSError:
                pass  # already there
            # A link named refused would carry the entry out of the drop: a real directory only.
            if not stat.S_ISDIR(sftp.lstat(refused).st_mode or 0):
                raise TransportError(f"cannot set {name} aside: {refused} is not a directory")
            moved = posixpath.join(refused, name)
            try:
                # The server renames the entry itself: a link is moved, its target untouched.
                sftp.posix_rename(posixpath.join(self.inbound, name), moved)
            except OSError as exc:
                raise TransportError(f"cannot set {name} aside over SFTP: {exc}") from exc
            return moved

        return self._call(go)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
        self._client = self._sftp = None


def _regular(name: str, attributes: paramiko.SFTPAttributes) -> tuple:
    """What identifies one regular file over SFTP (version 3 has no inode); NotARegularFile
    for anything else."""
    mode = attributes.st_mode or 0
    if not stat.S_ISREG(mode):
        raise NotARegularFile(name, stray_kind(mode) or "directory")
    return (attributes.st_size, attributes.st_mtime, attributes.st_uid, attributes.st_gid, mode)


def _b64(text: str) -> bytes:
    import base64

    return base64.b64decode(text, validate=True)
