"""The chaos run's processes: each a child in its own session, killed and restarted by the fault
schedule, and the TCP proxy in front of the local SQS server, which the schedule cuts."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import threading
import time

from chaos.config import VAR, SetupError
from devstack.processes import ROOT, stop_process


def wait_tcp(port: int, timeout: float, process: Child | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process is not None and not process.alive:
            raise SetupError(f"{process.name} exited while starting: see {process.log_path}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SetupError(f"nothing listens on 127.0.0.1:{port} after {timeout:.0f} s")


class Child:
    """One process of the stack, in its own session so it and its children stop together."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.log_path = VAR / f"{name}.log"
        self.process: subprocess.Popen | None = None
        self.starts = 0
        self.killed_by_us = 0
        self.unexpected_exits: list[int] = []
        self.lock = threading.RLock()

    def start(self) -> Child:
        with self.lock:
            self.starts += 1
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.log_path, "a") as log:
                log.write(f"\n===== start {self.starts} at {time.strftime('%H:%M:%S')} =====\n")
                log.flush()
                self.process = subprocess.Popen(
                    self.argv,
                    cwd=ROOT,
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    start_new_session=True,
                )
        return self

    @property
    def alive(self) -> bool:
        process = self.process
        return process is not None and process.poll() is None

    def sigkill(self) -> bool:
        """Kill it outright (a crash, as far as the system can tell); False if not running."""
        with self.lock:
            if self.process is None or self.process.poll() is not None:
                return False
            os.kill(self.process.pid, signal.SIGKILL)
            self.process.wait()
            self.process = None
            self.killed_by_us += 1
            return True

    def stop(self, timeout: float = 15) -> int | None:
        """SIGTERM the process group, then SIGKILL it if it does not exit in time."""
        process = self.process
        if process is None:
            return None
        stop_process(process, timeout, group=True)
        return process.returncode

    def check_exit(self) -> int | None:
        """If it exited by itself, record the status and return it."""
        with self.lock:
            if self.process is not None and self.process.poll() is not None:
                code = self.process.returncode
                self.unexpected_exits.append(code)
                self.process = None
                return code
        return None


class TcpProxy:
    """127.0.0.1:listen_port -> 127.0.0.1:target_port; ``cut()`` closes the listener and every
    open connection (new ones are refused), ``restore()`` listens again on the same port."""

    def __init__(self, listen_port: int, target_port: int) -> None:
        self.listen_port = listen_port
        self.target_port = target_port
        self.loop = asyncio.new_event_loop()
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._thread = threading.Thread(target=self.loop.run_forever, name="sqs-proxy")
        self._thread.daemon = True

    def start(self) -> TcpProxy:
        self._thread.start()
        self.restore()
        return self

    def _call(self, coro) -> None:
        asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)

    def restore(self) -> None:
        self._call(self._listen())

    def cut(self) -> None:
        self._call(self._cut())

    def close(self) -> None:
        self._call(self._close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)

    async def _close(self) -> None:
        await self._cut()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(
            self._handle, "127.0.0.1", self.listen_port, reuse_address=True
        )

    async def _cut(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        for writer in list(self._writers):
            writer.transport.abort()
        self._writers.clear()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._server is None:  # accepted just before a cut
            writer.transport.abort()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        if self._server is None:
            writer.transport.abort()
            up_writer.transport.abort()
            return
        self._writers.update((writer, up_writer))

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        self._writers.discard(writer)
        self._writers.discard(up_writer)
