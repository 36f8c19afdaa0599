"""``python -m webapp.server -b HOST -p PORT webapp.asgi:application``: daphne with GRUE's request
limits installed (see ``webapp.limits``). Takes daphne's own options; used by ``manage.py up`` and
the deploy files instead of bare ``daphne``."""

from __future__ import annotations

import os

from webapp.limits import serve

if __name__ == "__main__":
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
    serve()
