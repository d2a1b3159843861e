"""The documentation's references are generated from the code (scripts/docs_reference.py) and
committed: each test here fails when a committed page differs from what the code declares now,
naming the page. ``make docs`` writes them again."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _generator():
    spec = importlib.util.spec_from_file_location(
        "docs_reference", ROOT / "scripts" / "docs_reference.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


docs_reference = _generator()


@pytest.mark.parametrize("page", sorted(docs_reference.PAGES))
def test_the_committed_reference_is_what_the_code_declares(page):
    committed = docs_reference.REFERENCE / page
    assert committed.exists(), f"docs/reference/{page} is missing: run make docs"
    assert committed.read_text() == docs_reference.PAGES[page](), (
        f"docs/reference/{page} differs from the code: run make docs and commit it"
    )


def test_every_setting_has_its_meaning_and_every_meaning_a_setting(tmp_path, monkeypatch):
    import yaml

    meanings = yaml.safe_load(docs_reference.MEANINGS.read_text())
    del meanings["TRIAGE"]["ALERT_WEBHOOK_URL"]
    edited = tmp_path / "settings.yml"
    monkeypatch.setattr(docs_reference, "MEANINGS", edited)

    edited.write_text(yaml.safe_dump(meanings))
    with pytest.raises(SystemExit, match=r"no meaning for TRIAGE\['ALERT_WEBHOOK_URL'\]"):
        docs_reference.settings_reference()

    meanings["TRIAGE"]["ALERT_WEBHOOK_URL"] = "back"
    meanings["PAYMENTS"]["NO_SUCH_SETTING"] = "a setting no app declares"
    edited.write_text(yaml.safe_dump(meanings))
    with pytest.raises(SystemExit, match="NO_SUCH_SETTING"):
        docs_reference.settings_reference()


def test_a_setting_added_to_an_app_shows_in_the_reference(monkeypatch):
    from payments.kernel.setting_specs import Flag
    from triage import conf

    monkeypatch.setitem(conf.SPECS, "DOCS_PROBE", Flag(False))
    monkeypatch.setattr(conf.triage_settings, "names", conf.triage_settings.names | {"DOCS_PROBE"})
    with pytest.raises(SystemExit, match=r"no meaning for TRIAGE\['DOCS_PROBE'\]"):
        docs_reference.settings_reference()


def test_the_error_codes_include_every_reinitiation_rule_and_the_envelopes_own():
    from payments.services.reinitiation import RULES

    codes = docs_reference.error_codes()

    assert set(RULES) <= set(codes)
    for code, status, error_type in (
        ("database_unavailable", 503, "api_error"),
        ("internal_error", 500, "api_error"),
        ("idempotency_key_reused", 422, "invalid_request_error"),
        ("idempotency_key_in_use", 409, "idempotency_error"),
        ("queue_unavailable", 503, "api_error"),
        ("merchant_forbidden", 403, "permission_error"),
    ):
        statuses, types, _ = codes[code]
        assert (statuses, types) == ({status}, {error_type}), code


def test_the_settings_reference_counts_and_names_every_apps_dict_and_its_links_lead_to_pages():
    import re

    from payments.kernel.app_settings import AppSettings

    text = (ROOT / "docs" / "reference" / "settings.md").read_text()
    intro = text.split("\n## ")[0]
    words = {3: "three", 4: "four", 5: "five"}

    assert f"are {words[len(AppSettings.every)]} Django settings" in intro
    assert all(f"`{app.setting}`" in intro for app in AppSettings.every)
    # A row points to a page of the site, never to a section of the README.
    assert "README" not in text
    targets = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text)
    assert targets and all((ROOT / "docs" / "reference" / t).resolve().exists() for t in targets)


def test_no_module_code_reads_a_settings_dict_outside_the_four_apps_settings():
    """Every setting goes through an app's declared specs: a host dict read by name elsewhere
    (as the books' ``PAYMENTS_BOOKS`` was) stays out of the generated reference."""
    import re

    reads = re.compile(r"getattr\(\s*settings,\s*[\"']([A-Z_]+)[\"']")
    found = {
        (path.relative_to(ROOT).as_posix(), name)
        for app in ("payments", "callbacks", "bank", "triage")
        for path in (ROOT / app).rglob("*.py")
        for name in reads.findall(path.read_text())
    }

    # Django's and Celery's own settings, which the apps read and never declare.
    hosts_own = {"LOGGING", "CELERY_BROKER_TRANSPORT_OPTIONS"}
    assert {name for _, name in found} <= hosts_own, found
