from tests.callbacks.worker_support import fast_retries  # noqa: F401 - shared fixture
