"""Settings for GRUE Studio, read from the environment (12-factor) with safe development defaults.

Environment variables (see docs/platform.md):
  DATABASE_URL       postgres://user:pass@host:port/db  (``manage.py up`` starts an embedded one when unset)
  REDIS_URL          redis://host:port/db                (broker, result backend and Channels layer)
  SECRET_KEY         set it in production; otherwise a random key is kept in <data dir>/secret_key (0600)
  DEBUG              1/0 (default 0; ``manage.py up --debug`` turns it on, loopback binds only)
  GRUE_HTTPS         1 behind TLS: secure cookies, HSTS, SSL redirect (see docs/deploy.md#security)
  GRUE_TRUST_PROXY   1 behind the deploy/ reverse proxy: X-Forwarded-Proto/-For are believed
  GRUE_MAX_REQUEST_BYTES  largest request body accepted, refused before buffering (default 64 MiB)
  ALLOWED_HOSTS      comma-separated (default localhost,127.0.0.1,[::1],testserver)
  GRUE_DATA_DIR      data directory (default ./var): embedded services, run directories, secret key
  GRUE_ALLOWED_ROOTS colon-separated directories that file paths typed into forms must stay inside
                     (default: the data dir and ./runs)
  GRUE_OUTBOUND_ALLOW  addresses (IPs, CIDR networks, host names) an AI-judge endpoint may have although
                     they are private or loopback (default none; docs/deploy.md#security)
  CELERY_QUEUE       queue name the web app enqueues runs on (default "runs")
  GRUE_DB_POOL       1 (set by webapp.asgi for server processes): borrow connections from a psycopg
                     pool of GRUE_DB_POOL_MAX (default 8) instead of opening one per request
"""

from __future__ import annotations

import os
from pathlib import Path

import dj_database_url

from webapp.private import ensure_private_dir, read_or_create_secret

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


DATA_DIR = Path(os.environ.get("GRUE_DATA_DIR") or (BASE_DIR / "var")).resolve()
RUNS_DIR = Path(os.environ.get("GRUE_RUNS_DIR") or (DATA_DIR / "runs")).resolve()

# Off unless explicitly enabled: a forgotten variable must not show settings and tracebacks.
DEBUG = _env_bool("DEBUG", False)


def _secret_key() -> str:
    key = os.environ.get("SECRET_KEY")
    if key:
        return key
    # One random key per data directory, so sessions survive restarts of `up`.
    ensure_private_dir(DATA_DIR)
    return read_or_create_secret(DATA_DIR / "secret_key")


SECRET_KEY = _secret_key()
ALLOWED_HOSTS = [
    h.strip()
    for h in os.environ.get("ALLOWED_HOSTS", "localhost,127.0.0.1,[::1],testserver").split(",")
    if h.strip()
]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o.strip()]

ALLOWED_ROOTS = [
    Path(p).resolve()
    for p in (os.environ.get("GRUE_ALLOWED_ROOTS") or f"{DATA_DIR}:{BASE_DIR / 'runs'}").split(":")
    if p.strip()
]

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.postgres",
    "channels",
    "webapp.runs",
    "annotation",
    "webapp.grue",
    "webapp.api",
    "webapp.platform",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "webapp.security.ContentSecurityPolicyMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "webapp.security.LoginThrottleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "webapp.urls"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "webapp" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "webapp.access.role_context",
                "webapp.security.csp_context",
            ],
        },
    },
]

WSGI_APPLICATION = "webapp.wsgi.application"
ASGI_APPLICATION = "webapp.asgi.application"

DATABASE_URL = os.environ.get("DATABASE_URL") or "postgres://postgres@127.0.0.1:5432/grue"
DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=0)}
if os.environ.get("GRUE_TEST_DB_NAME"):
    # A worker/server subprocess started by the test suite points at pytest-django's test database.
    DATABASES["default"]["NAME"] = os.environ["GRUE_TEST_DB_NAME"]
if os.environ.get("GRUE_DB_POOL", "") == "1":
    # The web server (``webapp.asgi`` sets GRUE_DB_POOL=1) borrows connections from a small psycopg
    # pool: opening a PostgreSQL connection per request was ~10 ms of a ~40 ms chart-data request
    # (issue #15), and persistent connections (CONN_MAX_AGE) are not safe under ASGI. Each borrowed
    # connection is checked first (one round trip), so a database restart costs no failed request.
    # Workers, the CLI and tests open connections as before: a pool per process would multiply idle
    # connections across every worker and test server.
    DATABASES["default"]["CONN_HEALTH_CHECKS"] = True
    # Django's backend with a pool whose failed check sweeps every idle connection (webapp/pgpool/base.py:
    # after a restart, psycopg's backoff between checks of eight dead connections outlasted the timeout).
    DATABASES["default"]["ENGINE"] = "webapp.pgpool"
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": 1,
        "max_size": int(os.environ.get("GRUE_DB_POOL_MAX", "8")),
        "timeout": 10,
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = os.environ.get("REDIS_URL") or "redis://127.0.0.1:6379/0"
CHANNEL_PREFIX = os.environ.get("GRUE_CHANNEL_PREFIX", "grue")

CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        # redis-py ≥ 6 defaults to a 5 s socket timeout, the same as channels-redis' 5 s BZPOPMIN:
        # an idle websocket would then die with "Timeout reading". Give reads more room.
        "CONFIG": {
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
            "prefix": CHANNEL_PREFIX,
            "capacity": 1500,
            "expiry": 30,
        },
    }
}

CACHES = {
    "default": {
        # Django's Redis cache where a stored value that is not JSON is a miss (webapp/security.py).
        "BACKEND": "webapp.security.JsonRedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": CHANNEL_PREFIX,
        # JSON, never pickle: a value planted in Redis must not run code in the web server or a worker.
        "OPTIONS": {
            "socket_timeout": 2,
            "socket_connect_timeout": 2,
            "serializer": "webapp.security.JsonSerializer",
        },
    }
}

# Outbound requests a user can aim (AI-judge endpoints) never reach loopback, private, link-local,
# reserved or multicast addresses (engine/netguard.py). A deployment that runs its own judge server
# on a private address lists it here: IPs, CIDR networks or exact host names, comma-separated.
OUTBOUND_ALLOW = [e for e in os.environ.get("GRUE_OUTBOUND_ALLOW", "").replace(",", " ").split() if e]

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = REDIS_URL
CELERY_TASK_DEFAULT_QUEUE = os.environ.get("CELERY_QUEUE", "runs")
CELERY_TASK_ACKS_LATE = False
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_SERIALIZER = "json"
CELERY_RESULT_SERIALIZER = "json"
CELERY_ACCEPT_CONTENT = ["json"]
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Launch must fail fast when the broker is down instead of blocking the request.
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "max_retries": 1,
    "interval_start": 0,
    "interval_step": 0.2,
    "interval_max": 0.5,
}
CELERY_TASK_PUBLISH_RETRY = False
CELERY_WORKER_HIJACK_ROOT_LOGGER = False
# Heartbeat policy of runs (seconds): the worker writes every HEARTBEAT_INTERVAL, a run without a
# heartbeat for LOST_AFTER is marked lost.
GRUE_HEARTBEAT_INTERVAL = float(os.environ.get("GRUE_HEARTBEAT_INTERVAL", "5"))
GRUE_LOST_AFTER = float(os.environ.get("GRUE_LOST_AFTER", "60"))
# The HTTP API (webapp.api, docs/api.md): write requests per token per minute, largest request body.
GRUE_API_WRITES_PER_MIN = int(os.environ.get("GRUE_API_WRITES_PER_MIN", "1200"))
GRUE_API_MAX_BODY = int(os.environ.get("GRUE_API_MAX_BODY", str(8 * 1024 * 1024)))
# The run watchdog (webapp.watchdog; `manage.py watch_runs`, started by `up`) sweeps every
# GRUE_WATCH_INTERVAL seconds in a process of its own, so detection never waits for a free worker,
# and resumes lost runs from their last checkpoint up to GRUE_AUTO_RESUME_LIMIT times.
GRUE_WATCH_INTERVAL = float(os.environ.get("GRUE_WATCH_INTERVAL", "10"))
GRUE_AUTO_RESUME = _env_bool("GRUE_AUTO_RESUME", True)
GRUE_AUTO_RESUME_LIMIT = int(os.environ.get("GRUE_AUTO_RESUME_LIMIT", "3"))
# For deployments that prefer celery beat to `watch_runs`: the check goes to its own queue, which a
# small worker (`celery -A webapp worker -Q control --concurrency 1`) consumes beside the trainers.
GRUE_CONTROL_QUEUE = os.environ.get("GRUE_CONTROL_QUEUE", "control")
CELERY_TASK_ROUTES = {"webapp.runs.tasks.mark_lost_runs": {"queue": GRUE_CONTROL_QUEUE}}
CELERY_BEAT_SCHEDULE = {
    "mark-lost-runs": {
        "task": "webapp.runs.tasks.mark_lost_runs",
        "schedule": GRUE_WATCH_INTERVAL,
        "options": {"queue": GRUE_CONTROL_QUEUE, "expires": GRUE_WATCH_INTERVAL * 3},
    },
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 10}},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
# Login throttle (webapp.security): this many failures per username + client address within the
# window (seconds) refuse further attempts with 429 until the window has passed.
GRUE_LOGIN_MAX_FAILURES = int(os.environ.get("GRUE_LOGIN_MAX_FAILURES", "5"))
GRUE_LOGIN_WINDOW = int(os.environ.get("GRUE_LOGIN_WINDOW", "900"))
LOGIN_URL = "/accounts/login/"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "/accounts/login/"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "/static/"
STATICFILES_DIRS = [BASE_DIR / "webapp" / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"
# {% static %} URLs carry ?v=<content hash>, so the app's static view (webapp/staticfiles.py) can let
# browsers cache them for a year; files are served from memory, gzip-compressed once.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "webapp.staticfiles.VersionedStaticStorage"},
}

# Request size (issue 14 item 4): bodies over GRUE_MAX_REQUEST_BYTES are refused with 413 before
# they are buffered (webapp.limits, in daphne and as ASGI/WSGI middleware); form fields over
# DATA_UPLOAD_MAX_MEMORY_SIZE are refused by Django; uploaded files over FILE_UPLOAD_MAX_MEMORY_SIZE
# are streamed to temporary files instead of memory.
GRUE_MAX_REQUEST_BYTES = int(os.environ.get("GRUE_MAX_REQUEST_BYTES", str(64 * 1024 * 1024)))
DATA_UPLOAD_MAX_MEMORY_SIZE = int(os.environ.get("GRUE_MAX_FORM_BYTES", str(5 * 1024 * 1024)))
DATA_UPLOAD_MAX_NUMBER_FIELDS = 2000
FILE_UPLOAD_MAX_MEMORY_SIZE = 2 * 1024 * 1024
FILE_UPLOAD_PERMISSIONS = 0o600
FILE_UPLOAD_DIRECTORY_PERMISSIONS = 0o700

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
SECURE_CROSS_ORIGIN_OPENER_POLICY = "same-origin"

# Production behind TLS (docs/deploy.md#security): GRUE_HTTPS=1 turns on secure cookies, HSTS and
# the redirect to https; GRUE_TRUST_PROXY=1 makes Django believe the proxy's X-Forwarded-Proto
# (only set it when a proxy that overwrites that header is the only way in).
GRUE_HTTPS = _env_bool("GRUE_HTTPS", False)
GRUE_TRUST_PROXY = _env_bool("GRUE_TRUST_PROXY", False)
SESSION_COOKIE_SECURE = _env_bool("SECURE_COOKIES", GRUE_HTTPS)
CSRF_COOKIE_SECURE = _env_bool("SECURE_COOKIES", GRUE_HTTPS)
if GRUE_HTTPS:
    SECURE_SSL_REDIRECT = _env_bool("GRUE_SSL_REDIRECT", True)
    SECURE_HSTS_SECONDS = int(os.environ.get("GRUE_HSTS_SECONDS", str(365 * 24 * 3600)))
    SECURE_HSTS_INCLUDE_SUBDOMAINS = _env_bool("GRUE_HSTS_INCLUDE_SUBDOMAINS", True)
    SECURE_HSTS_PRELOAD = _env_bool("GRUE_HSTS_PRELOAD", False)
if GRUE_TRUST_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
# Submitting a domain to the browsers' HSTS preload list is a decision for its owner, not a default.
SILENCED_SYSTEM_CHECKS = [] if _env_bool("GRUE_HSTS_PRELOAD", False) else ["security.W021"]

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}
