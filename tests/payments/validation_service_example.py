"""A worked example of a validation service backend (``PAYMENTS["ACCOUNT_VALIDATION_SERVICE"]``)
and the HTTP double it is tested against.

``BankDataService`` asks a bank-data API whether the account a token names is open: ``POST
<BANK_DATA_API_URL>/v1/account_checks`` with the token, answered ``{"status": "open" | "closed"
| "unknown", "check_id": ...}``. A host writes its own the same way: one class, one method, its
own settings; the module records what it answers."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import requests
from django.conf import settings

from payments.validation_methods import Outcome, ValidationService


class BankDataService(ValidationService):
    def validate(self, *, account_token: str, merchant_id: str) -> Outcome:
        answer = requests.post(
            f"{settings.BANK_DATA_API_URL}/v1/account_checks",
            json={"account_token": account_token, "merchant_id": merchant_id},
            timeout=getattr(settings, "BANK_DATA_API_TIMEOUT", 5),
        )
        answer.raise_for_status()
        body = answer.json()
        evidence = {"check_id": str(body.get("check_id", ""))[:64], "status": body.get("status")}
        if body.get("status") == "open":
            return Outcome(True, evidence=evidence)
        return Outcome(False, evidence=evidence, reason=f"bank data: {body.get('status')}"[:255])


class BankDataDouble:
    """The bank-data API on loopback: answers each token with ``statuses[token]`` (default
    ``open``); a status of three digits (``"500"``, ``"429"``, ``"400"``) answers that HTTP
    status, ``"slow"`` answers after ``delay`` seconds. ``requests`` lists what it was asked."""

    def __init__(self) -> None:
        self.statuses: dict[str, str] = {}
        self.delay = 1.0
        self.requests: list[dict] = []
        double = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length))
                double.requests.append(body)
                status = double.statuses.get(body["account_token"], "open")
                if status.isdigit():
                    self.send_response(int(status))
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if status == "slow":
                    time.sleep(double.delay)
                    status = "open"
                payload = json.dumps({"status": status, "check_id": f"chk_{len(double.requests)}"})
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.end_headers()
                self.wfile.write(payload.encode())

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def start(self) -> BankDataDouble:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
