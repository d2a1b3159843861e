"""A real HTTP server standing in for "Other", the processor of the worked example backend
(``payments.processor.backends.example``): it takes transfers, answers lookups and sends signed
callbacks of its own shape, for the tests that run the pipeline through that backend."""

import json
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class OtherProcessorServer:
    """Other's API on a free loopback port: transfers kept by request key, charged once.

    ``account_token`` scripts an answer: ``tok_other_reject...`` is refused (422),
    ``tok_other_down...`` answers 503 the first time it is seen.
    """

    def __init__(self, token: str) -> None:
        self.token = token
        self.transfers: dict[str, dict] = {}
        self.requests: list[dict] = []
        self._seen_down: set[str] = set()
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "OtherProcessorServer":
        threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        ).start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def answer(self, method: str, url: str, headers: dict, body: bytes) -> tuple[int, dict]:
        with self._lock:
            self.requests.append({"method": method, "url": url, "headers": headers, "body": body})
            if headers.get("X-Api-Token") != self.token:
                return 401, {"problem": "bad token"}
            parts = urlsplit(url)
            if parts.path != "/ach/v2/transfers":
                return 404, {"problem": "no such route"}
            if method == "GET":
                [reference] = parse_qs(parts.query)["reference"]
                found = self.transfers.get(reference)
                return 200, {"transfers": [found] if found else []}
            return self._transfer(headers["X-Request-Key"], json.loads(body))

    def _transfer(self, key: str, payload: dict) -> tuple[int, dict]:
        token = payload["account_token"]
        if token.startswith("tok_other_reject"):
            return 422, {"problem": "account closed"}
        if token.startswith("tok_other_down") and token not in self._seen_down:
            self._seen_down.add(token)
            return 503, {"problem": "maintenance"}
        if key in self.transfers:
            return 200, {"transfer": self.transfers[key]}
        self.transfers[key] = {"id": f"tr_{uuid.uuid4().hex[:12]}", "state": "accepted", **payload}
        return 201, {"transfer": self.transfers[key]}

    def _handler(self):
        double = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _serve(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                status, answer = double.answer(self.command, self.path, dict(self.headers), body)
                raw = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            do_GET = do_POST = _serve

        return Handler
