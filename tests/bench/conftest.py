from tests.bench.test_invariants import history  # noqa: F401 - the clean history, shared
