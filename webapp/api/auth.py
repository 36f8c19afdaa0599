"""Who is calling the API, may they, and how fast: token authentication, roles, CSRF, rate limits,
body limits, and the JSON error shape every endpoint shares.

Why here and not in each view: every endpoint must answer the same way to a missing token, a revoked
token, a wrong role or a flood of requests, and a client (``engine.client``, the remote sink) relies on
that shape (``{"error": ..., "field": ...}`` with a 4xx status) to tell a bad request, which it must
not repeat, from a transient failure, which it retries.

CSRF: a request with ``Authorization: Bearer <token>`` cannot be forged by another site (browsers do
not attach it), so it is exempt; a request authenticated by the session cookie goes through Django's
CSRF check like any form.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
import time
from collections.abc import Callable
from functools import wraps
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.middleware.csrf import CsrfViewMiddleware
from django.utils import timezone
from django.views.decorators.csrf import csrf_exempt

from webapp.access import is_researcher
from webapp.api.models import ApiToken

log = logging.getLogger(__name__)

TOKEN_PREFIX = "grue_"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")


class ApiError(Exception):
    """A client error answered as ``{"error": message, "field": field}`` with ``status``."""

    def __init__(
        self, status: int, message: str, field: str | None = None, headers: dict[str, str] | None = None
    ):
        super().__init__(message)
        self.status = status
        self.message = message
        self.field = field
        self.headers = headers or {}

    def response(self) -> JsonResponse:
        body: dict[str, Any] = {"error": self.message}
        if self.field:
            body["field"] = self.field
        resp = JsonResponse(body, status=self.status)
        for k, v in self.headers.items():
            resp[k] = v
        return resp


def digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(user: Any, name: str) -> tuple[ApiToken, str]:
    """A new token for ``user``; returns the row and the clear token (shown once, never stored)."""
    name = (name or "").strip()[:100] or "token"
    clear = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken.objects.create(user=user, name=name, prefix=clear[:12], digest=digest(clear))
    return row, clear


def revoke_token(user: Any, token_id: int) -> bool:
    """Revoke one of ``user``'s tokens; False when it is not theirs or already revoked."""
    return bool(
        ApiToken.objects.filter(pk=token_id, user=user, revoked_at__isnull=True).update(
            revoked_at=timezone.now()
        )
    )


def _token_user(request: HttpRequest) -> tuple[Any, ApiToken] | None:
    header = request.headers.get("Authorization", "")
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    if scheme.lower() not in ("bearer", "token") or not value.strip():
        raise ApiError(401, "Authorization header must be 'Bearer <token>'", "Authorization")
    row = ApiToken.objects.select_related("user").filter(digest=digest(value.strip())).first()
    if row is None:
        raise ApiError(401, "unknown API token", "Authorization")
    if row.revoked_at is not None:
        raise ApiError(401, "this API token was revoked", "Authorization")
    if not row.user.is_active:
        raise ApiError(401, "the token's user is inactive", "Authorization")
    now = timezone.now()
    if row.last_used is None or (now - row.last_used).total_seconds() > 60:
        ApiToken.objects.filter(pk=row.pk).update(last_used=now)
    return row.user, row


def _csrf_failure(request: HttpRequest) -> HttpResponse | None:
    check = CsrfViewMiddleware(lambda r: HttpResponse())
    check.process_request(request)
    return check.process_view(request, lambda r: HttpResponse(), (), {})


def rate_limit_per_minute() -> int:
    return int(getattr(settings, "GRUE_API_WRITES_PER_MIN", 1200))


def max_body_bytes() -> int:
    return int(getattr(settings, "GRUE_API_MAX_BODY", 8 * 1024 * 1024))


def _rate_limit(key: str) -> None:
    """A fixed one-minute window per caller (token or user), counted in the shared cache so every
    server process sees the same count. A cache outage lets requests through (the limit protects the
    database, which is still there); it never fails a write."""
    limit = rate_limit_per_minute()
    window = int(time.time() // 60)
    cache_key = f"api-rate:{key}:{window}"
    try:
        cache.add(cache_key, 0, timeout=120)
        count = cache.incr(cache_key)
    except Exception:  # noqa: BLE001 - see docstring
        return
    if count > limit:
        retry = 60 - int(time.time() % 60)
        raise ApiError(
            429,
            f"rate limit: at most {limit} write requests per minute; retry in {retry} s",
            headers={"Retry-After": str(retry)},
        )


def api_view(*, methods: tuple[str, ...], write: bool = False) -> Callable:
    """Wrap an API view: authenticate (token or session), require the researcher role, CSRF for
    session writes, rate and size limits on writes, JSON errors. The view gets ``request.api_user``."""

    def decorator(view: Callable[..., Any]) -> Callable[..., HttpResponse]:
        @csrf_exempt
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                if request.method not in methods:
                    raise ApiError(
                        405, f"method {request.method} not allowed; use {', '.join(methods)}",
                        headers={"Allow": ", ".join(methods)},
                    )  # fmt: skip
                found = _token_user(request)
                if found is not None:
                    user, token = found
                    caller = f"t{token.pk}"
                else:
                    user = request.user
                    if not user.is_authenticated:
                        raise ApiError(401, "authentication required: send 'Authorization: Bearer <token>'")
                    if request.method not in SAFE_METHODS:
                        failure = _csrf_failure(request)
                        if failure is not None:
                            raise ApiError(403, "CSRF check failed (session requests need the CSRF token)")
                    caller = f"u{user.pk}"
                if not is_researcher(user):
                    raise ApiError(403, "the API needs the researcher role")
                request.api_user = user
                if write:
                    _rate_limit(caller)
                    read_body(request)
                return view(request, *args, **kwargs)
            except ApiError as exc:
                return exc.response()
            except (OperationalError, InterfaceError) as exc:
                # A database outage is answered in the API's shape, never as Django's HTML error
                # page: clients read ``error`` and the remote sink retries a 503 as an outage.
                log.warning("API %s %s: database unavailable: %s", request.method, request.path, exc)
                return ApiError(
                    503, f"the database is unavailable ({type(exc).__name__}); retry later",
                    headers={"Retry-After": "5"},
                ).response()  # fmt: skip
            except Exception:  # noqa: BLE001 - every API answer is JSON, even a bug's
                log.exception("API %s %s failed", request.method, request.path)
                return ApiError(500, "internal server error (logged on the server)").response()

        return wrapped

    return decorator


def read_body(request: HttpRequest) -> bytes:
    """The request body, up to the API's own limit (``GRUE_API_MAX_BODY``, 8 MiB).

    Why not ``request.body``: Django refuses a body over ``DATA_UPLOAD_MAX_MEMORY_SIZE`` (the 5 MiB
    form limit) there with an HTML 400, before the API's documented limit could apply. The API reads
    the stream itself when the declared length is within its limit and answers 413 (JSON) above it."""
    if hasattr(request, "_body"):
        body = request._body
    else:
        raw = request.headers.get("Content-Length") or "0"
        try:
            length = int(raw)
        except ValueError:
            raise ApiError(400, "must be a whole number of bytes", "Content-Length") from None
        if length < 0:
            raise ApiError(400, "must be a whole number of bytes", "Content-Length")
        if length > max_body_bytes():
            raise ApiError(413, f"request body over {max_body_bytes()} bytes; send smaller batches", "body")
        body = request.read(max_body_bytes() + 1) if length else b""
        request._body = body  # what ``request.body`` returns from now on
    if len(body) > max_body_bytes():
        raise ApiError(413, f"request body over {max_body_bytes()} bytes; send smaller batches", "body")
    return body


def json_body(request: HttpRequest) -> dict[str, Any]:
    """The request's JSON object (400 naming the problem otherwise)."""
    ctype = request.headers.get("Content-Type", "")
    if not ctype.startswith("application/json"):
        raise ApiError(415, "send the body as application/json", "Content-Type")
    try:
        data = json.loads(read_body(request) or b"null")
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ApiError(400, f"body is not valid JSON: {exc}", "body") from None
    if not isinstance(data, dict):
        raise ApiError(400, "body must be a JSON object", "body")
    return data
