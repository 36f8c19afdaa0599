"""Security pieces shared by every app: a JSON cache serializer, login throttling, the
Content-Security-Policy header, and the safety checks ``manage.py up`` applies before it serves.

Why each exists (issue 14 item 10, issue 16 items 1 and 3):
- Django's Redis cache pickles by default; anyone who can write to Redis could then make the web
  server or a worker run code when the chart-data path reads the cache. ``JsonSerializer`` never
  unpickles: a value that is not JSON is a cache miss.
- Without throttling, a login form is an unlimited password oracle; ``LoginThrottleMiddleware``
  refuses a user+address pair after ``GRUE_LOGIN_MAX_FAILURES`` failures inside the window.
- The CSP makes an escaping mistake in a template much less useful to an attacker: scripts run
  only from this origin or with the per-response nonce.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.contrib.auth.signals import user_logged_in, user_login_failed
from django.core.cache import cache
from django.core.cache.backends.redis import RedisCache, RedisCacheClient
from django.dispatch import receiver
from django.http import HttpRequest, HttpResponse
from django.utils.html import escape

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------- cache serializer


class JsonSerializer:
    """Serializer for ``django.core.cache.backends.redis.RedisCache`` that never unpickles.

    Integers stay raw (like Django's own serializer) so ``incr``/``decr`` are atomic in Redis.
    A stored value that is not valid JSON (e.g. a planted pickle) raises ``ValueError``, which
    :class:`JsonRedisCache` turns into a miss, so nothing foreign is ever turned into objects."""

    def dumps(self, obj: Any) -> bytes | int:
        if type(obj) is int:
            return obj
        return json.dumps(obj, separators=(",", ":"), allow_nan=True).encode()

    def loads(self, data: bytes | str | int) -> Any:
        if isinstance(data, int):
            return data
        try:
            return int(data)
        except ValueError:
            pass
        text = data.decode() if isinstance(data, bytes) else data
        return json.loads(text)


class _MissOnForeignValueClient(RedisCacheClient):
    """Reads that count a stored value the serializer refuses as absent, and remove it, so that
    ``add`` and ``get_or_set`` (which only write a missing key) store a fresh value again."""

    def get(self, key: Any, default: Any) -> Any:
        try:
            return super().get(key, default)
        except ValueError:  # not JSON (a planted pickle, stray bytes); UnicodeDecodeError included
            self.delete(key)
            return default

    def get_many(self, keys: Any) -> dict[Any, Any]:
        found = {}
        for key, raw in zip(keys, self.get_client(None).mget(keys), strict=True):
            if raw is None:
                continue
            try:
                found[key] = self._serializer.loads(raw)
            except ValueError:
                self.delete(key)
        return found


class JsonRedisCache(RedisCache):
    """Django's Redis cache, with :class:`JsonSerializer`, where a value that is not JSON is a miss.

    Why: anyone who can write to Redis can plant bytes under a cache key; the serializer refuses to
    turn them into objects, but Django's client let that ``ValueError`` out of ``cache.get``, so one
    planted value made every page reading that key fail instead of recomputing it."""

    def __init__(self, server: Any, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        self._class = _MissOnForeignValueClient


# --------------------------------------------------------------------------- login throttling


def _client_ip(request: HttpRequest) -> str:
    """The address the throttle counts. Behind the reverse proxy of deploy/ the proxy's address is
    the same for everybody, so the last X-Forwarded-For hop is used when GRUE_TRUST_PROXY is on."""
    addr = request.META.get("REMOTE_ADDR", "") or ""
    if getattr(settings, "GRUE_TRUST_PROXY", False):
        fwd = request.META.get("HTTP_X_FORWARDED_FOR", "")
        if fwd:
            addr = fwd.split(",")[-1].strip()
    try:
        return str(ipaddress.ip_address(addr))
    except ValueError:
        return "unknown"


def _throttle_key(username: str, ip: str) -> str:
    digest = hashlib.sha256(f"{username.strip().lower()}|{ip}".encode()).hexdigest()[:32]
    return f"login-fail:{digest}"


def _failures(key: str) -> int:
    try:
        return int(cache.get(key) or 0)
    except Exception:  # noqa: BLE001 - a cache outage must not lock everybody out
        return 0


@receiver(user_login_failed)
def _count_failure(
    sender: Any, credentials: dict[str, Any], request: HttpRequest | None = None, **kw: Any
) -> None:
    if request is None:
        return
    key = _throttle_key(str(credentials.get("username", "")), _client_ip(request))
    window = int(settings.GRUE_LOGIN_WINDOW)
    try:
        if not cache.add(key, 1, timeout=window):
            cache.incr(key)
    except Exception:  # noqa: BLE001
        log.warning("login throttle: cache unavailable", exc_info=True)


@receiver(user_logged_in)
def _reset_failures(sender: Any, request: HttpRequest | None = None, user: Any = None, **kw: Any) -> None:
    if request is None or user is None:
        return
    try:
        cache.delete(_throttle_key(user.get_username(), _client_ip(request)))
    except Exception:  # noqa: BLE001
        pass


class LoginThrottleMiddleware:
    """Refuses a login POST with 429 once that username from that address failed
    ``GRUE_LOGIN_MAX_FAILURES`` times within ``GRUE_LOGIN_WINDOW`` seconds (counted in the cache,
    so every web process shares the count). The password is not even checked while refused."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.method == "POST" and request.path in _login_paths():
            username = request.POST.get("username", "")
            key = _throttle_key(username, _client_ip(request))
            if _failures(key) >= int(settings.GRUE_LOGIN_MAX_FAILURES):
                minutes = max(1, int(settings.GRUE_LOGIN_WINDOW) // 60)
                body = (
                    "<!doctype html><title>Too many attempts</title><h1>Too many failed logins</h1>"
                    f"<p>Too many failed logins for {escape(username)!s} from your address. "
                    f"Try again in {minutes} minute(s).</p>"
                )
                resp = HttpResponse(body, status=429)
                resp["Retry-After"] = str(int(settings.GRUE_LOGIN_WINDOW))
                return resp
        return self.get_response(request)


def _login_paths() -> set[str]:
    return {str(settings.LOGIN_URL), "/admin/login/"}


# --------------------------------------------------------------------------- Content-Security-Policy


class ContentSecurityPolicyMiddleware:
    """Adds ``Content-Security-Policy`` with a fresh nonce per response. Templates put
    ``nonce="{{ csp_nonce }}"`` on their few inline scripts; everything else is a same-origin file.
    Styles allow inline attributes (Plotly sets element styles at run time)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]):
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        nonce = secrets.token_urlsafe(16)
        request.csp_nonce = nonce  # type: ignore[attr-defined]
        response = self.get_response(request)
        if "Content-Security-Policy" not in response:
            response["Content-Security-Policy"] = csp_header(nonce)
        return response


def csp_header(nonce: str) -> str:
    return "; ".join(
        [
            "default-src 'self'",
            f"script-src 'self' 'nonce-{nonce}'",
            "style-src 'self' 'unsafe-inline'",
            "img-src 'self' data: blob:",
            "font-src 'self' data:",
            "connect-src 'self' ws: wss:",
            "worker-src 'self' blob:",
            "object-src 'none'",
            "base-uri 'self'",
            "form-action 'self'",
            "frame-ancestors 'none'",
        ]
    )


def csp_context(request: HttpRequest) -> dict[str, str]:
    """Template context: ``csp_nonce`` for inline ``<script nonce=...>``."""
    return {"csp_nonce": getattr(request, "csp_nonce", "")}


# --------------------------------------------------------------------------- binding checks


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host in ("localhost", ""):
        return host == "localhost"
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
