"""The docs site's search finds every setting by its key: the site is built (MkDocs, as
``make docs`` builds it) and its search index is read as the theme's search reads it, the text
of each page split by the index's own separator (a JavaScript regular expression, the same in
Python's syntax for the characters it uses), words lower-cased, markup left out."""

import html
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TAG = re.compile(r"<[^>]+>")


def words(text: str, separator: str) -> set[str]:
    return {word.lower() for word in re.split(separator, TAG.sub(" ", text)) if word}


@pytest.fixture(scope="module")
def search_index(tmp_path_factory) -> dict:
    site = tmp_path_factory.mktemp("site")
    build = [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "-d", site]
    result = subprocess.run(
        [str(arg) for arg in build],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads((site / "search" / "search_index.json").read_text())


def setting_keys() -> list[tuple[str, str]]:
    import bank.conf  # noqa: F401 - each app's settings object, known once imported
    import callbacks.conf  # noqa: F401
    import payments.conf  # noqa: F401
    import triage.conf  # noqa: F401
    from payments.kernel.app_settings import AppSettings

    return sorted((app.setting, name) for app in AppSettings.every for name in app.names)


def test_every_setting_is_one_word_of_the_settings_reference_in_the_built_search_index(
    search_index,
):
    separator = search_index["config"]["separator"]
    reference = [
        doc for doc in search_index["docs"] if doc["location"].startswith("reference/settings/")
    ]
    indexed = set().union(*(words(doc["text"], separator) for doc in reference))

    missing = [f'{app}["{name}"]' for app, name in setting_keys() if name.lower() not in indexed]
    assert missing == []
    # A search typed as the reference writes it finds the same words.
    assert words('CALLBACKS["WORKER_PAUSE_AT"]', separator) == {"callbacks", "worker_pause_at"}


def test_the_default_separator_would_hide_the_settings_without_an_environment_variable(
    search_index,
):
    """What the separator fixes: with MkDocs' default, a key is glued to its dict's name and
    quotes, and the two the issue names were not found at all."""
    reference = [
        doc for doc in search_index["docs"] if doc["location"].startswith("reference/settings/")
    ]
    indexed = set().union(*(words(doc["text"], r"[\s\-]+") for doc in reference))

    assert "worker_pause_at" not in indexed
    assert "callback_max_body_bytes" not in indexed


def test_the_separator_splits_entities_and_keeps_decimals_and_keys_whole():
    separator = re.search(r"separator: '(.*)'", (ROOT / "mkdocs.yml").read_text()).group(1)
    separator = separator.replace("''", "'")

    assert words("BANK['BOOKS_STATEMENT_TRANSPORT']", separator) == {
        "bank",
        "books_statement_transport",
    }
    assert words(html.escape('PAYMENTS["OVER_LIMIT"] <x>'), separator) == {
        "payments",
        "over_limit",
        "x",
    }
    assert words("0.25 payments.conf", separator) == {"0.25", "payments", "conf"}
