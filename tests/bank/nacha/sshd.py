"""A real OpenSSH server (Debian's openssh-server, ``scripts/ensure-sshd``) on a free loopback
port, for one test module: its own host key, config and authorized key, and the SFTP
subsystem in-process (``internal-sftp``). It logs in only the user running the tests."""

from __future__ import annotations

import getpass
import os
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

SSHD = "/usr/sbin/sshd"


@dataclass
class Sshd:
    port: int
    host_key: str  # "<type> <base64>", as the setting pins it
    client_key_path: str
    username: str
    root: Path
    process: subprocess.Popen

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)],
        check=True,
        capture_output=True,
    )


def sshd_start(root: Path) -> Sshd:
    if not os.access(SSHD, os.X_OK):
        raise RuntimeError(f"{SSHD} is missing: run scripts/ensure-sshd")
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    host_key, client_key = root / "host_ed25519", root / "client_ed25519"
    _keygen(host_key)
    _keygen(client_key)
    authorized = root / "authorized_keys"
    authorized.write_text(Path(f"{client_key}.pub").read_text())
    os.chmod(authorized, 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation's empty dir
    port = _free_port()
    config = root / "sshd_config"
    config.write_text(
        "\n".join(
            [
                f"Port {port}",
                "ListenAddress 127.0.0.1",
                f"HostKey {host_key}",
                f"PidFile {root / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "PubkeyAuthentication yes",
                "PermitRootLogin prohibit-password",
                f"AllowUsers {getpass.getuser()}",
                "StrictModes no",
                "UsePAM no",
                "Subsystem sftp internal-sftp",
                "LogLevel ERROR",
            ]
        )
        + "\n"
    )
    process = subprocess.Popen(
        [SSHD, "-D", "-e", "-f", str(config)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"sshd stopped: {process.stderr.read().decode()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                if sock.recv(4).startswith(b"SSH-"):
                    break
        except OSError:
            time.sleep(0.05)
    else:
        process.kill()
        raise RuntimeError("sshd did not answer within 15 s")
    key_type, key_text = Path(f"{host_key}.pub").read_text().split()[:2]
    return Sshd(port, f"{key_type} {key_text}", str(client_key), getpass.getuser(), root, process)
