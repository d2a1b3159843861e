"""A webhook receiver on loopback, as a merchant would write one: it verifies every delivery's
Standard Webhooks signature with the ``standardwebhooks`` library, drops a repeat by its
``webhook-id``, and counts both. It can fail for a while (``fail_first``), hang, trickle its
answer, or answer with a redirect, for tests and demos of retries and disabling."""

import hashlib
import json
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError


class WebhookReceiver:
    def __init__(self, secrets: list[str] | None = None) -> None:
        self.secrets = list(secrets or [])
        self.fail_first = 0
        self.status = 200
        self.hang_seconds = 0.0
        self.redirect_to: str | None = None
        # Answer with a body this long (announced, then streamed until the sender hangs up).
        self.answer_bytes = 0
        # Trickle the answer: a header line, or a byte of the body, every this many seconds,
        # until the sender hangs up (each wait within its read timeout, their sum not).
        self.trickle_headers = 0.0
        self.trickle_body = 0.0
        self.lock = threading.Lock()
        self.requests = 0
        self.verified: list[dict] = []  # first delivery of each webhook-id, parsed
        self.ids = Counter()  # every verified request by webhook-id
        self.refused = 0  # signature did not verify
        self.headers: list[dict] = []
        # Every verified request: its path, webhook-id, the body's id, type and SHA-256, and the
        # status it was answered (what the chaos invariants check, ``chaos.invariants.webhooks``).
        self.receipts: list[dict] = []
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/hooks"

    @property
    def repeats(self) -> int:
        return sum(count - 1 for count in self.ids.values())

    def start(self) -> "WebhookReceiver":
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - the http.server name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                answer = receiver.receive(dict(self.headers.items()), body, path=self.path)
                if receiver.hang_seconds:
                    time.sleep(receiver.hang_seconds)
                if receiver.trickle_headers or receiver.trickle_body:
                    self.trickle(answer)
                    return
                self.send_response(answer)
                if receiver.redirect_to:
                    self.send_header("Location", receiver.redirect_to)
                length = receiver.answer_bytes or 2
                self.send_header("Content-Length", str(length))
                self.end_headers()
                if not receiver.answer_bytes:
                    self.wfile.write(b"ok")
                    return
                chunk = b"x" * 65536
                try:
                    for _ in range(length // len(chunk)):
                        self.wfile.write(chunk)
                except OSError:
                    pass  # the sender read what it wanted and hung up

            def trickle(self, answer: int) -> None:
                self.wfile.write(f"HTTP/1.1 {answer} X\r\n".encode())
                try:
                    while receiver.trickle_headers:
                        self.wfile.write(b"X-Slow: x\r\n")
                        self.wfile.flush()
                        time.sleep(receiver.trickle_headers)
                    self.wfile.write(b"Content-Length: 100000\r\n\r\n")
                    while True:
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(receiver.trickle_body)
                except OSError:
                    pass  # the sender hung up

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def receive(self, headers: dict, body: bytes, path: str = "/hooks") -> int:
        with self.lock:
            self.requests += 1
            self.headers.append(headers)
            if self.requests <= self.fail_first:
                return 500
            if self.redirect_to:
                return 302
            for secret in self.secrets:
                try:
                    Webhook(secret).verify(body, headers)
                except WebhookVerificationError:
                    continue
                webhook_id = {k.lower(): v for k, v in headers.items()}["webhook-id"]
                self.ids[webhook_id] += 1
                parsed = json.loads(body)
                if self.ids[webhook_id] == 1:
                    self.verified.append(parsed)
                self.receipts.append(
                    {
                        "path": path,
                        "webhook_id": webhook_id,
                        "id": parsed.get("id"),
                        "type": parsed.get("type"),
                        "sha256": hashlib.sha256(body).hexdigest(),
                        "status": self.status,
                    }
                )
                return self.status
            self.refused += 1
            return 401
