import collections
import os

import pytest
from rest_framework.test import APIClient

from tests import sqs_server
from tests.compile_ahead import compile_ahead_join, compile_ahead_start
from tests.factories import UserFactory
from tests.pg_cluster import PgCluster, django_migrate, schema_dump, sql_load

# tests/host/ is a foreign host project with its own settings and user model: it runs in its own
# pytest invocation (``--ds=tests.host.settings``, see the Makefile), never beside the others.
HOST_SETTINGS = "tests.host.settings"
collect_ignore = [] if os.environ.get("DJANGO_SETTINGS_MODULE") == HOST_SETTINGS else ["host"]


def pytest_configure(config):
    try:
        sqs_server.check()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None


def pytest_collection_modifyitems(config, items):
    """A test that needs what only one of the two SQS servers does (several messages of one
    group in one receive, or KMS beside SQS: LocalStack; refusing a queue change AWS accepts:
    fauxqs) is left out of the other server's run, not skipped: CI runs both (make test, then
    make test-slow's LOCALSTACK_TESTS)."""
    wrong = "fauxqs_only" if sqs_server.LOCALSTACK else "localstack_only"
    left_out = [item for item in items if item.get_closest_marker(wrong)]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = [item for item in items if not item.get_closest_marker(wrong)]
    if os.environ.get("PYTEST_XDIST_WORKER"):
        _slow_modules_first(items)


# --- one migrated database for every xdist process ----------------------------------------------
# Each process used to migrate its own test database (6 s of CPU each on this machine, 3 to 4
# processes at once on 2 cores). The controller migrates one template database before the
# processes start, and each process's test database is PostgreSQL's copy of it (``CREATE
# DATABASE ... TEMPLATE``, a third of a second); the migrate Django then runs on the copy finds
# nothing to apply. Made afresh for every run, from this checkout's migrations, and dropped at
# its end: nothing is reused from one run to the next (``--reuse-db``'s risk).


def _template_database() -> tuple[str, str]:
    """(the template database's name, the URL of its server's ``postgres`` database)."""
    from django.conf import settings

    db = settings.DATABASES["default"]
    name = f"test_{db['NAME']}_template"
    server = f"postgres://{db['USER']}@{db['HOST'] or '127.0.0.1'}:{db['PORT'] or 5432}"
    if db.get("PASSWORD"):
        server = server.replace("@", f":{db['PASSWORD']}@", 1)
    return name, server


def _template_drop(name: str, server: str) -> None:
    import psycopg

    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_setupnodes(config, specs):
    """In the controller, before the processes start: the sources compiled and the test
    modules rewritten once for every process (``tests.compile_ahead``, in a thread), and the
    migrated template (a host project's run, on a database other than PostgreSQL, migrates in
    its processes as before)."""
    from django.conf import settings

    compile_ahead_start(config)
    if "postgresql" not in settings.DATABASES["default"]["ENGINE"]:
        return
    import psycopg

    from tests.pg_cluster import django_migrate

    name, server = _template_database()
    _template_drop(name, server)
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
        # Committing as its copies will (django_db_setup below; a setting of a database is not
        # copied with it). Measured, the migrations gain nothing from it: DDL, not commits.
        conn.execute(f'ALTER DATABASE "{name}" SET synchronous_commit = off')
    django_migrate(f"{server}/{name}")
    config.stash[_TEMPLATE] = name
    # The same database as SQL, for the clusters of the processes' own (pg_cluster_session):
    # loaded in a quarter of a second where their migrate took 4 s alone, 10 s with every
    # process busy. Dumped here, before any process copies the template (a copy is refused
    # while another session is on it).
    config.stash[_TEMPLATE_DUMP] = schema_dump(f"{server}/{name}")


_TEMPLATE = pytest.StashKey[str]()
_TEMPLATE_DUMP = pytest.StashKey[str]()


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """Each process learns the template's name, and its dump, from the controller."""
    if _TEMPLATE in node.config.stash:
        node.workerinput["template_database"] = node.config.stash[_TEMPLATE]
        node.workerinput["template_dump"] = node.config.stash[_TEMPLATE_DUMP]


def pytest_unconfigure(config):
    compile_ahead_join(config)
    if _TEMPLATE in config.stash:
        _template_drop(config.stash[_TEMPLATE], _template_database()[1])


@pytest.fixture(scope="session")
def django_db_modify_db_settings(request, django_db_modify_db_settings_parallel_suffix):
    """A process's test database is a copy of the controller's template, when there is one."""
    from django.conf import settings

    template = getattr(request.config, "workerinput", {}).get("template_database")
    if template:
        settings.DATABASES["default"].setdefault("TEST", {})["TEMPLATE"] = template


@pytest.fixture(scope="session")
def django_db_setup(django_db_setup, django_db_blocker):
    """The process's test database on the shared server commits without waiting for its WAL
    flush (``synchronous_commit = off``, set on the database, so the worker, gunicorn and Celery
    processes a test starts on it commit so too). A thousand tests run with
    ``transaction=True`` and commit at every step, on a server six runs share: each commit
    waited its turn at the disk. What a commit makes visible, and every lock, are the same; only
    a crash of the server could lose the last commits, and no test crashes it (the tests that
    stop a database do it to a cluster of their own, ``pg_cluster``, never to this one)."""
    from django.db import connection

    if connection.vendor != "postgresql":
        yield
        return
    with django_db_blocker.unblock():
        with connection.cursor() as cursor:
            name = connection.ops.quote_name(connection.settings_dict["NAME"])
            cursor.execute(f"ALTER DATABASE {name} SET synchronous_commit = off")
            cursor.execute("SET synchronous_commit = off")  # this connection, opened before
    yield


SLOW_TIERS = ("scale", "subprocess", "browser")
# The modules whose tests took longest on this machine (2 shared cores, make test's pytest -n 4,
# seconds of wall time per test, or per module for ``WHOLE_MODULES``, with every process busy:
# a test that takes 4 s alone takes 10 to 27 s there): handed out before every other one,
# longest first, so that none of them starts near the end of a run and keeps one process busy
# while the others idle. Before, a module's place came from its size: the model run started a
# third of the way in, and the schema fuzz test (a module of one test) was handed out last and
# ran 72 s alone at the end. The tutorial's fresh virtualenv, the model's shards, the full fuzz,
# the timeout outage, the 500 payments of two workers and three of the day totals' four ledger
# histories have since moved to the scale tier (make test-slow).
# tests/test_celery.py (up to 30 s) stays out: run before tests/triage/test_bulk.py in one
# process, something it leaves behind keeps two of test_bulk's tests from finding their tasks
# on the in-memory broker (an order the suite never had; to be found and fixed).
LONGEST_FIRST = (
    "tests/bank/test_upgrade.py",  # back to 0.1.0 once, three upgrades (WHOLE_MODULES)
    "tests/payments/test_create_sqlite.py",  # a fresh SQLite database, migrated: 27 s
    "tests/callbacks/test_degraded_processor.py",  # two workers through a flap: 12 to 22 s each
    "tests/callbacks/test_breaker_outage.py",  # two workers through an outage: 20 s
    "tests/payments/test_api_database_outage.py",  # a cluster and gunicorn: 19 s, one process
    "tests/bank/nacha/test_sealing_migration.py",  # back to 0019 once, three tests (WHOLE_MODULES)
    "tests/test_api_fuzz.py",  # schemathesis, a third of the scale tier's cases: 17 s
    "tests/callbacks/test_audit_clock.py",  # a worker under faketime: 16 s
    "tests/callbacks/test_worker_crash_loop.py",  # workers killed by a message: 12 s
    "tests/triage/test_metrics_gunicorn.py",  # gunicorn's workers scraped: 12 s
    "tests/payments/test_submit_sqlite.py",  # a fresh SQLite database, migrated: 11 s
    "tests/triage/test_bulk_celery.py",  # a Celery worker killed mid-job: 11 s
    "tests/triage/test_browser.py",  # chromium: 11 s
    "tests/triage/test_browser_bulk.py",  # chromium: 10 s
    "tests/callbacks/test_events_pull_hostile.py",  # two pullers at once: 10 s
    "tests/payments/test_webhooks_never_lost.py",  # Celery workers killed mid-delivery: 2 to 9 s
    "tests/callbacks/test_worker_processes.py",  # real workers and signals: 4 to 9 s
    "tests/test_compile_ahead.py",  # an xdist run in a fresh directory: 8 s
    "tests/model/test_pipeline_model.py",  # 20 sequences: 6 s
)
# Modules whose module-scoped fixture starts processes (gunicorn on a database cluster) or takes
# the test database back to an older schema once for its tests (``tests.database_snapshots``):
# under pytest-xdist one process runs each of them whole, so the fixture runs once.
WHOLE_MODULES = frozenset(
    {
        "tests/payments/test_api_database_outage.py",
        "tests/bank/test_upgrade.py",
        "tests/bank/nacha/test_sealing_migration.py",
    }
)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` (the Makefile's): tests handed out one at a time, in collection
    order, each of ``WHOLE_MODULES`` to one process. xdist's own loadgroup finds its groups by
    rewriting an attribute of the test's node id that pytest 9 no longer has, so none reached
    its scheduler; this one groups by module path instead.

    A process is given more while it has at most two tests waiting (xdist's rule: a process
    starts a test only once it knows the next one). While one of ``LONGEST_FIRST`` waits or runs
    there, it is given only that next one, and the first short one in the queue rather than the
    queue's head: a test queued behind the model run waited its four minutes while the other
    processes ran out of work (the tutorial's, handed out third, started at 240 s)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneAtATime(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::")[0]
            return module if module in WHOLE_MODULES else nodeid

        def _reschedule(self, node) -> None:
            if node.shutting_down or not self.workqueue:
                return super()._reschedule(node)
            pending = [
                nodeid
                for unit in self.assigned_work[node].values()
                for nodeid, done in unit.items()
                if not done
            ]
            if not any(map(is_longest, pending)):
                return super()._reschedule(node)
            if len(pending) > 1:
                return None  # the long test and the one after it
            short = next(
                (scope for scope, unit in self.workqueue.items() if not any(map(is_longest, unit))),
                None,
            )
            if short is not None:
                self.workqueue.move_to_end(short, last=False)
            self._assign_work_unit(node)
            return None

    return OneAtATime(config, log)


def is_longest(nodeid: str) -> bool:
    return nodeid.split("::")[0] in LONGEST_FIRST


def _slow_modules_first(items) -> None:
    """Under pytest-xdist, hand out ``LONGEST_FIRST`` in its order, then the modules that start
    processes, then the others by size (``--no-loadscope-reorder`` keeps this order): a long
    test handed out last would keep one process busy while the others idle. Every process
    collects the same order, as xdist requires."""

    def module(item) -> str:
        return item.nodeid.split("::")[0]

    def longest(item) -> int:
        name = module(item)
        return LONGEST_FIRST.index(name) if name in LONGEST_FIRST else len(LONGEST_FIRST)

    sizes = collections.Counter(module(item) for item in items)
    slow = {module(item) for item in items if any(map(item.get_closest_marker, SLOW_TIERS))}
    items.sort(
        key=lambda item: (
            longest(item),
            module(item) not in slow,
            -sizes[module(item)],
            module(item),
        )
    )


# Rows the migrations' post_migrate signal makes, the same after every flush.
KEPT_BY_THE_FLUSH = frozenset({"django_content_type", "auth_permission"})


@pytest.fixture(scope="session", autouse=True)
def _flush_by_delete():
    """Empty the tables after a ``transaction=True`` test with ``DELETE`` instead of Django's
    ``TRUNCATE``: the same empty tables (sequences are not reset either way), but TRUNCATE
    replaces every table's and index's files and waits for the server's fsync, about a second
    per test on this machine against a few hundredths. The foreign keys Django creates on
    PostgreSQL are deferrable, so the order of the deletes does not matter. A flush that must
    reset sequences or cascade keeps Django's own statement.

    Either runs with ``session_replication_role = replica`` for its transaction (``SET LOCAL``;
    the test database's user is a superuser): the flush empties the history tables too, which
    the database's history guard refuses to any ordinary session (``payments.history``).

    The content types and permissions are kept (``KEPT_BY_THE_FLUSH``): Django's flush deleted
    them and its post_migrate signal made the same rows again at once, about two hundred inserts
    after every transactional test, a third of a second. The signal still runs, and makes any
    row a test deleted; no test adds or changes one."""
    from django.db.backends.postgresql.operations import DatabaseOperations

    truncate = DatabaseOperations.sql_flush
    maintenance = "SET LOCAL session_replication_role = replica;"

    def sql_flush(self, style, tables, *, reset_sequences=False, allow_cascade=False):
        if reset_sequences or allow_cascade or not tables:
            statements = truncate(
                self, style, tables, reset_sequences=reset_sequences, allow_cascade=allow_cascade
            )
            return [maintenance, *statements] if statements else statements
        deletes = [
            f"DELETE FROM {self.quote_name(table)};"
            for table in tables
            if table not in KEPT_BY_THE_FLUSH
        ]
        return [maintenance, "SET CONSTRAINTS ALL DEFERRED;", *deletes]

    DatabaseOperations.sql_flush = sql_flush
    yield
    DatabaseOperations.sql_flush = truncate


@pytest.fixture(scope="session")
def local_sqs(tmp_path_factory):
    """The session's SQS server (``tests.sqs_server``), over real HTTP on loopback."""
    # Under pytest's own temporary directory, which it prunes, so a killed run leaves no litter.
    server = sqs_server.start(tmp_path_factory.mktemp("sqs-server"))
    yield server
    server.cleanup()


@pytest.fixture(scope="session")
def pg_cluster_session(request):
    """A PostgreSQL cluster of this session's own, migrated, for tests that stop the database
    (the shared server must never be stopped). Use ``pg_cluster`` in a test; this one is for
    module- or session-scoped fixtures that start processes on it. Under pytest-xdist its
    database is loaded from the controller's dump of the migrated template; otherwise migrated
    here."""
    cluster = PgCluster(database="outage_app").init().start()
    try:
        dump = getattr(request.config, "workerinput", {}).get("template_dump")
        if dump:
            sql_load(cluster.url, dump)
        else:
            django_migrate(cluster.url)
        yield cluster
    finally:
        cluster.remove()


@pytest.fixture
def pg_cluster(pg_cluster_session):
    """The session's own cluster, running when the test starts, whatever an earlier test did.

    The test may ``stop()`` (an outage), ``stop(mode="immediate")`` (a crash) and ``start()``
    it; ``url`` names its migrated database for the processes the test starts. Rows stay from
    one test to the next: use names of the test's own."""
    pg_cluster_session.start()
    return pg_cluster_session


class ModuleSettings:
    """The module's settings by their own names, each routed into its app's dict:
    ``module_settings.WORKER_MAX_ATTEMPTS = 2`` sets ``settings.CALLBACKS["WORKER_MAX_ATTEMPTS"]``
    through pytest-django's ``settings`` fixture (so it is undone after the test, and the
    apps' settings objects reload on ``setting_changed``); reading one gives what the app reads
    (``callbacks.conf.WORKER_MAX_ATTEMPTS``); ``del`` removes the key, as a host that leaves it
    out. Each name belongs to one app (``payments.kernel.app_settings.AppSettings.every``)."""

    def __init__(self, settings) -> None:
        object.__setattr__(self, "_settings", settings)

    @staticmethod
    def _app(name: str):
        from payments.kernel.app_settings import AppSettings

        for app in AppSettings.every:
            if name in app.names:
                return app
        raise AttributeError(f"{name} is not a setting of the payments module")

    def __getattr__(self, name: str):
        return getattr(self._app(name), name)

    def __setattr__(self, name: str, value) -> None:
        app = self._app(name)
        current = getattr(self._settings, app.setting, {})
        setattr(self._settings, app.setting, {**current, name: value})

    def __delattr__(self, name: str) -> None:
        app = self._app(name)
        current = getattr(self._settings, app.setting, {})
        setattr(self._settings, app.setting, {k: v for k, v in current.items() if k != name})


@pytest.fixture
def module_settings(settings) -> ModuleSettings:
    """Set, read or delete one of the module's settings by its name (``ModuleSettings``)."""
    import bank.conf  # noqa: F401 - each app's settings object, known once imported
    import callbacks.conf  # noqa: F401
    import payments.conf  # noqa: F401
    import triage.conf  # noqa: F401

    return ModuleSettings(settings)


@pytest.fixture
def fast_retries(module_settings):
    """Retries at once (backoff cap 0), so a message's whole retry budget takes a fraction of a
    second; the backoff schedule itself is tested on its own."""
    module_settings.WORKER_BACKOFF_BASE_SECONDS = 0
    module_settings.WORKER_BACKOFF_CAP_SECONDS = 0


@pytest.fixture
def user(db):
    return UserFactory()


@pytest.fixture
def api_client(user):
    from rest_framework.authtoken.models import Token

    client = APIClient()
    token = Token.objects.create(user=user)
    client.credentials(HTTP_AUTHORIZATION=f"Token {token.key}")
    return client


@pytest.fixture
def sqs_queues(local_sqs, module_settings, request, monkeypatch):
    """Fresh main FIFO queue and DLQ for one test, created on the local SQS server.

    Yields a small namespace with ``client``, ``url``, ``dlq_url`` and ``parameters``; settings
    point at them. Every call the test makes through ``callbacks.sqs`` in this process has its
    parameters checked against SQS's model (the gateway skips that check in production), and
    the test fails at teardown if one was invalid.
    """
    import types
    import uuid

    import boto3

    from callbacks import sqs
    from callbacks.queues import queues_ensure
    from tests.sqs_parameters import SqsParameterCheck

    parameters = SqsParameterCheck(monkeypatch)
    suffix = uuid.uuid4().hex[:12]
    module_settings.SQS_ENDPOINT_URL = local_sqs.endpoint_url
    module_settings.SQS_QUEUE_NAME = f"payments-{suffix}.fifo"
    module_settings.SQS_DLQ_NAME = f"payments-dlq-{suffix}.fifo"
    sqs.reset()
    client = boto3.client("sqs", endpoint_url=local_sqs.endpoint_url, region_name="us-east-1")
    # Created the way production creates them (setup_queues), so tests run on the real shape:
    # high-throughput FIFO, RedrivePolicy to the DLQ, 30 s visibility timeout.
    queues_ensure(visibility_timeout=30)
    url = client.get_queue_url(QueueName=module_settings.SQS_QUEUE_NAME)["QueueUrl"]
    dlq_url = client.get_queue_url(QueueName=module_settings.SQS_DLQ_NAME)["QueueUrl"]
    yield types.SimpleNamespace(client=client, url=url, dlq_url=dlq_url, parameters=parameters)
    sqs.reset()
    assert not parameters.invalid, "SQS calls with parameters invalid for the service model:\n" + (
        "\n".join(parameters.invalid)
    )


@pytest.fixture
def sandbox(module_settings):
    """The sandbox processor on loopback, with the processor client pointed at it.

    Injected timeouts sleep 2 s against a client read timeout of 1 s: a timeout test waits a
    second, and an ordinary call on a loaded machine (CI runs a pytest process per core and two
    more) is not cut short; callbacks (none sent: no callback URL) settle quickly.
    """
    from payments.processor.backends.http import reset_client
    from sandbox import FaultConfig, SandboxProcessor

    server = SandboxProcessor(
        faults=FaultConfig(timeout_seconds=2.0, settle_after_seconds=0.05),
        callback_backoff_seconds=0.05,
    ).start()
    module_settings.PROCESSOR_BASE_URL = server.base_url
    module_settings.PROCESSOR_TIMEOUT_SECONDS = 1.0
    module_settings.PROCESSOR_CONNECT_TIMEOUT_SECONDS = 1.0
    reset_client()
    yield server
    server.stop()
    reset_client()
