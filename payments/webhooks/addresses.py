"""Where a webhook may be sent: never to the module's own network (server-side request
forgery). A URL is refused for its form when it is made, and its host is resolved and refused
again before every request, so a DNS name later pointed at a private address is caught."""

import ipaddress
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from payments import conf

MAX_URL_LENGTH = 2048
# The sockets this thread opens inside ``request_deadline``, for its timer to cut.
_opened = threading.local()


class AddressRefused(ValueError):
    """The URL may not be called; the message says why (never with the endpoint's secret)."""


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be an endpoint's URL, from its text alone; None if it can."""
    if len(url) > MAX_URL_LENGTH:
        return f"at most {MAX_URL_LENGTH} characters"
    if any(ord(ch) < 0x21 or ord(ch) == 0x7F or 0xD800 <= ord(ch) <= 0xDFFF for ch in url):
        return "control characters, spaces and surrogates are not allowed"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a valid URL"
    schemes = ("https", "http") if conf.WEBHOOK_ALLOW_HTTP else ("https",)
    if parts.scheme not in schemes:
        return "must use https"
    if not parts.hostname:
        return "has no host"
    if parts.username is not None or parts.password is not None:
        return "may not carry credentials"
    if port == 0:
        return "has no valid port"
    try:
        parts.hostname.encode("idna")
    except UnicodeError:
        return "has a host name that is not a valid internationalized domain name"
    literal = _ip_literal(parts.hostname)
    if literal is not None and not _public(literal):
        return "points at a private, loopback or link-local address"
    return None


def _ip_literal(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return None


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if conf.WEBHOOK_ALLOW_PRIVATE_ADDRESSES:
        return True
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast


def url_resolved_check(url: str) -> None:
    """Resolve the URL's host and raise ``AddressRefused`` if any address it has is not public
    (a name with one public and one private address could be steered to the private one)."""
    problem = url_problem(url)
    if problem is not None:
        raise AddressRefused(problem)
    parts = urlsplit(url)
    try:
        infos = socket.getaddrinfo(
            parts.hostname.encode("idna").decode("ascii"),
            parts.port or (443 if parts.scheme == "https" else 80),
            proto=socket.IPPROTO_TCP,
        )
    except (OSError, UnicodeError) as exc:
        raise AddressRefused(f"host does not resolve: {type(exc).__name__}") from None
    for info in infos:
        address = ipaddress.ip_address(info[4][0].split("%")[0])
        if not _public(address):
            raise AddressRefused("host resolves to a private, loopback or link-local address")


def _peer_checked(sock: socket.socket) -> socket.socket:
    address = ipaddress.ip_address(sock.getpeername()[0].split("%")[0])
    if not _public(address):
        sock.close()
        raise AddressRefused("connected to a private, loopback or link-local address")
    sockets = getattr(_opened, "sockets", None)
    if sockets is not None:
        sockets.append(sock)
    return sock


@contextmanager
def request_deadline(seconds: float) -> Iterator[Callable[[], bool]]:
    """Cut every connection this thread opens inside the block once ``seconds`` have passed in
    all. The timeouts bound each wait, not their sum: a receiver trickling its headers or its
    answer a few bytes at a time, each within the read timeout, would hold a sender for ever.
    Yields whether the deadline cut them."""
    sockets: list[socket.socket] = []
    cut = threading.Event()

    def cut_all() -> None:
        cut.set()
        for sock in list(sockets):
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    timer = threading.Timer(seconds, cut_all)
    timer.daemon = True
    _opened.sockets = sockets
    timer.start()
    try:
        yield cut.is_set
    finally:
        timer.cancel()
        _opened.sockets = None


class _GuardedHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _peer_checked(super()._new_conn())


class _GuardedHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _peer_checked(super()._new_conn())


class _GuardedHTTPPool(HTTPConnectionPool):
    ConnectionCls = _GuardedHTTPConnection


class _GuardedHTTPSPool(HTTPSConnectionPool):
    ConnectionCls = _GuardedHTTPSConnection


class _GuardedAdapter(HTTPAdapter):
    def init_poolmanager(self, *args, **kwargs) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = {
            "http": _GuardedHTTPPool,
            "https": _GuardedHTTPSPool,
        }


def guarded_session() -> requests.Session:
    """A session whose every connection is refused (``AddressRefused``) unless its peer is a
    public address; no proxy from the environment, which would hide the peer."""
    session = requests.Session()
    session.trust_env = False
    adapter = _GuardedAdapter(max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    return session
