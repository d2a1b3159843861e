import pytest

from tests.chaos.histories import clean_history


@pytest.fixture
def history():
    """A clean run in the database, and what the processor recorded of it."""
    return clean_history()
