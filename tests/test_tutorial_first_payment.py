"""docs/tutorial/first-payment.md, run as a reader runs it: every ``sh`` block of the page, in
order, in one shell, from an empty directory.

The page's own text is what runs (only its first block, where the reader says where the clone
is and which ports are free, is the test's). The clone is a copy of this work tree with its
``.venv`` and the local SQS server's ``node_modules`` linked in, so building the wheel leaves
nothing behind here; the new project's virtualenv is fresh, its dependencies resolved from the
wheel's own ranges held to requirements.txt's lock (as tests/host/test_wheel.py does).
"""

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.gunicorn_support import free_port
from tests.host.test_wheel import NOT_SOURCE, lock_constraints

ROOT = Path(__file__).resolve().parents[1]
TUTORIAL = ROOT / "docs" / "tutorial" / "first-payment.md"
BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.DOTALL | re.MULTILINE)


def tutorial_blocks() -> list[str]:
    return BLOCK.findall(TUTORIAL.read_text())


def clone_copy(directory: Path) -> Path:
    clone = directory / "django-ach-payments"
    shutil.copytree(ROOT, clone, ignore=NOT_SOURCE, symlinks=True)
    (clone / ".venv").symlink_to((ROOT / ".venv").resolve())
    (clone / "localsqs" / "node_modules").symlink_to((ROOT / "localsqs" / "node_modules").resolve())
    return clone


def test_the_tutorials_first_block_is_where_the_reader_names_the_clone_and_the_ports():
    first = tutorial_blocks()[0]

    assert first.startswith('export ACH_REPO="$HOME/src/django-ach-payments"\n')
    assert re.search(r"^export SQS_PORT=\d+ PROCESSOR_PORT=\d+ WEB_PORT=\d+$", first, re.M)
    assert len(first.splitlines()) == 2


# In the scale tier (make test-slow): a fresh virtualenv built from the wheel, 100 to 150 s of
# pip, the longest test make test had. The wheel's install into a fresh virtualenv stays in make
# test (tests/host/test_wheel.py); the page's first block is checked here, beside it.
@pytest.mark.scale
@pytest.mark.subprocess
def test_the_tutorials_commands_take_a_new_project_to_a_submitted_refund(tmp_path):
    blocks = tutorial_blocks()
    clone = clone_copy(tmp_path)
    work = tmp_path / "reader"
    work.mkdir()
    # python3.11 as the reader's: the interpreter this virtualenv was made from.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3.11").symlink_to(sys._base_executable)
    ports: dict[str, int] = {}
    for name in ("SQS_PORT", "PROCESSOR_PORT", "WEB_PORT"):
        while (port := free_port()) in ports.values():
            pass
        ports[name] = port
    setup = (
        f'export ACH_REPO="{clone}"\n'
        + "export "
        + " ".join(f"{name}={port}" for name, port in ports.items())
    )
    script = ["set -euo pipefail", setup]
    for number, block in enumerate(blocks[1:], start=2):
        script += [f'echo "### block {number} at $SECONDS s"', block]
    script.append('echo "### done at $SECONDS s"')
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTEST_", "VIRTUAL_ENV", "DJANGO_", "DATABASE_URL"))
    }
    env["PATH"] = f"{bin_dir}{os.pathsep}{env['PATH']}"
    env["PIP_CONSTRAINT"] = str(lock_constraints(tmp_path))
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"

    log = tmp_path / "tutorial.log"
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-c", "\n".join(script)],
            cwd=work,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=240)
        except subprocess.TimeoutExpired:
            pass
        finally:
            # The page's last block stops its servers; on a failure part way, this does.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()
    output = log.read_text()

    assert process.returncode == 0, output[-8000:]
    assert "### done" in output
    assert '"state":"pending"' in (work / "shop" / "payment.json").read_text()
    assert '"state":"confirmed"' in (work / "shop" / "confirmed.json").read_text()
    refund = (work / "shop" / "refund.json").read_text()
    assert '"amount":"10.00"' in refund and '"state":"pending"' in refund
    assert '"state":"submitted"' in (work / "shop" / "refund-submitted.json").read_text()
    # The project's apps came from the wheel the page built, not from the clone.
    where = subprocess.run(
        [work / "shop" / ".venv/bin/python", "-c", "import payments; print(payments.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout
    assert Path(where.strip()).is_relative_to(work / "shop" / ".venv")
