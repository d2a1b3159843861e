"""A sandbox processor for tests, demos and benchmarks: a real HTTP server on loopback."""

from payments.sandbox.faults import FaultConfig
from payments.sandbox.latch import DebitLatch
from payments.sandbox.server import SandboxProcessor

__all__ = ["DebitLatch", "FaultConfig", "SandboxProcessor"]
