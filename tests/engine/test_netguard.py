"""engine.netguard (issue 25.2): which addresses a user's URL may reach, and that a request goes to
the address that was checked, follows no redirect and never repeats what the peer said in its error.

Real sockets on loopback play the peers (allowed through the allow-list, as a deployment would allow
its own judge server); nothing is mocked."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from engine import netguard
from engine.netguard import AddressNotAllowed, OutboundError, Target


class Peer:
    """A loopback HTTP server answering every request with ``status``, ``body`` and ``headers``; it
    records each request's path and headers."""

    def __init__(self, status: int = 200, body: bytes = b"ok", headers: dict[str, str] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                n = int(self.headers.get("Content-Length") or 0)
                outer.requests.append(
                    {"path": self.path, "headers": dict(self.headers), "body": self.rfile.read(n)}
                )
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_POST = _answer  # noqa: N815 - the stdlib's names

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.httpd.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def peer() -> Iterator[Peer]:
    p = Peer(body=b'{"hello": "world"}')
    yield p
    p.stop()


class Banner:
    """A TCP service that is not HTTP: it writes one line and closes, as Redis does to a stranger."""

    def __init__(self, line: bytes) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.port = self.sock.getsockname()[1]
        self.line = line
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(self.line)

    def stop(self) -> None:
        self.sock.close()


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://127.0.0.1:6379/", "loopback"),
        ("http://localhost:5432/v1", "loopback"),  # a name: resolved, then judged by its address
        ("http://[::1]:5432/", "loopback"),
        ("http://[::ffff:127.0.0.1]/", "loopback"),  # IPv4-mapped IPv6
        ("http://169.254.169.254/latest/meta-data/", "link-local"),  # cloud metadata
        ("http://[fe80::1]/", "link-local"),
        ("http://10.1.2.3/", "private"),
        ("http://172.16.0.1/", "private"),
        ("https://192.168.0.10/v1", "private"),
        ("http://[fd12::1]/", "private"),
        ("http://100.64.0.1/", "non-public"),  # carrier-grade NAT
        ("http://0.0.0.0:8000/", "unspecified"),
        ("http://224.0.0.1/", "multicast"),
        ("http://240.0.0.1/", "reserved"),
    ],
)
def test_internal_addresses_are_refused_after_resolution(url: str, kind: str) -> None:
    with pytest.raises(AddressNotAllowed, match=f"is a {kind} address"):
        netguard.check_url(url)


@pytest.mark.parametrize("host", ["0177.0.0.1", "2130706433", "0x7f.1", "127.1", "0x7f000001"])
def test_numeric_hosts_in_other_forms_are_refused(host: str) -> None:
    """Resolvers read these as 127.0.0.1; they are refused as written, whatever resolves them."""
    for resolve in (True, False):
        with pytest.raises(AddressNotAllowed, match="ambiguous form"):
            netguard.check_url(f"http://{host}:6379/", resolve=resolve)


def test_url_shape_public_addresses_and_the_allow_list() -> None:
    for bad in ("ftp://example.org/", "file:///etc/passwd", "http:///x", "https://u:p@example.org/", "x"):
        with pytest.raises(AddressNotAllowed):
            netguard.check_url(bad)
    t = netguard.check_url("https://8.8.8.8:8443/v1/chat?x=1")
    assert (t.host, t.port, t.path, t.addresses) == ("8.8.8.8", 8443, "/v1/chat?x=1", ("8.8.8.8",))
    # Without resolution a name passes for now (checked again before connecting); localhost never.
    assert netguard.check_url("https://api.example.org/v1", resolve=False).addresses == ()
    with pytest.raises(AddressNotAllowed, match="loopback"):
        netguard.check_url("http://LOCALHOST./v1", resolve=False)
    allow = netguard.parse_allow("10.0.0.0/8, 127.0.0.1 judge.internal [::1]")
    assert netguard.check_url("http://10.9.8.7/", allow=allow).addresses == ("10.9.8.7",)
    assert netguard.check_url("http://127.0.0.1:9/", allow=allow).port == 9
    assert netguard.check_url("http://[::1]:9/", allow=allow).addresses == ("::1",)
    with pytest.raises(AddressNotAllowed, match="private"):  # the network, not its neighbours
        netguard.check_url("http://192.168.0.1/", allow=allow)
    with pytest.raises(AddressNotAllowed, match="loopback"):
        netguard.check_url("http://127.0.0.2/", allow=allow)
    with pytest.raises(ValueError, match="not an IP address"):
        netguard.parse_allow(["judge server!"])


def test_request_connects_to_the_checked_address_without_resolving_again(peer: Peer) -> None:
    """The name in the target does not resolve at all: the request still reaches the address the
    check pinned, and the Host header keeps the name (virtual hosts, TLS SNI)."""
    target = Target(
        url="http://judge.invalid/v1/x",
        scheme="http",
        host="judge.invalid",
        port=peer.port,
        path="/v1/x",
        addresses=("127.0.0.1",),
    )
    resp = netguard.request(target, method="POST", body=b"{}", headers={"Authorization": "Bearer k"})
    assert resp.status == 200 and resp.body == b'{"hello": "world"}'
    assert peer.requests[0]["path"] == "/v1/x"
    assert peer.requests[0]["headers"]["Host"] == f"judge.invalid:{peer.port}"
    with pytest.raises(AddressNotAllowed, match="loopback"):  # a URL is checked first
        netguard.request(f"{peer.url}/v1/x")
    assert len(peer.requests) == 1


def test_redirects_are_returned_not_followed(peer: Peer) -> None:
    hop = Peer(status=302, body=b"", headers={"Location": f"{peer.url}/stolen"})
    try:
        resp = netguard.request(
            f"{hop.url}/v1",
            method="POST",
            body=b"{}",
            headers={"Authorization": "Bearer k"},
            allow="127.0.0.1",
        )
    finally:
        hop.stop()
    assert resp.status == 302 and resp.headers["location"].endswith("/stolen")
    assert peer.requests == []  # the key never went to the other host


def test_errors_are_categories_never_the_peers_bytes() -> None:
    banner = Banner(b"-NOAUTH Authentication required.\r\n")
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    try:
        with pytest.raises(OutboundError) as not_http:
            netguard.request(f"http://127.0.0.1:{banner.port}/", allow="127.0.0.1")
        with pytest.raises(OutboundError) as refused:
            netguard.request(f"http://127.0.0.1:{closed_port}/", allow="127.0.0.1")
    finally:
        banner.stop()
    assert str(not_http.value) in ("not an HTTP reply", "connection closed by the server")
    assert "NOAUTH" not in str(not_http.value)
    assert str(refused.value) == "connection refused"
    assert (
        netguard.describe_status(502) == "HTTP 502 Bad Gateway"
        and netguard.describe_status(599) == "HTTP 599"
    )


def test_a_reply_past_the_size_limit_is_an_error() -> None:
    big = Peer(body=b"x" * 5000)
    try:
        with pytest.raises(OutboundError, match="larger than 4096 bytes"):
            netguard.request(big.url, allow="127.0.0.1", max_bytes=4096)
        assert netguard.request(big.url, allow="127.0.0.1", max_bytes=5000).body == b"x" * 5000
    finally:
        big.stop()
