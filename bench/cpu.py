"""CPU accounting from ``/proc``: each part of the system under test, per event."""

import os
import resource
import subprocess
from pathlib import Path

import psycopg

from bench.stack import Gunicorn, Stack

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def process_cpu(pid: int) -> float:
    """User + system CPU seconds a process has used so far; 0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def reaped_children_cpu(pid: int) -> float:
    """User + system CPU seconds of the children a process has waited for (its ended ones);
    0 when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[13]) + int(fields[14])) / CLOCK_TICKS


def parent_pid(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except OSError:
        return None


def child_pids(pid: int) -> list[int]:
    """The process's children (a gunicorn master's workers, a Celery pool's processes)."""
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def children_cpu() -> float:
    """User + system CPU seconds of the child processes waited for so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class CpuMeter:
    """CPU seconds used by each part of the system under test, between two snapshots: the
    web processes, the queue workers, the local SQS server, the PostgreSQL backends serving
    the benchmark's database, and this process (the load generator).

    A PostgreSQL backend that ends between two snapshots (a connection older than
    ``CONN_MAX_AGE`` replaced, a parallel worker) is counted too: the server's postmaster reaps
    its backends, so their CPU is in its children's CPU (``reaped_children_cpu``, a pseudo-pid
    of its own in the ``postgres`` part). That also counts a backend of another database ending
    meanwhile, so the figure is the run's only on a machine running nothing else, as the
    benchmarks require anyway."""

    def __init__(
        self,
        stack: Stack,
        server: Gunicorn,
        workers: list[subprocess.Popen],
        *,
        with_children: bool = False,
    ):
        """``with_children``: count the workers' child processes too (a Celery prefork pool)."""
        self.stack, self.server, self.workers = stack, server, workers
        self.with_children = with_children
        self._postmaster: int | None = None

    def _worker_pids(self) -> list[int]:
        pids = [w.pid for w in self.workers]
        if self.with_children:
            pids += [child for pid in pids for child in child_pids(pid)]
        return pids

    def _pids(self) -> dict[str, list[int]]:
        with psycopg.connect(self.stack.database_url, autocommit=True) as conn:
            backends = [
                row[0]
                for row in conn.execute(
                    "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid()"
                )
            ]
        self._postmaster = self._postmaster or next(
            (parent for pid in backends if (parent := parent_pid(pid))), None
        )
        return {
            "web": [self.server.process.pid, *self.server.worker_pids()],
            "workers": self._worker_pids(),
            "sqs": [self.stack.sqs_pid] if self.stack.sqs_pid else [],
            "postgres": backends,
        }

    def snapshot(self) -> dict[str, dict[int, float]]:
        snap = {
            part: {pid: process_cpu(pid) for pid in pids} for part, pids in self._pids().items()
        }
        if self._postmaster:  # the backends that ended, under a pid no process has
            snap["postgres"][-self._postmaster] = reaped_children_cpu(self._postmaster)
        own = os.times()
        snap["generator"] = {os.getpid(): own.user + own.system}
        return snap

    @staticmethod
    def used(before: dict, after: dict) -> dict[str, float]:
        """CPU seconds per part between the snapshots (processes present in both, or new). A
        backend that ended meanwhile is in the postmaster's reaped CPU with its whole life, so
        what it had used at ``before`` is taken off again."""
        used = {}
        for part, pids in after.items():
            earlier = before.get(part, {})
            total = sum(t - earlier.get(pid, 0.0) for pid, t in pids.items())
            if any(pid < 0 for pid in pids):  # the reaped pseudo-pid (postgres)
                total -= sum(t for pid, t in earlier.items() if pid not in pids)
            used[part] = round(total, 3)
        return used


def cpu_summary(used: dict[str, float], events: int, seconds: float) -> dict:
    return {
        "cpu_seconds": used,
        "cpu_ms_per_event": {k: round(1000 * v / max(events, 1), 2) for k, v in used.items()},
        "cores_busy": round(sum(used.values()) / max(seconds, 1e-9), 2),
    }
