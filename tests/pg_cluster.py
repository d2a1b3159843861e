"""A PostgreSQL cluster of a test's own, for tests that take the database away.

The shared server (the one ``DATABASE_URL`` names) is never stopped by a test: other test runs
use it at the same time. ``PgCluster`` makes a throwaway cluster with ``initdb`` in a temporary
directory, on a free loopback port, and starts and stops it as an outage would: ``stop()`` is
PostgreSQL's fast shutdown (open sessions are terminated, clients see "server closed the
connection"), ``stop(mode="immediate")`` is a crash. The port stays the same across restarts,
so ``url`` keeps naming it, and a process configured with it sees the same server come back.

Run as root (as the test suite is here), the server runs as the ``postgres`` OS user, which
PostgreSQL requires; otherwise as the current user.

    cluster = PgCluster().init().start()
    django_migrate(cluster.url)     # the project's schema, as ``manage.py migrate`` makes it
    cluster.stop()                  # the outage
    cluster.start()                 # the recovery
    cluster.remove()
"""

import os
import pwd
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psycopg

from tests.gunicorn_support import free_port

ROOT = Path(__file__).resolve().parents[1]
PG_BIN = Path(os.environ.get("PG_BIN", "/usr/lib/postgresql/15/bin"))
SERVER_USER = "postgres"

# A test cluster holds nothing worth a crash-safe write; these make initdb and start-up fast.
_CONF = """
listen_addresses = '127.0.0.1'
port = {port}
unix_socket_directories = '{socket_dir}'
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 16MB
max_connections = 50
log_min_messages = warning
"""


class PgCluster:
    def __init__(self, *, database: str = "app", port: int | None = None, bin_dir: Path = PG_BIN):
        self.database = database
        self.port = port or free_port()
        self._port_given = port is not None
        self.bin_dir = bin_dir
        self.directory = Path(tempfile.mkdtemp(prefix="pg-cluster-"))
        self.data_dir = self.directory / "data"
        self.log_path = self.directory / "server.log"
        self._as_server_user = os.geteuid() == 0
        if self._as_server_user:
            # mkdtemp makes the directory private to root; the server must own it.
            entry = pwd.getpwnam(SERVER_USER)
            os.chown(self.directory, entry.pw_uid, entry.pw_gid)
        self._database_created = False

    @property
    def url(self) -> str:
        return self.url_for(self.database)

    def url_for(self, database: str) -> str:
        return f"postgres://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def _run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        if self._as_server_user:
            command = ["runuser", "-u", SERVER_USER, "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, check=False)
        if check and result.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{result.stdout}{result.stderr}")
        return result

    def init(self) -> "PgCluster":
        self._run(
            "initdb",
            "--pgdata",
            str(self.data_dir),
            "--username",
            SERVER_USER,
            "--auth",
            "trust",
            "--encoding",
            "UTF8",
            "--no-locale",
            "--no-sync",
        )
        with open(self.data_dir / "postgresql.conf", "a") as conf:
            conf.write(_CONF.format(port=self.port, socket_dir=self.directory))
        return self

    @property
    def running(self) -> bool:
        status = self._run("pg_ctl", "status", "--pgdata", str(self.data_dir), check=False)
        return status.returncode == 0

    def start(self, *, timeout: float = 30) -> "PgCluster":
        """Start the server (nothing happens if it runs) and wait until it accepts connections;
        the first start creates ``database``."""
        if not self.running:
            self._start_server(timeout)
        self._wait_accepting(timeout)
        if not self._database_created:
            self.execute(f'CREATE DATABASE "{self.database}"', database="postgres")
            self._database_created = True
        return self

    def _start_server(self, timeout: float) -> None:
        """``pg_ctl start``. The free port was picked at ``__init__``, seconds before the server
        binds it, and the machine runs other tests (pytest-xdist's other processes among them):
        if another process took it meanwhile, the first start moves to a new free port (the last
        ``port`` line of postgresql.conf wins). Later starts keep the port ``url`` names."""
        for _ in range(3):
            try:
                self._run(
                    "pg_ctl",
                    "start",
                    *("--pgdata", str(self.data_dir), "--log", str(self.log_path)),
                    *("--wait", "--timeout", str(int(timeout))),
                )
                return
            except RuntimeError:
                taken = "Address already in use" in self.log()
                if not taken or self._port_given or self._database_created:
                    raise
            self.port = free_port()
            with open(self.data_dir / "postgresql.conf", "a") as conf:
                conf.write(f"port = {self.port}\n")
        raise RuntimeError(f"no free port for the cluster:\n{self.log()}")

    def stop(self, *, mode: str = "fast") -> "PgCluster":
        """Stop the server: ``fast`` terminates open sessions and shuts down cleanly,
        ``immediate`` kills it as a crash would. Nothing happens if it is not running."""
        if self.running:
            self._run("pg_ctl", "stop", "--pgdata", str(self.data_dir), "--mode", mode, "--wait")
        return self

    def restart(self) -> "PgCluster":
        return self.stop().start()

    def _wait_accepting(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                with psycopg.connect(self.url_for("postgres"), connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def execute(self, sql: str, params: tuple | None = None, *, database: str | None = None):
        """Run one statement in autocommit on ``database`` (default: the cluster's own);
        the rows it returns, if any."""
        with psycopg.connect(self.url_for(database or self.database), autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description else []

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def remove(self) -> None:
        """Stop the server at once and delete the cluster."""
        self.stop(mode="immediate")
        shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> "PgCluster":
        return self

    def __exit__(self, *exc_info) -> None:
        self.remove()


def _checked(what: str, args: list[str], **options) -> str:
    """Run ``args``; its stdout, or ``RuntimeError`` naming ``what`` with what it printed."""
    result = subprocess.run(args, capture_output=True, text=True, check=False, **options)
    if result.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def django_env(url: str, **extra: str) -> dict[str, str]:
    """The environment of a Django process of this project whose database is ``url``."""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings.test"),
        "DATABASE_URL": url,
        **extra,
    }


def django_run(url: str, code: str, *, timeout: float = 120) -> str:
    """Run ``code`` in a fresh Python process with Django set up on ``url``; its stdout.

    A process of its own, so the test process's connections (pytest-django's test database)
    are never pointed elsewhere."""
    script = "import django\ndjango.setup()\n" + code
    return _checked(
        "Django process",
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=django_env(url),
        timeout=timeout,
    )


def schema_dump(url: str, *, bin_dir: Path = PG_BIN) -> str:
    """The database at ``url`` as SQL (``pg_dump``: tables, rows, functions, triggers), without
    owners or grants, for ``sql_load`` into another server's database."""
    return _checked("pg_dump", [str(bin_dir / "pg_dump"), "--no-owner", "--no-privileges", url])


def sql_load(url: str, sql: str, *, bin_dir: Path = PG_BIN) -> None:
    """Run ``sql`` (a ``schema_dump``) in the database at ``url``, stopping at its first error."""
    _checked(
        "psql",
        [str(bin_dir / "psql"), "--quiet", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", url],
        input=sql,
    )


def django_migrate(url: str) -> None:
    """Apply the project's migrations to the database at ``url``, as ``manage.py migrate``."""
    django_run(
        url,
        "from django.core.management import call_command\n"
        "call_command('migrate', interactive=False, verbosity=0)\n",
    )
