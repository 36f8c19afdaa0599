"""Settings for GRUE Studio, read from the environment (12-factor) with safe development defaults.

Environment variables (see docs/platform.md):
  DATABASE_URL       postgres://user:pass@host:port/db  (``manage.py up`` starts an embedded one when unset)
  REDIS_URL          redis://host:port/db                (broker, result backend and Channels layer)
  SECRET_KEY         required when DEBUG is off; a per-data-dir key is generated for development
  DEBUG              1/0 (default 1 for development)
  ALLOWED_HOSTS      comma-separated (default localhost,127.0.0.1,[::1],testserver)
  GRUE_DATA_DIR      data directory (default ./var): embedded services, run directories, secret key
  GRUE_ALLOWED_ROOTS colon-separated directories that file paths typed into forms must stay inside
                     (default: the data dir and ./runs)
  CELERY_QUEUE       queue name the web app enqueues runs on (default "runs")
"""

from __future__ import annotations

import importlib.util
import os
import secrets
from pathlib import Path

import dj_database_url

BASE_DIR = Path(__file__).resolve().parent.parent


def _env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    return raw.strip().lower() in {"1", "true", "yes", "on"}


def _module_exists(name: str) -> bool:
    """Optional apps written by other parts of the team load only once their package exists."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


DATA_DIR = Path(os.environ.get("GRUE_DATA_DIR") or (BASE_DIR / "var")).resolve()
RUNS_DIR = Path(os.environ.get("GRUE_RUNS_DIR") or (DATA_DIR / "runs")).resolve()

DEBUG = _env_bool("DEBUG", True)


def _secret_key() -> str:
    key = os.environ.get("SECRET_KEY")
    if key:
        return key
    if not DEBUG:
        raise RuntimeError("SECRET_KEY must be set when DEBUG is off")
    # Development: one random key per data directory, so sessions survive restarts.
    path = DATA_DIR / "secret_key"
    try:
        if path.exists():
            return path.read_text().strip()
        DATA_DIR.mkdir(parents=True, exist_ok=True)
        key = secrets.token_urlsafe(50)
        path.write_text(key)
        path.chmod(0o600)
        return key
    except OSError:
        return "dev-insecure-" + secrets.token_urlsafe(20)


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

OPTIONAL_APPS = [name for name in ("annotation", "webapp.grue") if _module_exists(name)]

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
    *OPTIONAL_APPS,
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
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
        "BACKEND": "django.core.cache.backends.redis.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": CHANNEL_PREFIX,
        "OPTIONS": {"socket_timeout": 2, "socket_connect_timeout": 2},
    }
}

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
CELERY_BEAT_SCHEDULE = {
    "mark-lost-runs": {"task": "webapp.runs.tasks.mark_lost_runs", "schedule": 30.0},
}

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator", "OPTIONS": {"min_length": 8}},
]
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

SESSION_COOKIE_HTTPONLY = True
CSRF_COOKIE_HTTPONLY = False
X_FRAME_OPTIONS = "DENY"
SECURE_CONTENT_TYPE_NOSNIFF = True
if not DEBUG:
    SESSION_COOKIE_SECURE = _env_bool("SECURE_COOKIES", True)
    CSRF_COOKIE_SECURE = _env_bool("SECURE_COOKIES", True)

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "WARNING")},
}
