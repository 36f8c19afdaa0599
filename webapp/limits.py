"""Request-size limits enforced before a body is buffered (issue 14 item 4).

Django's own checks (``DATA_UPLOAD_MAX_MEMORY_SIZE``) run after the server has handed over the
body, and daphne hands it over as one queue of chunks held in memory: a 200 MB anonymous POST grew
the web process by gigabytes. So the limit is applied in three places, outermost first:

1. ``install_daphne_limits()`` patches daphne's request class (the ``python -m webapp.server``
   launcher does this): a ``Content-Length`` over the limit gets ``413`` as soon as the headers are
   in, and a chunked body is counted as it arrives and cut off at the limit. Nothing is queued.
2. ``AsgiBodyLimit`` / ``WsgiBodyLimit`` do the same for any other ASGI/WSGI server (uvicorn,
   gunicorn): the declared length is checked before the app reads, the streamed body is counted.
3. The reverse proxy in front (``client_max_body_size`` in nginx, see docs/deploy.md).

The limit is ``settings.GRUE_MAX_REQUEST_BYTES`` (env ``GRUE_MAX_REQUEST_BYTES``, default 64 MiB).
"""

from __future__ import annotations

import io
import sys
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024

_BODY_413 = b"Request body too large."


def max_request_bytes() -> int:
    from django.conf import settings

    return int(getattr(settings, "GRUE_MAX_REQUEST_BYTES", DEFAULT_MAX_REQUEST_BYTES))


def _raw_413(limit: int) -> bytes:
    body = _BODY_413 + f" The limit is {limit} bytes.".encode()
    return (
        b"HTTP/1.1 413 Payload Too Large\r\nContent-Type: text/plain; charset=utf-8\r\n"
        + f"Content-Length: {len(body)}\r\n".encode()
        + b"Connection: close\r\n\r\n"
        + body
    )


# --------------------------------------------------------------------------- daphne


class _Discard(io.RawIOBase):
    """Stand-in for a refused request's body file: writes are dropped, reads are empty."""

    def writable(self) -> bool:
        return True

    def readable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        return len(data)

    def readinto(self, b: Any) -> int:
        return 0


def install_daphne_limits(limit: int | None = None) -> None:
    """Patch ``daphne.http_protocol.WebRequest`` so bodies over ``limit`` are refused before they are
    buffered. Idempotent."""
    from daphne.http_protocol import WebRequest

    if getattr(WebRequest, "_grue_limit_installed", False):
        WebRequest._grue_limit = limit or WebRequest._grue_limit
        return
    WebRequest._grue_limit = limit or max_request_bytes()
    original_got_length = WebRequest.gotLength
    original_chunk = WebRequest.handleContentChunk
    original_process = WebRequest.process

    def refuse(self: Any) -> None:
        if getattr(self, "_grue_refused", False):
            return
        self._grue_refused = True
        self.content = _Discard()
        try:
            self.channel.transport.write(_raw_413(self._grue_limit))
            self.channel.transport.loseConnection()
        except Exception:  # noqa: BLE001 - the client may be gone already
            pass

    def got_length(self: Any, length: int | None) -> None:
        self._grue_received = 0
        if length is not None and length > self._grue_limit:
            refuse(self)
            return
        original_got_length(self, length)

    def handle_chunk(self: Any, data: bytes) -> None:
        if getattr(self, "_grue_refused", False):
            return
        self._grue_received = getattr(self, "_grue_received", 0) + len(data)
        if self._grue_received > self._grue_limit:
            refuse(self)
            return
        original_chunk(self, data)

    def process(self: Any) -> Any:
        if getattr(self, "_grue_refused", False):
            return None
        return original_process(self)

    WebRequest.gotLength = got_length
    WebRequest.handleContentChunk = handle_chunk
    WebRequest.process = process
    WebRequest._grue_limit_installed = True


def serve(argv: list[str] | None = None) -> None:
    """``python -m webapp.server [daphne options] webapp.asgi:application``: daphne with the limits."""
    from daphne.cli import CommandLineInterface
    from django.conf import settings

    from webapp.security import is_loopback

    args = list(sys.argv[1:] if argv is None else argv)
    binds = [args[i + 1] for i, a in enumerate(args[:-1]) if a in ("-b", "--bind")]
    public = [b for b in binds if not is_loopback(b)]  # daphne's default bind is 127.0.0.1
    if settings.DEBUG and public:
        raise SystemExit(
            f"refusing DEBUG=1 on {', '.join(public)}: DEBUG pages show settings and tracebacks to anyone "
            "who can reach the server. Bind 127.0.0.1 for development, or unset DEBUG."
        )
    install_daphne_limits()
    CommandLineInterface().run(args)


# --------------------------------------------------------------------------- ASGI / WSGI


class _TooLarge(Exception):
    pass


def _declared_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


class AsgiBodyLimit:
    """ASGI middleware: 413 for a declared length over the limit before the app runs; a body
    streamed without a length is counted and the request is refused once it passes the limit."""

    def __init__(self, app: Any, limit: int | None = None):
        self.app = app
        self.limit = limit

    async def __call__(
        self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict]], send: Any
    ) -> None:
        if scope.get("type") != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limit or max_request_bytes()
        declared = _declared_length(scope.get("headers") or [])
        if declared is not None and declared > limit:
            await _send_413(send, limit)
            return
        received = 0
        started = False

        async def counting_receive() -> dict[str, Any]:
            nonlocal received
            message = await receive()
            if message.get("type") == "http.request":
                received += len(message.get("body") or b"")
                if received > limit:
                    raise _TooLarge()
            return message

        async def tracking_send(message: dict[str, Any]) -> None:
            nonlocal started
            if message.get("type") == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLarge:
            if not started:
                await _send_413(send, limit)


async def _send_413(send: Any, limit: int) -> None:
    body = _BODY_413 + f" The limit is {limit} bytes.".encode()
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [(b"content-type", b"text/plain; charset=utf-8"), (b"connection", b"close")],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _LimitedInput:
    """``wsgi.input`` that raises once more than ``limit`` bytes were read."""

    def __init__(self, stream: Any, limit: int):
        self.stream = stream
        self.limit = limit
        self.read_bytes = 0

    def _count(self, data: bytes) -> bytes:
        self.read_bytes += len(data)
        if self.read_bytes > self.limit:
            raise _TooLarge()
        return data

    def read(self, size: int = -1) -> bytes:
        return self._count(self.stream.read(size))

    def readline(self, size: int = -1) -> bytes:
        return self._count(self.stream.readline(size))

    def __iter__(self) -> Any:
        for line in self.stream:
            yield self._count(line)


class WsgiBodyLimit:
    """WSGI middleware with the same rule as ``AsgiBodyLimit``."""

    def __init__(self, app: Any, limit: int | None = None):
        self.app = app
        self.limit = limit

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        limit = self.limit or max_request_bytes()
        try:
            declared = int(environ.get("CONTENT_LENGTH") or -1)
        except ValueError:
            declared = -1
        if declared > limit:
            return _wsgi_413(start_response, limit)
        environ["wsgi.input"] = _LimitedInput(environ["wsgi.input"], limit)
        try:
            return self.app(environ, start_response)
        except _TooLarge:
            return _wsgi_413(start_response, limit)


def _wsgi_413(start_response: Any, limit: int) -> list[bytes]:
    body = _BODY_413 + f" The limit is {limit} bytes.".encode()
    start_response(
        "413 Payload Too Large",
        [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))],
    )
    return [body]
