"""Top-level URLs: the site's own pages (login, admin, static files) and every app's URLs.

Every app is part of this repository and is included unconditionally: an app that fails to import
stops the site at start-up with its traceback instead of silently disappearing."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path, re_path

from webapp import staticfiles

urlpatterns = [
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("admin/", admin.site.urls),
    # The partial plotly bundle (webapp/static/build/), also reachable by name for templates that
    # do not use {% static %}; pages that do get a versioned, year-long cacheable URL.
    path(
        "static/vendor/plotly.min.js", staticfiles.serve, {"path": "vendor/plotly.min.js"}, name="plotly_js"
    ),
    # Static files in every mode (daphne serves none): webapp/staticfiles.py. A reverse proxy may
    # serve them instead in production (docs/deploy.md).
    re_path(r"^static/(?P<path>.+)$", staticfiles.serve, name="static_file"),
    path("annotate/", include("annotation.urls")),
    path("grue/", include("webapp.grue.urls")),
    path("", include("webapp.api.urls")),
    path("", include("webapp.runs.urls")),
]

# Errors raised outside a view: JSON under /api/ (webapp/api/views.py), the usual pages elsewhere.
handler400 = "webapp.api.views.bad_request"
handler404 = "webapp.api.views.not_found"
handler500 = "webapp.api.views.server_error"
