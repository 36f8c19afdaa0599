"""Outbound HTTP to an address a user typed, without reaching the server's own network (SSRF guard).

Why: a URL that a web user may set (an AI judge's base URL, a tracker URI, a ``--report-to`` server)
makes the server or its worker open a connection of the user's choosing, often carrying a secret
(an API key, a token). Aimed at ``127.0.0.1:6379``, ``169.254.169.254`` or a private address, it
turns the worker into a proxy into the deployment's internal services, and any reply text shown back
(an error message quoting the body) leaks what answered. This module is the one place that decides
whether an address may be contacted, and it connects to exactly the address it checked.

Standard library only (no Django, no torch), so the engine's remote client can use it as well as the
web app. The API:

``check_url(url, *, allow=(), schemes=("http", "https"), resolve=True) -> Target``
    Parse ``url`` and refuse, with :class:`AddressNotAllowed`, anything but one of ``schemes`` with a
    host and without user info; numeric hosts in a form other than dotted decimal (``0177.0.0.1``,
    ``2130706433``, ``0x7f.1``: resolvers read them as ``127.0.0.1``); and every host whose resolved
    addresses include one that is not public: loopback, private (RFC 1918, ``fc00::/7``), shared
    (``100.64/10``), link-local (``169.254/16`` with the cloud metadata service, ``fe80::/10``),
    unspecified, reserved, documentation, benchmarking or multicast; IPv4-mapped IPv6
    (``::ffff:127.0.0.1``) is judged by its IPv4 address. The name is resolved once (``getaddrinfo``)
    and the addresses are kept in the returned :class:`Target`. With ``resolve=False`` only what the
    URL itself shows is checked (for a form saved while DNS is down; check again before connecting).
``parse_allow(entries) -> AllowList``
    The deployment's exceptions: IP addresses, CIDR networks (``10.0.0.0/24``, ``fd00::/8``) and exact
    host names (``judge.internal``), as a list or one comma/space separated string. An address inside
    an allowed network, or any address of an allowed name, passes. ``allow`` arguments take an
    :class:`AllowList` or anything ``parse_allow`` takes.
``request(url_or_target, *, method="GET", body=None, headers=None, timeout=30, allow=(), max_bytes=...)``
    ``-> Response``: check (unless given a :class:`Target`), then open a TCP connection to a checked
    address itself, never to the name again (no second DNS answer, so no DNS rebinding between check
    and use), with TLS verified against the URL's host name. Redirects are never followed: a 3xx is
    returned like any other status, and the caller decides (the judges refuse it; following one would
    carry the ``Authorization`` header to another host). No proxy from the environment is used. A
    connection or protocol failure raises :class:`OutboundError` whose message is a short category
    ("connection refused", "timed out", "not an HTTP reply", ...), never the peer's bytes, so errors
    shown to users cannot be used to read banners or tell internal ports apart.
``describe_status(status) -> str``
    ``"HTTP 404 Not Found"`` from the standard phrase table, never the peer's reason text.

Limit: the check covers the connection this module opens. A library that opens its own connections
(MLflow's HTTP client) re-resolves the name; for those, callers refuse the URL outright where a user
could aim it (see ``webapp/runs/paths.py``).
"""

from __future__ import annotations

import http
import http.client
import ipaddress
import socket
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
DEFAULT_PORTS = {"http": 80, "https": 443}
DEFAULT_MAX_BYTES = 1 << 20


class AddressNotAllowed(ValueError):
    """The URL names something this server must not contact (its message says what and why)."""


class OutboundError(OSError):
    """The request failed before a full HTTP reply arrived; the message is a short category only."""


@dataclass(frozen=True)
class AllowList:
    """Addresses and names exempt from the public-address rule (a private judge server, say)."""

    networks: tuple[IPNetwork, ...] = ()
    names: frozenset[str] = frozenset()

    def permits(self, host: str, ip: IPAddress) -> bool:
        return host.lower().rstrip(".") in self.names or any(
            ip.version == net.version and ip in net for net in self.networks
        )

    def __bool__(self) -> bool:
        return bool(self.networks or self.names)


@dataclass(frozen=True)
class Target:
    """A checked URL: where to connect (``addresses``, in resolver order) and what to ask for."""

    url: str
    scheme: str
    host: str
    port: int
    path: str  # path and query, as sent in the request line
    addresses: tuple[str, ...] = field(default=())


@dataclass(frozen=True)
class Response:
    status: int
    headers: Mapping[str, str]
    body: bytes


def parse_allow(entries: AllowList | str | Iterable[str] | None) -> AllowList:
    """An :class:`AllowList` from IPs, CIDR networks and host names (a string is split on commas and
    whitespace). Raises ``ValueError`` naming an entry that is none of these."""
    if isinstance(entries, AllowList):
        return entries
    if entries is None:
        return AllowList()
    items = entries.replace(",", " ").split() if isinstance(entries, str) else list(entries)
    networks: list[IPNetwork] = []
    names: set[str] = set()
    for raw in items:
        entry = str(raw).strip().strip("[]")
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
            continue
        except ValueError:
            pass
        name = entry.lower().rstrip(".")
        if not all(part and len(part) < 64 and part.replace("-", "").isalnum() for part in name.split(".")):
            raise ValueError(
                f"outbound allow-list entry {raw!r} is not an IP address, a network or a host name"
            )
        names.add(name)
    return AllowList(tuple(networks), frozenset(names))


def _kind(ip: IPAddress) -> str | None:
    """Why ``ip`` is not a public unicast address, or None when it is."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return _kind(ip.ipv4_mapped)
    checks = (
        ("loopback", ip.is_loopback),
        ("unspecified", ip.is_unspecified),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        ("non-public", not ip.is_global),
    )
    return next((name for name, hit in checks if hit), None)


def is_public(address: str | IPAddress) -> bool:
    """True for a global unicast address: what a URL from a user may reach without an allow-list."""
    ip = ipaddress.ip_address(address.split("%", 1)[0]) if isinstance(address, str) else address
    return _kind(ip) is None


def _literal(host: str) -> IPAddress | None:
    """The address when ``host`` is an IP literal in canonical form; ``AddressNotAllowed`` for a
    numeric host written any other way (octal, hex, fewer than four parts), which resolvers accept."""
    try:
        return ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        pass
    try:
        socket.inet_aton(host)
    except OSError:
        return None
    raise AddressNotAllowed(f"host {host!r} is a numeric address in an ambiguous form; write it as a.b.c.d")


def _resolve(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError) as exc:
        raise OutboundError(f"cannot resolve host {host!r}") from exc
    seen: list[str] = []
    for *_, sockaddr in infos:
        if sockaddr[0] not in seen:
            seen.append(sockaddr[0])
    return seen


def check_url(
    url: str,
    *,
    allow: AllowList | str | Iterable[str] | None = (),
    schemes: Iterable[str] = ("http", "https"),
    resolve: bool = True,
) -> Target:
    """Check ``url`` against the outbound policy (module docstring) and return where to connect.

    Raises :class:`AddressNotAllowed` for a refused URL, and :class:`OutboundError` when
    ``resolve`` is true and the host name does not resolve."""
    allowed = parse_allow(allow)
    url = (url or "").strip()
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise AddressNotAllowed(f"{url[:80]!r} is not a valid URL ({exc})") from None
    schemes = tuple(schemes)
    if parts.scheme not in schemes or not parts.hostname:
        raise AddressNotAllowed(f"{url[:80]!r} is not a {'/'.join(schemes)} URL with a host")
    if parts.username is not None or parts.password is not None:
        raise AddressNotAllowed("a URL with a user name or password is not allowed")
    host = parts.hostname.rstrip(".")
    port = port or DEFAULT_PORTS.get(parts.scheme, 0)
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    literal = _literal(host)
    if literal is not None:
        addresses = [str(literal)]
    elif not resolve:
        if host.lower() == "localhost" or host.lower().endswith(".localhost"):
            addresses = ["127.0.0.1"]  # RFC 6761: always loopback, refused without a network round trip
        else:
            return Target(url, parts.scheme, host, port, path)
    else:
        addresses = _resolve(host, port)
    for address in addresses:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
        kind = _kind(ip)
        if kind is not None and not allowed.permits(host, ip):
            shown = host if str(ip) == host else f"{host} (resolves to {ip})"
            raise AddressNotAllowed(
                f"{shown} is a {kind} address: this server does not connect to internal addresses; "
                "an administrator can allow it with GRUE_OUTBOUND_ALLOW"
            )
    return Target(url, parts.scheme, host, port, path, tuple(addresses))


class _PinnedHTTPConnection(http.client.HTTPConnection):
    """HTTP to one given address while the request keeps the URL's host name (``Host`` header)."""

    def __init__(self, host: str, port: int, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def _open(self) -> socket.socket:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def connect(self) -> None:
        self.sock = self._open()


class _PinnedHTTPSConnection(_PinnedHTTPConnection):
    """HTTPS to one given address, the certificate verified against the URL's host name."""

    default_port = 443

    def __init__(self, host: str, port: int, address: str, timeout: float, context: ssl.SSLContext) -> None:
        super().__init__(host, port, address, timeout)
        self._tls = context

    def connect(self) -> None:
        self.sock = self._tls.wrap_socket(self._open(), server_hostname=self.host)


def _category(exc: BaseException) -> str:
    """A short, peer-independent description of a failed exchange."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        return "TLS certificate rejected"
    if isinstance(exc, ssl.SSLError):
        return "TLS handshake failed"
    if isinstance(exc, TimeoutError):
        return "timed out"
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, ConnectionResetError | BrokenPipeError | http.client.RemoteDisconnected):
        return "connection closed by the server"
    if isinstance(exc, http.client.HTTPException):
        return "not an HTTP reply"
    return "connection failed"


def describe_status(status: int) -> str:
    """``HTTP <code> <standard phrase>``: the peer's own reason text is never repeated."""
    try:
        return f"HTTP {status} {http.HTTPStatus(status).phrase}"
    except ValueError:
        return f"HTTP {status}"


def request(
    target: Target | str,
    *,
    method: str = "GET",
    body: bytes | None = None,
    headers: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    allow: AllowList | str | Iterable[str] | None = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
    tls_context: ssl.SSLContext | None = None,
) -> Response:
    """One request to a checked address (module docstring). A reply longer than ``max_bytes`` is an
    :class:`OutboundError`; redirects come back as their 3xx ``Response``."""
    if not isinstance(target, Target) or not target.addresses:
        target = check_url(target.url if isinstance(target, Target) else target, allow=allow)
    last: BaseException | None = None
    for address in target.addresses:
        if target.scheme == "https":
            conn: _PinnedHTTPConnection = _PinnedHTTPSConnection(
                target.host, target.port, address, timeout, tls_context or ssl.create_default_context()
            )
        else:
            conn = _PinnedHTTPConnection(target.host, target.port, address, timeout)
        try:
            try:
                conn.connect()
            except (ConnectionRefusedError, TimeoutError, OSError) as exc:
                if isinstance(exc, ssl.SSLError):
                    raise
                last = exc  # try the host's next address
                continue
            conn.request(method, target.path, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            data = resp.read(max_bytes + 1)
            if len(data) > max_bytes:
                raise OutboundError(f"reply larger than {max_bytes} bytes")
            return Response(resp.status, {k.lower(): v for k, v in resp.getheaders()}, data)
        except OutboundError:
            raise
        except (OSError, http.client.HTTPException) as exc:
            raise OutboundError(_category(exc)) from exc
        finally:
            conn.close()
    raise OutboundError(_category(last) if last else "no address to connect to") from last
