"""Which SQS server a test session runs against, and starting it.

fauxqs by default; ``TEST_SQS_SERVER=localstack`` for the second run of the SQS-heavy modules
(see the Makefile). The two differ where AWS leaves room: LocalStack returns several messages of
one group in one receive, in order, as AWS may, and fauxqs never does.
"""

import os
from pathlib import Path

from tests.localsqs import LocalSqs, aws_test_environment

SERVERS = ("fauxqs", "localstack")
NAME = os.environ.get("TEST_SQS_SERVER", "fauxqs")
LOCALSTACK = NAME == "localstack"


def check() -> None:
    if NAME not in SERVERS:
        raise ValueError(f"TEST_SQS_SERVER={NAME!r}: expected one of {', '.join(SERVERS)}")


def start(root: Path | None = None):
    """The server, started; ``cleanup()`` stops it. ``root``: a directory for a server that keeps
    files (LocalStack's state and log)."""
    check()
    aws_test_environment()
    if LOCALSTACK:
        from tests.localstack import LocalStack

        return LocalStack(root).start()
    return LocalSqs().start()
