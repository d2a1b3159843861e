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
