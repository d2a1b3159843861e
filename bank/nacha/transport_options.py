"""The ``NACHA_TRANSPORT`` setting's kinds and checker, apart from the transports themselves:
``bank.conf`` checks the setting with them, and the transports read the checked setting."""

from __future__ import annotations

from typing import Any

TRANSPORT_KINDS = {
    "directory": "bank.nacha.transports.DirectoryTransport",
    "sftp": "bank.nacha.sftp.SftpTransport",
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
