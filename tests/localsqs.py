"""Start and stop the local SQS-compatible server (fauxqs) on a free loopback port."""

import os
import subprocess
import time
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
LAUNCHER = ROOT / "localsqs" / "server.mjs"


class LocalSqs:
    def __init__(self) -> None:
        self.process: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, port: int = 0) -> "LocalSqs":
        if not (ROOT / "localsqs" / "node_modules" / "fauxqs").exists():
            raise RuntimeError("fauxqs is not installed: run `make deps` (npm ci in localsqs/)")
        self.process = subprocess.Popen(
            ["node", str(LAUNCHER), str(port)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        line = self.process.stdout.readline().strip()
        if not line.startswith("LISTENING "):
            self.process.kill()
            raise RuntimeError(f"local SQS server did not start: {line!r}")
        self.port = int(line.split()[1])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                requests.get(f"{self.endpoint_url}/health", timeout=1)
                return self
            except requests.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("local SQS server did not answer its health check")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def cleanup(self) -> None:
        """At the session's end: fauxqs keeps everything in memory, so stopping is all."""
        self.stop()

    def restart(self) -> None:
        """Stop and start again on the same port (state is lost, as after an outage)."""
        port = self.port
        self.stop()
        self.start(port)


def aws_test_environment() -> None:
    # Any credentials are accepted by the local server; boto3 only needs some to sign with.
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
