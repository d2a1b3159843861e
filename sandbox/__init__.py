"""A sandbox processor for tests, demos and benchmarks: a real HTTP server on loopback.

A development app of this project, apart from the module's apps: it depends on ``payments``
(the callback signature), and no app of the module imports it (lint's banned-api rule).
"""

from sandbox.faults import FaultConfig
from sandbox.latch import DebitLatch
from sandbox.server import SandboxProcessor

__all__ = ["DebitLatch", "FaultConfig", "SandboxProcessor"]
