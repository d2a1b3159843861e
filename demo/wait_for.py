"""Wait until a TCP port accepts connections or a URL answers 200, then exit 0 (or 1 on timeout).

Usage: python demo/wait_for.py tcp:HOST:PORT | http://...  [--timeout SECONDS]
"""

import argparse
import socket
import sys
import time
import urllib.error
import urllib.request


def ready(target: str) -> bool:
    if target.startswith("tcp:"):
        _, host, port = target.split(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1):
                return True
        except OSError:
            return False
    try:
        with urllib.request.urlopen(target, timeout=2) as response:  # noqa: S310 - local URL
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("target")
    parser.add_argument("--timeout", type=float, default=120)
    args = parser.parse_args()
    deadline = time.monotonic() + args.timeout
    while time.monotonic() < deadline:
        if ready(args.target):
            return 0
        time.sleep(0.3)
    print(f"timed out after {args.timeout:.0f} s waiting for {args.target}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
