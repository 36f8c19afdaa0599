"""The favicon and the partial plotly bundle: linked from every page, served by the app, and the
bundle is the committed partial build (not the 4.8 MB full bundle). Static files: versioned URLs
cached for a year, gzip for text, ETag revalidation (webapp/staticfiles.py)."""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any

import pytest

VENDOR = Path(__file__).resolve().parents[2] / "webapp" / "static" / "vendor"


@pytest.mark.django_db
def test_every_page_links_the_favicon_and_it_is_served(researcher_client: Any, client: Any) -> None:
    for url, c in (
        ("/", researcher_client),
        ("/compare/?ids=1,2", researcher_client),
        ("/accounts/login/", client),
    ):
        html = c.get(url, follow=True).content.decode()
        icons = re.findall(r'<link rel="icon" href="([^"?]+)\?v=[0-9a-f]{16}"', html)
        assert icons == ["/static/img/favicon.svg", "/static/img/favicon.ico"], url
    svg = client.get("/static/img/favicon.svg")
    assert svg.status_code == 200 and svg["Content-Type"] == "image/svg+xml"
    assert b"<svg" in svg.content
    ico = client.get("/static/img/favicon.ico")
    body = ico.content
    assert ico.status_code == 200
    # ICO header: reserved 0, type 1 (icon), 3 frames (16, 32, 48 px) stored as PNG
    assert body[:6] == b"\x00\x00\x01\x00\x03\x00"
    assert [body[6 + 16 * i] for i in range(3)] == [16, 32, 48]
    assert body.count(b"\x89PNG") == 3


def test_plotly_url_serves_the_committed_partial_bundle(client: Any) -> None:
    r = client.get("/static/vendor/plotly.min.js")
    body = r.content
    assert r.status_code == 200 and r["Content-Type"] == "application/javascript"
    info = json.loads((VENDOR / "plotly.min.js.json").read_text())
    assert body == (VENDOR / "plotly.min.js").read_bytes() and len(body) == info["bytes"]
    assert info["traces"] == ["scatter", "bar", "heatmap"]  # no WebGL trace: the CSP forbids eval
    assert len(body) < 2_000_000  # the full bundle is 4.8 MB
    head = body[:400].decode()
    assert f"plotly.js v{info['plotly_js']}, partial bundle" in head
    assert (
        (VENDOR / "plotly.js-LICENSE.txt")
        .read_text()
        .startswith("MIT License\n\nCopyright (c) 2016-2024 Plotly")
    )


@pytest.mark.django_db
def test_static_urls_are_versioned_cached_for_a_year_and_gzipped(researcher_client: Any, client: Any) -> None:
    """The run page links its scripts with ?v=<content hash>; that URL may be cached for a year
    (immutable), a URL without the right hash must be revalidated; text is sent gzip-compressed
    to browsers that accept it, and an ETag match is a 304 without a body."""
    from webapp.runs.models import Run

    run = Run.objects.create(name="static", config={})
    html = researcher_client.get(f"/runs/{run.pk}/").content.decode()
    scripts = re.findall(r'<script src="([^"]+)"', html)
    bundle = next(u for u in scripts if u.startswith("/static/vendor/plotly.min.js"))
    assert re.fullmatch(r"/static/vendor/plotly\.min\.js\?v=[0-9a-f]{16}", bundle), scripts
    assert all("?v=" in u for u in scripts if u.startswith("/static/")), scripts
    raw = (VENDOR / "plotly.min.js").read_bytes()

    r = client.get(bundle, HTTP_ACCEPT_ENCODING="gzip, deflate, br")
    assert r.status_code == 200 and r["Content-Encoding"] == "gzip"
    assert r["Cache-Control"] == "public, max-age=31536000, immutable"
    assert "Accept-Encoding" in r["Vary"]
    assert gzip.decompress(r.content) == raw and len(r.content) < len(raw) * 0.5

    plain = client.get(bundle)  # no Accept-Encoding: the plain bytes
    assert plain.content == raw and not plain.has_header("Content-Encoding")
    refused = client.get(bundle, HTTP_ACCEPT_ENCODING="gzip;q=0")
    assert refused.content == raw and not refused.has_header("Content-Encoding")

    stale = client.get("/static/vendor/plotly.min.js?v=0000000000000000", HTTP_ACCEPT_ENCODING="gzip")
    assert stale.status_code == 200 and stale["Cache-Control"] == "no-cache"
    again = client.get("/static/vendor/plotly.min.js", HTTP_IF_NONE_MATCH=r["ETag"])
    assert again.status_code == 304 and again.content == b"" and again["ETag"] == r["ETag"]

    # Small files are not compressed (no gain), and a path outside the static dirs is a 404.
    ico = client.get("/static/img/favicon.ico", HTTP_ACCEPT_ENCODING="gzip")
    assert ico.status_code == 200 and not ico.has_header("Content-Encoding")
    assert client.get("/static/../settings.py").status_code == 404
    assert client.get("/static/%2e%2e/webapp/settings.py").status_code == 404


def test_a_changed_static_file_gets_a_new_version(tmp_path: Path, settings: Any) -> None:
    """Editing a file (a deploy, or JS during development) changes its URL and the bytes served,
    without a restart: the in-memory copy is keyed by the file's mtime and size."""
    from django.contrib.staticfiles.storage import staticfiles_storage
    from django.test import Client

    (tmp_path / "js").mkdir()
    f = tmp_path / "js" / "probe.js"
    f.write_text("console.log(1);\n" * 200)
    settings.STATICFILES_DIRS = [tmp_path]
    first = staticfiles_storage.url("js/probe.js")
    assert Client().get(first).content == f.read_bytes()
    f.write_text("console.log(22);\n" * 200)
    second = staticfiles_storage.url("js/probe.js")
    assert second != first and second.startswith("/static/js/probe.js?v=")
    assert Client().get(second).content == f.read_bytes()


def test_the_server_prepares_every_static_file_at_start_up(monkeypatch):
    """webapp.asgi calls warm(): plotly is read and gzipped before the first visitor asks for it."""
    from webapp import staticfiles

    monkeypatch.setattr(staticfiles, "_assets", {})
    n = staticfiles.warm()
    plotly = [a for p, a in staticfiles._assets.items() if p.endswith("vendor/plotly.min.js")]
    assert (
        n >= 10
        and len(plotly) == 1
        and plotly[0].gz is not None
        and len(plotly[0].gz) < len(plotly[0].body) / 2
    )
