"""The README is the front door: short, opening with the two commands, and every link in it
leads to a page that exists (the rest of the documentation is the site in docs/)."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"


def test_the_readme_is_short_and_opens_with_the_two_commands():
    text = README.read_text()
    first_block = re.search(r"```sh\n(.*?)```", text, re.DOTALL)

    assert len(text.splitlines()) <= 150
    assert text.index("```sh") < text.index("\n## ")  # before any section
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands[:2] == ["make demo", "make test"]


def test_every_link_of_the_readme_leads_to_a_file_and_the_newcomers_next_two_pages_are_linked():
    text = README.read_text()
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)

    missing = [target for target in targets if not (ROOT / target).exists()]
    assert missing == []
    # The two pages a newcomer reads after the README: the demo, then the install.
    assert {"docs/tutorial/quick-start.md", "docs/how-to/install.md"} <= set(targets)


def test_the_readme_links_every_how_to_and_tutorial_page():
    text = README.read_text()
    pages = sorted((ROOT / "docs").glob("how-to/*.md")) + sorted(
        (ROOT / "docs").glob("tutorial/*.md")
    )

    unlinked = [page.relative_to(ROOT).as_posix() for page in pages]
    unlinked = [page for page in unlinked if f"]({page})" not in text]
    assert unlinked == []


def test_the_readme_says_in_its_first_paragraph_what_an_adopter_must_bring_and_where_the_wheel_is():
    text = README.read_text()
    first = text[text.index("## What it is") :].split("\n\n")[1]

    assert "docs/how-to/processor-backend.md" in first
    assert "docs/how-to/bank-direct.md" in first
    assert "pip wheel --no-deps -w dist ." in first
    # One line per app, each app named.
    for app in ("payments", "callbacks", "bank", "triage"):
        assert re.search(rf"^- `{app}`: ", text, re.MULTILINE), app


def declared_dependencies() -> list[str]:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [re.split(r"[\s<>=!~;\[]", line)[0] for line in project["dependencies"]]


def test_the_install_page_names_every_declared_dependency_and_the_bank_paths_schedule():
    text = (ROOT / "docs/how-to/install.md").read_text()
    # The page's own names for the distributions (prose, not the distributions' spelling).
    spelled = {"Django": "Django", "djangorestframework": "DRF"}

    missing = [name for name in declared_dependencies() if spelled.get(name, name) not in text]
    assert missing == []
    assert text.count('include("bank.urls")') == 1
    assert "beat_schedule(bank_direct=True)" in text
    assert "three apps" not in text and "the four apps" in text.lower()
