"""The sandbox processor over HTTP posting signed callbacks to the live server's endpoint, as
the end-to-end tests run it: the module's processor settings point at it while it runs."""

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def sandbox_posting_callbacks(
    module_settings, live_server, *, return_after_seconds: float
) -> Iterator[object]:
    """A started sandbox settling a debit 50 ms after it is created and returning a returnable
    one ``return_after_seconds`` after its settlement; stopped, and the client reset, after."""
    from payments.processor.backends.http import reset_client
    from sandbox import FaultConfig, SandboxProcessor

    server = SandboxProcessor(
        callback_url=f"{live_server.url}/callbacks/processor/",
        faults=FaultConfig(settle_after_seconds=0.05, return_after_seconds=return_after_seconds),
        callback_backoff_seconds=0.05,
    ).start()
    module_settings.PROCESSOR_BASE_URL = server.base_url
    reset_client()
    try:
        yield server
    finally:
        server.stop()
        reset_client()
