"""The distribution as a host gets it: the wheel built from this repository, installed with pip
into a fresh virtualenv, and the host project's tests run there against the installed apps.

A file the wheel leaves out (a migration, a template) fails here, where running the tests from
the work tree would find it on disk. The host project is copied outside the repository and the
repository is kept off ``sys.path``, so ``payments``, ``callbacks`` and ``triage`` can only come
from the virtualenv. Its dependencies are resolved from the wheel's own ranges, held to
requirements.txt's lock, so what runs is what the rest of the suite tests.
"""

import os
import re
import shutil
import subprocess
import sys
import zipfile
from email.parser import HeaderParser
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import pytest

import payments

ROOT = Path(__file__).resolve().parents[2]
DIST_INFO = f"django_ach_payments-{payments.__version__}.dist-info"
APPS = ("payments", "callbacks", "bank", "triage")
# Everything else at the top of the repository is the project around the module.
PROJECT = ("config", "bench", "chaos", "devstack", "demo", "deploy", "sandbox", "tests", "localsqs")
# The host's own test dependencies beside the wheel (factories, its settings, a database driver).
HOST_TEST_REQUIREMENTS = [
    "pytest",
    "pytest-django",
    "factory-boy",
    "django-environ",
    "psycopg[binary]",
]
# What the host suite needs of this repository's test support, besides tests/host itself.
TEST_SUPPORT = (
    "__init__.py",
    "compile_ahead.py",
    "conftest.py",
    "factories.py",
    "gunicorn_support.py",
    "localsqs.py",
    "localstack.py",
    "pg_cluster.py",
    "sqs_parameters.py",
    "sqs_server.py",
    "waiting.py",
    "callbacks/__init__.py",
    "callbacks/worker_support.py",
)
# What the host's interpreter imports the apps from, and the version it sees.
WHERE = "import callbacks, payments, triage; print(payments.__file__, callbacks.__file__, "
WHERE += "triage.__file__, payments.__version__)"
# Left out of the source copy the wheel is built from: environments, caches, build output.
NOT_SOURCE = shutil.ignore_patterns(
    ".git", ".venv*", "node_modules", "__pycache__", "*.pyc", "build", "*.egg-info", "var"
)


def run(args: list, *, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    result = subprocess.run(
        [str(arg) for arg in args], capture_output=True, text=True, timeout=timeout, **kwargs
    )
    assert result.returncode == 0, f"{args}\n{result.stdout[-6000:]}\n{result.stderr[-4000:]}"
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Built from a copy of the work tree, so the build's litter (build/, *.egg-info) stays out
    of it, and without build isolation: setuptools and wheel come from the project's venv."""
    source = tmp_path_factory.mktemp("source") / "repo"
    shutil.copytree(ROOT, source, ignore=NOT_SOURCE)
    out = tmp_path_factory.mktemp("wheelhouse")
    build = ["wheel", "--no-deps", "--no-build-isolation", "-w", out, source]
    run([sys.executable, "-m", "pip", *build], timeout=120)
    (built,) = out.glob("*.whl")
    return built


def app_files() -> set[str]:
    """Every file of the four apps in the work tree, as the wheel would name it."""
    return {
        path.relative_to(ROOT).as_posix()
        for app in APPS
        for path in (ROOT / app).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }


def test_the_wheel_holds_the_four_apps_whole_and_nothing_of_the_project(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())

    assert {name.split("/")[0] for name in names} == {*APPS, DIST_INFO}
    assert not {name for name in names if name.split("/")[0] in PROJECT}
    assert not app_files() - names, "files of the apps missing from the wheel"
    assert "payments/migrations/0001_initial.py" in names
    assert "triage/templates/admin/triage/dashboard.html" in names
    assert "triage/templates/admin/triage/_nocs.html" in names
    assert "payments/templates/admin/payments/notificationofchange/confirm_apply.html" in names


def test_the_wheel_reports_the_modules_version_and_its_own_dependencies(wheel):
    with zipfile.ZipFile(wheel) as archive:
        metadata = HeaderParser().parsestr(archive.read(f"{DIST_INFO}/METADATA").decode())
        assert f"{DIST_INFO}/LICENSE" in archive.namelist()

    assert metadata["Version"] == payments.__version__
    required = {re.split(r"[\s<>=!~;\[]", line)[0] for line in metadata.get_all("Requires-Dist")}
    assert {"Django", "djangorestframework", "django-fsm-2", "celery", "boto3"} <= required
    # The project's, not the module's: the apps import none of them.
    assert not required & {"django-environ", "gunicorn", "whitenoise", "honcho"}


def lock_constraints(directory: Path) -> Path:
    """requirements.txt as a pip constraints file (which takes no extras)."""
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    constraints = directory / "constraints.txt"
    constraints.write_text("\n".join(re.sub(r"\[[^]]*\]", "", line) for line in lines) + "\n")
    return constraints


def host_project_copy(directory: Path) -> Path:
    """tests/host with the test support it imports and the sandbox processor it runs on
    loopback (a development app, not in the wheel), outside the repository."""
    project = directory / "host-project"
    for name in TEST_SUPPORT:
        (project / "tests" / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / "tests" / name, project / "tests" / name)
    shutil.copytree(
        ROOT / "tests" / "host",
        project / "tests" / "host",
        ignore=shutil.ignore_patterns("__pycache__", Path(__file__).name),
    )
    shutil.copytree(ROOT / "sandbox", project / "sandbox", ignore=NOT_SOURCE)
    # The local SQS server is a Node.js program, looked for beside tests/.
    (project / "localsqs").symlink_to(ROOT / "localsqs")
    return project


def host_environment(project: Path) -> dict[str, str]:
    """The host's own path and settings, and a database of its own: the suite around this test
    may hold the test database of DATABASE_URL open."""
    url = urlsplit(os.environ.get("DATABASE_URL", "postgres://postgres@127.0.0.1:5432/payments"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "VIRTUAL_ENV"))}
    env.pop("TEST_SQS_SERVER", None)  # the host suite runs on the default server, as in make test
    return {
        **env,
        "PYTHONPATH": str(project),
        "DJANGO_SETTINGS_MODULE": "tests.host.settings",
        "DATABASE_URL": urlunsplit(url._replace(path=f"{url.path}_wheel")),
    }


def test_a_fresh_virtualenv_runs_the_host_project_on_the_installed_wheel(wheel, tmp_path):
    venv = tmp_path / "venv"
    python = venv / "bin" / "python"
    run([sys.executable, "-m", "venv", venv], timeout=60)
    install = ["install", "--quiet", "-c", lock_constraints(tmp_path), wheel]
    run([python, "-m", "pip", *install, *HOST_TEST_REQUIREMENTS], timeout=240)
    project = host_project_copy(tmp_path)
    env = host_environment(project)

    where = run([python, "-c", WHERE], cwd=project, env=env, timeout=60).stdout.split()
    assert all(Path(path).is_relative_to(venv) for path in where[:-1]), where
    assert where[-1] == payments.__version__

    suite = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/host"]
    result = run([python, *suite], cwd=project, env=env, timeout=300)
    assert " passed" in result.stdout.splitlines()[-1]
