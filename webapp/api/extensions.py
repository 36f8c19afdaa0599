"""Extension point of the HTTP API: other apps add endpoints under ``/api/v1/`` here.

The API app imports nothing from the apps that extend it (as ``webapp.runs.extensions`` for the
launch form and the run page): an app registers its routes, with their OpenAPI paths and schemas,
in its ``AppConfig.ready()``. Removing the app from ``INSTALLED_APPS`` removes its endpoints and
their documentation together; the views use this app's ``api_view`` (tokens, limits, JSON errors).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.urls import URLPattern


@dataclass
class ApiRoutes:
    """``patterns``: URL patterns relative to the site root (``api/v1/...``); ``paths``: their OpenAPI
    ``paths`` entries (relative to ``/api/v1``); ``schemas``: component schemas they reference."""

    patterns: list[URLPattern]
    paths: dict[str, Any] = field(default_factory=dict)
    schemas: dict[str, Any] = field(default_factory=dict)


_routes: dict[str, ApiRoutes] = {}


def register_routes(name: str, routes: ApiRoutes) -> None:
    """Add (or replace, by ``name``: ``ready()`` may run more than once in tests) a group of endpoints."""
    _routes[name] = routes


def url_patterns() -> list[URLPattern]:
    return [p for routes in _routes.values() for p in routes.patterns]


def openapi_paths() -> dict[str, Any]:
    return {path: spec for routes in _routes.values() for path, spec in routes.paths.items()}


def openapi_schemas() -> dict[str, Any]:
    return {name: spec for routes in _routes.values() for name, spec in routes.schemas.items()}
