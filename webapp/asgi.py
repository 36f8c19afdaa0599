"""ASGI entry point: HTTP through Django, websockets through Channels with session auth.

HTTP bodies over ``GRUE_MAX_REQUEST_BYTES`` are refused with 413 before Django reads them
(``webapp.limits.AsgiBodyLimit``); run it with ``python -m webapp.server`` so daphne itself does
not buffer an oversized body either."""

import gc
import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
# A server process reuses database connections from a pool (see GRUE_DB_POOL in settings); set
# GRUE_DB_POOL=0 to open one per request instead. The variable is set only while the settings load:
# left in the environment it would reach every process this one starts (or, imported by a test, the
# suite's workers and `manage.py up` children), which must not keep idle pooled connections.
_pool_default = "GRUE_DB_POOL" not in os.environ
if _pool_default:
    os.environ["GRUE_DB_POOL"] = "1"
try:
    # Django must be set up before importing consumers (they import models).
    django_asgi_app = get_asgi_application()
finally:
    if _pool_default:
        del os.environ["GRUE_DB_POOL"]

from channels.auth import AuthMiddlewareStack  # noqa: E402
from channels.routing import ProtocolTypeRouter, URLRouter  # noqa: E402
from channels.security.websocket import AllowedHostsOriginValidator  # noqa: E402

from webapp import staticfiles  # noqa: E402
from webapp.limits import AsgiBodyLimit  # noqa: E402
from webapp.runs.routing import websocket_urlpatterns  # noqa: E402

application = ProtocolTypeRouter(
    {
        "http": AsgiBodyLimit(django_asgi_app),
        "websocket": AllowedHostsOriginValidator(AuthMiddlewareStack(URLRouter(websocket_urlpatterns))),
    }
)

# The static files, read and gzipped once here rather than by the first visitor after a restart.
staticfiles.warm()

# Everything imported so far (Django, the apps, their dependencies) lives as long as the process.
# Freezing it keeps the collector's full passes to the objects made since: unfrozen, a full pass
# walked them all and took ~100 ms, so one chart-data request in a few took 140 ms instead of 30
# (issue #15's cold-chart target is 50 ms).
gc.freeze()
