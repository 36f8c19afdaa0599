"""Top-level URLs: the site's own pages (login, admin, static files) and every app's URLs.

Every app is part of this repository and is included unconditionally: an app that fails to import
stops the site at start-up with its traceback instead of silently disappearing."""

from __future__ import annotations

import mimetypes
import posixpath
from pathlib import Path

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.staticfiles import finders
from django.http import FileResponse, Http404, HttpRequest
from django.urls import include, path, re_path
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

# A partial plotly.js bundle (only the traces the app draws), built by webapp/static/build/build.mjs.
PLOTLY_JS = Path(__file__).resolve().parent / "static" / "vendor" / "plotly.min.js"


@require_GET
@cache_control(max_age=86400, public=True)
def plotly_js(request: HttpRequest) -> FileResponse:
    """The committed partial plotly bundle, served by the app so pages need no CDN (works offline)."""
    return FileResponse(PLOTLY_JS.open("rb"), content_type="application/javascript")


@require_GET
def static_file(request: HttpRequest, path: str) -> FileResponse:
    """Serve static files from the app dirs in every mode (daphne does not); fine for one machine.
    Production deployments may put a reverse proxy in front (see docs/deploy.md)."""
    clean = posixpath.normpath(path).lstrip("/")
    found = finders.find(clean) if clean and not clean.startswith("..") else None
    if not found:
        raise Http404(path)
    ctype, _ = mimetypes.guess_type(found)
    return FileResponse(open(found, "rb"), content_type=ctype or "application/octet-stream")


urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("static/vendor/plotly.min.js", plotly_js, name="plotly_js"),
    re_path(r"^static/(?P<path>.+)$", static_file, name="static_file"),
    path("annotate/", include("annotation.urls")),
    path("grue/", include("webapp.grue.urls")),
    path("", include("webapp.api.urls")),
    path("", include("webapp.runs.urls")),
]
