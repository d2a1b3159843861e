"""The CPU accounting of ``make bench`` (``bench/cpu.py``): a PostgreSQL backend that ends
during a run is counted once, through the postmaster's reaped children."""

import os
import subprocess
import sys

from bench.cpu import CpuMeter, parent_pid, reaped_children_cpu


def test_a_backend_that_ended_is_counted_once_through_the_reaped_cpu():
    before = {"postgres": {10: 1.0, 11: 2.0, -1: 5.0}, "web": {20: 3.0}}
    # 10 used 0.5 more; 11 ended having used 2.5 in all (0.5 of it since before); 12 is new
    # (0.3); a backend started and ended meanwhile used 0.5: the reaped CPU grew by 2.5 + 0.5.
    after = {"postgres": {10: 1.5, 12: 0.3, -1: 8.0}, "web": {20: 3.25}}

    used = CpuMeter.used(before, after)

    assert used == {"postgres": 1.8, "web": 0.25}


def test_a_part_without_the_reaped_cpu_counts_only_the_processes_it_sees():
    before = {"postgres": {10: 1.0, 11: 2.0}}
    after = {"postgres": {10: 1.5}}

    assert CpuMeter.used(before, after) == {"postgres": 0.5}


def test_the_reaped_cpu_grows_by_what_a_child_used_once_it_is_waited_for():
    before = reaped_children_cpu(os.getpid())
    burn = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"
    subprocess.run([sys.executable, "-c", burn], check=True)

    assert reaped_children_cpu(os.getpid()) - before >= 0.25
    assert parent_pid(os.getpid()) == os.getppid()
    assert reaped_children_cpu(2**22 + 7) == 0.0 and parent_pid(2**22 + 7) is None
