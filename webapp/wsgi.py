"""WSGI entry point (HTTP only; live updates need the ASGI app in ``webapp.asgi``).

Bodies over ``GRUE_MAX_REQUEST_BYTES`` are refused with 413 before Django reads them."""

import os

from django.core.wsgi import get_wsgi_application

from webapp.limits import WsgiBodyLimit

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
application = WsgiBodyLimit(get_wsgi_application())
