"""A small asyncio HTTP/1.1 load generator: closed loop (the fallback when wrk is missing) and
open loop at a fixed offered rate (the end-to-end runs, which wrk cannot pace).

Connections are kept alive when the server allows it, as wrk does. In the open loop each
request has an intended start time; if every connection is busy the request waits, and its
latency still counts from the intended time, so a stalled server cannot hide its stall
(coordinated omission).
"""

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field


@dataclass
class Sample:
    key: str  # what the request carried (the processor_event_id)
    intended: float  # wall-clock seconds (time.time())
    sent: float
    answered: float
    status: int  # 0: connection error


@dataclass
class LoadResult:
    samples: list[Sample] = field(default_factory=list)
    started: float = 0.0
    finished: float = 0.0
    errors: dict[str, int] = field(default_factory=dict)
    # Open loop: how late the generator itself started requests (seconds behind schedule);
    # large values mean the generator, not the server, limited the offered rate.
    schedule_lag_max: float = 0.0

    @property
    def duration(self) -> float:
        return max(self.finished - self.started, 1e-9)

    def count(self, status: int) -> int:
        return sum(1 for s in self.samples if s.status == status)


class _Connection:
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, request: bytes) -> int:
        for attempt in (1, 2):
            if self.writer is None:
                self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
                fresh = True
            else:
                fresh = False
            try:
                self.writer.write(request)
                return await self._read_response()
            except (ConnectionError, asyncio.IncompleteReadError):
                self.close()
                # A kept-alive connection the server closed meanwhile: retry once on a new one.
                if fresh or attempt == 2:
                    raise
        raise AssertionError("unreachable")

    async def _read_response(self) -> int:
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        length, close = 0, False
        for line in lines[1:]:
            name, _, value = line.partition(":")
            name = name.strip().lower()
            if name == "content-length":
                length = int(value)
            elif name == "connection" and value.strip().lower() == "close":
                close = True
        if length:
            await self.reader.readexactly(length)
        if close:
            self.close()
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None


def build_request(host: str, port: int, path: str, body: bytes, headers: dict[str, str]) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


# A request factory gets the request number and returns (key, raw request bytes).
RequestFactory = Callable[[int], tuple[str, bytes]]


async def _open_loop(
    host: str, port: int, make: RequestFactory, rate: float, seconds: float, connections: int
) -> LoadResult:
    result = LoadResult()
    pool: asyncio.Queue[_Connection] = asyncio.Queue()
    for _ in range(connections):
        pool.put_nowait(_Connection(host, port))
    total = int(rate * seconds)
    tasks = []

    async def one(n: int, intended: float) -> None:
        key, request = make(n)
        conn = await pool.get()
        sent = time.time()
        try:
            status = await conn.post(request)
        except (OSError, asyncio.IncompleteReadError) as exc:
            conn.close()
            status = 0
            name = type(exc).__name__
            result.errors[name] = result.errors.get(name, 0) + 1
        finally:
            pool.put_nowait(conn)
        result.samples.append(Sample(key, intended, sent, time.time(), status))

    result.started = start = time.time()
    for n in range(total):
        intended = start + n / rate
        delay = intended - time.time()
        if delay > 0:
            await asyncio.sleep(delay)
        else:
            result.schedule_lag_max = max(result.schedule_lag_max, -delay)
        tasks.append(asyncio.create_task(one(n, intended)))
    await asyncio.gather(*tasks)
    result.finished = time.time()
    for _ in range(connections):
        (await pool.get()).close()
    return result


async def _closed_loop(
    host: str, port: int, make: RequestFactory, seconds: float, connections: int
) -> LoadResult:
    result = LoadResult()
    counter = iter(range(10**12))
    deadline = time.time() + seconds

    async def client() -> None:
        conn = _Connection(host, port)
        while time.time() < deadline:
            key, request = make(next(counter))
            sent = time.time()
            try:
                status = await conn.post(request)
            except (OSError, asyncio.IncompleteReadError) as exc:
                conn.close()
                status = 0
                name = type(exc).__name__
                result.errors[name] = result.errors.get(name, 0) + 1
            result.samples.append(Sample(key, sent, sent, time.time(), status))
        conn.close()

    result.started = time.time()
    await asyncio.gather(*(client() for _ in range(connections)))
    result.finished = time.time()
    return result


def open_loop(
    host: str, port: int, make: RequestFactory, *, rate: float, seconds: float, connections: int
) -> LoadResult:
    """Offer ``rate`` requests/s for ``seconds`` whatever the answers, on at most
    ``connections`` connections at once."""
    return asyncio.run(_open_loop(host, port, make, rate, seconds, connections))


def closed_loop(
    host: str, port: int, make: RequestFactory, *, seconds: float, connections: int
) -> LoadResult:
    """Keep ``connections`` requests in flight for ``seconds``."""
    return asyncio.run(_closed_loop(host, port, make, seconds, connections))
