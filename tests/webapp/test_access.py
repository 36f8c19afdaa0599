"""Login and roles: researcher pages, annotator redirection, admin."""

from __future__ import annotations

import pytest
from django.http import HttpResponse
from django.test import RequestFactory

from webapp.access import annotator_required, researcher_required, role_of


@researcher_required
def research_view(request):
    return HttpResponse("research")


@annotator_required
def annotate_view(request):
    return HttpResponse("annotate")


def _call(view, user, **headers):
    req = RequestFactory().get("/some/page/?x=1", **headers)
    req.user = user
    return view(req)


@pytest.mark.django_db
def test_roles(researcher, annotator, admin, nobody):
    from django.contrib.auth.models import AnonymousUser

    assert role_of(researcher) == "researcher"
    assert role_of(annotator) == "annotator"
    assert role_of(admin) == "admin"
    assert role_of(nobody) is None
    assert role_of(AnonymousUser()) is None
    researcher.is_active = False
    assert role_of(researcher) is None


@pytest.mark.django_db
def test_researcher_required(researcher, annotator, admin, nobody):
    from django.contrib.auth.models import AnonymousUser

    assert _call(research_view, researcher).content == b"research"
    assert _call(research_view, admin).status_code == 200
    anon = _call(research_view, AnonymousUser())
    assert anon.status_code == 302 and anon["Location"].startswith("/accounts/login/?next=/some/page/")
    assert _call(research_view, AnonymousUser(), HTTP_ACCEPT="application/json").status_code == 401
    ann = _call(research_view, annotator)
    assert ann.status_code == 302 and ann["Location"] == "/annotate/"
    assert _call(research_view, annotator, HTTP_ACCEPT="application/json").status_code == 403
    assert _call(research_view, nobody).status_code == 403


@pytest.mark.django_db
def test_annotator_required_admits_every_role(researcher, annotator, admin, nobody):
    for user in (researcher, annotator, admin):
        assert _call(annotate_view, user).status_code == 200
    assert _call(annotate_view, nobody).status_code == 403


@pytest.mark.django_db
def test_site_pages_require_login_and_role(client, annotator):
    assert client.get("/").status_code == 302
    r = client.get("/accounts/login/")
    assert r.status_code == 200 and b"csrfmiddlewaretoken" in r.content
    client.force_login(annotator)
    r = client.get("/")
    assert r.status_code == 302 and r["Location"] == "/annotate/"


@pytest.mark.django_db
def test_login_form_and_logout(client, researcher, password_of):
    r = client.post("/accounts/login/", {"username": "rita", "password": "wrong"})
    assert r.status_code == 200 and b"didn't match" in r.content
    r = client.post("/accounts/login/", {"username": "rita", "password": password_of(researcher)})
    assert r.status_code == 302
    assert client.get("/").status_code == 200
    assert client.post("/accounts/logout/").status_code == 302
    assert client.get("/").status_code == 302


@pytest.mark.django_db
def test_csrf_enforced_on_login(researcher, password_of):
    from django.test import Client

    c = Client(enforce_csrf_checks=True)
    r = c.post("/accounts/login/", {"username": "rita", "password": password_of(researcher)})
    assert r.status_code == 403


def test_plotly_bundle_served_from_the_wheel(client):
    r = client.get("/static/vendor/plotly.min.js")
    assert r.status_code == 200 and r["Content-Type"] == "application/javascript"
    head = r.content[:2000]
    assert b"plotly" in head.lower()


def test_static_css_served(client):
    r = client.get("/static/css/app.css")
    assert r.status_code == 200 and b"--accent" in r.content
    assert client.get("/static/../settings.py").status_code == 404
