"""Roles and the decorators that enforce them.

Roles are Django Groups so that admins manage them in the admin site: "researcher" (runs, compare,
launch), "annotator" (annotation only). Superusers are admins and may do everything. An annotator
who opens a researcher page is sent to the annotation app (HTML) or gets 403 (API/JSON/websocket).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, Literal

from django.conf import settings
from django.contrib.auth.views import redirect_to_login
from django.http import HttpRequest, HttpResponse, HttpResponseForbidden, HttpResponseRedirect

RESEARCHER = "researcher"
ANNOTATOR = "annotator"
Role = Literal["admin", "researcher", "annotator"]


def role_of(user: Any) -> Role | None:
    """The strongest role of a user; None for anonymous users or users without a role."""
    if user is None or not getattr(user, "is_authenticated", False) or not getattr(user, "is_active", False):
        return None
    if user.is_superuser:
        return "admin"
    names = _group_names(user)
    if RESEARCHER in names:
        return "researcher"
    if ANNOTATOR in names:
        return "annotator"
    return None


def _group_names(user: Any) -> set[str]:
    cached = getattr(user, "_grue_groups", None)
    if cached is None:
        cached = set(user.groups.values_list("name", flat=True))
        try:
            user._grue_groups = cached
        except AttributeError:
            pass
    return cached


def is_researcher(user: Any) -> bool:
    return role_of(user) in ("admin", "researcher")


def is_annotator(user: Any) -> bool:
    """Annotators, researchers and admins may all annotate."""
    return role_of(user) in ("admin", "researcher", "annotator")


def _wants_json(request: HttpRequest) -> bool:
    accept = request.headers.get("Accept", "")
    return (
        "application/json" in accept
        or request.headers.get("X-Requested-With") == "XMLHttpRequest"
        or request.path.startswith("/api/")
    )


def _guard(check: Callable[[Any], bool], redirect_annotators: bool) -> Callable:
    def decorator(view: Callable[..., HttpResponse]) -> Callable[..., HttpResponse]:
        @wraps(view)
        def wrapped(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            user = request.user
            if not user.is_authenticated:
                if _wants_json(request):
                    return HttpResponse(
                        '{"error": "login required"}', status=401, content_type="application/json"
                    )
                return redirect_to_login(request.get_full_path(), settings.LOGIN_URL)
            if check(user):
                return view(request, *args, **kwargs)
            if redirect_annotators and role_of(user) == "annotator" and not _wants_json(request):
                return HttpResponseRedirect("/annotate/")
            return HttpResponseForbidden("You do not have the role needed for this page.")

        return wrapped

    return decorator


researcher_required = _guard(is_researcher, redirect_annotators=True)
researcher_required.__doc__ = "Login + researcher/admin role; annotators are redirected to /annotate/."
annotator_required = _guard(is_annotator, redirect_annotators=False)
annotator_required.__doc__ = "Login + any role that may annotate (annotator, researcher, admin)."


def role_context(request: HttpRequest) -> dict[str, Any]:
    """Template context: ``user_role`` lets base.html show only the nav entries a user may open."""
    user = getattr(request, "user", None)
    return {"user_role": role_of(user) if user is not None else None}
