"""``run_sqs_worker`` knowing one more kind of message, ``crashing_event``: a processor event whose
work kills the worker outright (SIGKILL, as the kernel's out-of-memory killer or a segfault ends
a process: no handler, no cleanup) while the file named by ``CRASH_MARKER`` exists, and that is
applied as a processor event once the file is gone (the fix).

Run as ``python -m tests.callbacks.crashing_worker <run_sqs_worker options>`` with the
environment of ``worker_support.worker_env``.
"""

import dataclasses
import os
import signal
import sys
from pathlib import Path

CRASHING_EVENT = "crashing_event"


def main() -> None:
    import django

    django.setup()
    from django.core.management import call_command

    from callbacks.handlers import DEFAULT_HANDLERS
    from callbacks.schema import PROCESSOR_EVENT

    event = DEFAULT_HANDLERS[PROCESSOR_EVENT]
    marker = Path(os.environ["CRASH_MARKER"])

    def crash_or_apply(message) -> str:
        if marker.exists():
            os.kill(os.getpid(), signal.SIGKILL)
        return event.func(message)

    # The worker copies DEFAULT_HANDLERS when it starts; the command builds it after this.
    DEFAULT_HANDLERS[CRASHING_EVENT] = dataclasses.replace(event, func=crash_or_apply)
    call_command("run_sqs_worker", *sys.argv[1:])


if __name__ == "__main__":
    main()
