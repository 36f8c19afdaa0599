"""Top-level URLs. Apps written by other parts of the team are included only once they exist,
so that the site starts while they are being built."""

from __future__ import annotations

import importlib.util
import logging
import posixpath
from pathlib import Path

import plotly
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.contrib.staticfiles import finders
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.urls import include, path, re_path
from django.views.decorators.cache import cache_control
from django.views.decorators.http import require_GET

from webapp.access import researcher_required


def _has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


PLOTLY_JS = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"


@require_GET
@cache_control(max_age=86400, public=True)
def plotly_js(request: HttpRequest) -> FileResponse:
    """Plotly's bundle ships in the plotly wheel: serve it so pages need no CDN (works offline)."""
    return FileResponse(PLOTLY_JS.open("rb"), content_type="application/javascript")


@require_GET
def static_file(request: HttpRequest, path: str) -> FileResponse:
    """Serve static files from the app dirs in every mode (daphne does not); fine for one machine.
    Production deployments may put a reverse proxy in front (see docs/deploy.md)."""
    clean = posixpath.normpath(path).lstrip("/")
    found = finders.find(clean) if clean and not clean.startswith("..") else None
    if not found:
        raise Http404(path)
    import mimetypes

    ctype, _ = mimetypes.guess_type(found)
    return FileResponse(open(found, "rb"), content_type=ctype or "application/octet-stream")


@researcher_required
def placeholder_home(request: HttpRequest) -> HttpResponse:
    from django.shortcuts import render

    return render(request, "base.html", {})


urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    path("static/vendor/plotly.min.js", plotly_js, name="plotly_js"),
    re_path(r"^static/(?P<path>.+)$", static_file, name="static_file"),
]


def _optional(prefix: str, module: str, app: str | None = None) -> bool:
    """Include another part's URLs when that part exists; a part that fails to import is logged
    (loudly) and left out instead of taking the whole site down."""
    if (app and app not in settings.INSTALLED_APPS) or not _has(module):
        return False
    try:
        urlpatterns.append(path(prefix, include(module)))
        return True
    except ImportError:
        logging.getLogger(__name__).exception(
            "URLs of %s could not be imported; %s is disabled", module, prefix
        )
        return False


_optional("annotate/", "annotation.urls", "annotation")
_optional("grue/", "webapp.grue.urls", "webapp.grue")
if not _optional("", "webapp.runs.urls"):
    urlpatterns.append(path("", placeholder_home, name="home"))
