"""Start and stop LocalStack's SQS and KMS (host mode, no Docker) on a free loopback port.

The second SQS server of the test suite: unlike fauxqs it returns several messages of one group
in one receive, in order, as AWS may, so the worker's partial-batch path runs against a server.
Its KMS is the vault's key holder in the KMS tests (tests/bank/vault/test_kms.py).
It lives in a virtual environment of its own (``make localstack``, Python 3.13), since its
requirements would clash with the project's. Same interface as ``tests.localsqs.LocalSqs``.
"""

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".venv-localstack"
PYTHON = VENV / "bin" / "python"
STAMP = VENV / ".requirements-installed"
START_TIMEOUT_SECONDS = 60
# KMS starts with SQS in the same process: it adds well under a second to the start.
SERVICES = ("sqs", "kms")


def _free_port() -> int:
    # LocalStack needs a port number up front (it cannot report one it picked itself); the
    # start retries on another port if this one is taken in between.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _command() -> list[str]:
    command = [str(PYTHON), "-m", "localstack.runtime.main"]
    # A test run that is killed (a CI timeout, a second Ctrl-C) skips the session's teardown;
    # LocalStack holds half a gigabyte, so where util-linux's setpriv is there the kernel ends
    # it with its parent.
    setpriv = shutil.which("setpriv")
    return [setpriv, "--pdeathsig", "TERM", *command] if setpriv else command


class LocalStack:
    def __init__(self, root: Path | None = None) -> None:
        """``root``: where its files and log go (kept); by default a temporary directory,
        removed by ``cleanup()``."""
        self.process: subprocess.Popen | None = None
        self.port: int | None = None
        self.root = root
        self._owns_root = root is None
        self._log = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.root / "localstack.log"

    def environment(self, port: int) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        listen = f"127.0.0.1:{port}"
        env.update(
            # This machine looks like a container to LocalStack's detection, which would then
            # listen on every interface and keep its state under the shared /tmp/localstack;
            # host mode keeps all of it under this session's own directory.
            OVERRIDE_IN_DOCKER="0",
            FILESYSTEM_ROOT=str(self.root),
            # Its default server (twisted) ignores the address and binds 0.0.0.0.
            GATEWAY_SERVER="hypercorn",
            GATEWAY_LISTEN=listen,
            LOCALSTACK_HOST=listen,  # the host and port in the queue URLs it hands out
            SQS_ENDPOINT_STRATEGY="path",
            SERVICES=",".join(SERVICES),
            EAGER_SERVICE_LOADING="1",
            PERSISTENCE="0",
            DNS_ADDRESS="0",  # its DNS server would want port 53 on every interface
            SKIP_SSL_CERT_DOWNLOAD="1",
            DISABLE_EVENTS="1",
            LS_LOG="warn",
        )
        return env

    def start(self, port: int = 0) -> "LocalStack":
        if not STAMP.exists():
            raise RuntimeError(
                f"LocalStack is not installed in {VENV}: run `make localstack` "
                "(it needs Python 3.13)"
            )
        if self.root is None:
            self.root = Path(tempfile.mkdtemp(prefix="localstack-"))
        self.root.mkdir(parents=True, exist_ok=True)
        for _ in range(3):
            self.port = port or _free_port()
            self._log = open(self.log_path, "a")  # noqa: SIM115 - closed in stop()
            self.process = subprocess.Popen(
                _command(),
                cwd=self.root,
                env=self.environment(self.port),
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            if self._wait_ready():
                return self
            self.stop()
            if port:
                break
        raise RuntimeError(f"LocalStack did not start; its log:\n{self.log_path.read_text()}")

    def _wait_ready(self) -> bool:
        """True once SQS and KMS answer; False if the process exited (a port taken, say)."""
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            try:
                health = requests.get(f"{self.endpoint_url}/_localstack/health", timeout=1)
                running = health.ok and health.json().get("services", {})
                if running and all(running.get(name) == "running" for name in SERVICES):
                    return True
            except (requests.ConnectionError, requests.Timeout, ValueError):
                pass
            time.sleep(0.1)
        return False

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self._log:
            self._log.close()
            self._log = None

    def restart(self) -> None:
        """Stop and start again on the same port (state is lost, as after an outage)."""
        port = self.port
        self.stop()
        self.start(port)

    def cleanup(self) -> None:
        self.stop()
        if self._owns_root and self.root is not None:
            shutil.rmtree(self.root, ignore_errors=True)
            self.root = None
