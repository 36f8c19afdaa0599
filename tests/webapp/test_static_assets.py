"""The favicon and the partial plotly bundle: linked from every page, served by the app, and the
bundle is the committed partial build (not the 4.8 MB full bundle)."""

from __future__ import annotations

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
        icons = re.findall(r'<link rel="icon" href="([^"]+)"', html)
        assert icons == ["/static/img/favicon.svg", "/static/img/favicon.ico"], url
    svg = client.get("/static/img/favicon.svg")
    assert svg.status_code == 200 and svg["Content-Type"] == "image/svg+xml"
    assert b"<svg" in b"".join(svg.streaming_content)
    ico = client.get("/static/img/favicon.ico")
    body = b"".join(ico.streaming_content)
    assert ico.status_code == 200
    # ICO header: reserved 0, type 1 (icon), 3 frames (16, 32, 48 px) stored as PNG
    assert body[:6] == b"\x00\x00\x01\x00\x03\x00"
    assert [body[6 + 16 * i] for i in range(3)] == [16, 32, 48]
    assert body.count(b"\x89PNG") == 3


def test_plotly_url_serves_the_committed_partial_bundle(client: Any) -> None:
    r = client.get("/static/vendor/plotly.min.js")
    body = b"".join(r.streaming_content)
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
