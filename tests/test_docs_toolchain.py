"""The docs toolchain as docs/development.md states it: ``make docs`` builds with its own
requirements alone, pinned, and lets Material's end-of-life notice show."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def recipe(target: str) -> str:
    makefile = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:([^\n]*)\n((?:\t[^\n]*\n)+)", makefile, re.M)
    assert match, target
    return match.group(1) + "\n" + match.group(2)


def test_make_docs_uses_the_docs_environment_alone():
    docs = recipe("docs")

    assert "$(DOCS_PY) -m mkdocs build --strict" in docs
    assert "$(PY)" not in docs and "$(VENV)" not in docs and "requirements.txt" not in docs


def test_the_docs_requirements_are_pinned_and_hold_nothing_of_the_module():
    lines = [
        line.strip()
        for line in (ROOT / "requirements-docs.txt").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    assert lines and all(re.fullmatch(r"[A-Za-z0-9_.-]+==[\w.]+", line) for line in lines)
    names = {line.split("==")[0].lower() for line in lines}
    assert not names & {"django", "djangorestframework", "celery", "boto3", "playwright"}
    # The project's environment builds the same site (tests/test_docs_search.py), pinned alike.
    assert set(lines) <= set((ROOT / "requirements.txt").read_text().splitlines())


def test_materials_end_of_life_notice_is_not_silenced():
    assert "NO_MKDOCS_2_WARNING" not in (ROOT / "Makefile").read_text()
    assert "2027-05-05" in (ROOT / "docs" / "development.md").read_text()
