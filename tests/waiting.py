"""The one way a test waits for something another thread or process does: poll until it holds.

A fixed sleep is either too short on a loaded machine (a flaky test) or too long on an idle one
(a slow suite); polling a condition is neither. A test that waits on a process it started names
it in ``watch``, so a crash fails the test at once, with the process's output, instead of after
the whole timeout.
"""

import time
from collections.abc import Callable, Iterable
from pathlib import Path


def wait_for(
    condition: Callable[[], object],
    timeout: float = 10.0,
    what: str = "the condition",
    *,
    every: float = 0.05,
    watch: Iterable = (),
    logs: Iterable[Path] = (),
) -> float:
    """Poll ``condition`` every ``every`` seconds until it is true; the seconds it took.

    Fails (``AssertionError`` naming ``what``) after ``timeout`` seconds, or as soon as a process
    in ``watch`` has exited: ``WorkerProcess``es (``.process`` and ``.output``) or plain
    ``subprocess.Popen``s. The failure shows the watched processes' output and the ``logs``.
    """
    watch, logs = list(watch), list(logs)
    began = time.monotonic()
    while not condition():
        for watched in watch:
            process = getattr(watched, "process", watched)
            if process.poll() is not None:
                raise AssertionError(
                    f"a process exited (status {process.returncode}) while waiting for {what}"
                    + _details(watch, logs)
                )
        if time.monotonic() - began > timeout:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}" + _details(watch, logs)
            )
        time.sleep(every)
    return time.monotonic() - began


def _details(watch: list, logs: list[Path]) -> str:
    texts = [watched.output for watched in watch if hasattr(watched, "output")]
    texts += [log.read_text() for log in logs if log.exists()]
    return "".join(f":\n{text}" for text in texts if text)


def backend_pid() -> int:
    """This thread's PostgreSQL backend, for ``waits_on_a_lock`` in another thread."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def waits_on_a_lock(pid: int) -> bool:
    """Whether backend ``pid`` is blocked on a lock it has asked for: the event a test of a
    row lock or a unique index waits for, instead of sleeping and hoping the other side got
    there. pg_locks, not pg_stat_activity: the latter is a snapshot frozen for the transaction."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE pid = %s AND NOT granted)", [pid]
        )
        return cursor.fetchone()[0]


def race(*calls: Callable[[], object]) -> list:
    """Run ``calls`` in threads released together by a barrier; each one's result, or the
    exception it raised, in order. Each thread closes its own database connection."""
    import threading

    from django.db import close_old_connections, connection

    barrier = threading.Barrier(len(calls))
    results: list = [None] * len(calls)

    def run(i, call):
        try:
            barrier.wait()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc
        finally:
            connection.close()
            close_old_connections()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    return results


def race_in_order(lock: Callable[[], object], *calls: Callable[[], object]) -> list:
    """Run the calls in threads, each forced to queue on a row lock, in order; each one's
    result, or the exception it raised.

    The test takes the lock itself (``lock``, called inside a transaction of its own); each
    thread is started only once the previous one is seen (in pg_locks) waiting on a lock inside
    its transaction. Releasing the lock then lets the first thread in, and every later one waits
    on the one before it: the overlap is certain, not left to the scheduler, and the winner is
    known.
    """
    import threading

    from django.db import close_old_connections, connection, transaction

    results: list = [None] * len(calls)
    pids: list[int | None] = [None] * len(calls)
    pid_known = [threading.Event() for _ in calls]

    def run(i, call):
        try:
            pids[i] = backend_pid()
            pid_known[i].set()
            results[i] = call()
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            results[i] = exc
        finally:
            pid_known[i].set()
            connection.close()
            close_old_connections()

    threads = [threading.Thread(target=run, args=(i, c)) for i, c in enumerate(calls)]
    with transaction.atomic():
        lock()
        for i, thread in enumerate(threads):
            thread.start()
            assert pid_known[i].wait(10)
            wait_for(
                lambda i=i: waits_on_a_lock(pids[i]),
                10,
                f"thread {i} to wait on the row lock",
                every=0.01,
            )
    for t in threads:
        t.join(30)
    return results
