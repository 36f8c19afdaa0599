"""Render ../img/favicon.svg into ../img/favicon.ico (16, 32 and 48 px PNG frames) with Debian
chromium through Playwright, the same browser the end-to-end tests use; no image library needed.

    .venv/bin/python webapp/static/build/make_favicon.py
"""

from __future__ import annotations

import struct
from pathlib import Path

from playwright.sync_api import sync_playwright

IMG = Path(__file__).resolve().parent.parent / "img"
SIZES = (16, 32, 48)


def render(svg: str, size: int) -> bytes:
    """One PNG frame: the SVG drawn at ``size`` px on a transparent background."""
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": size, "height": size})
        page.set_content(
            "<style>html,body{margin:0;background:transparent}svg{display:block}</style>"
            + svg.replace('width="32" height="32"', f'width="{size}" height="{size}"')
        )
        png = page.screenshot(omit_background=True, clip={"x": 0, "y": 0, "width": size, "height": size})
        browser.close()
    return png


def ico(frames: list[tuple[int, bytes]]) -> bytes:
    """An ICO container of PNG frames (supported by every current browser)."""
    header = struct.pack("<HHH", 0, 1, len(frames))
    offset = 6 + 16 * len(frames)
    entries, data = b"", b""
    for size, png in frames:
        entries += struct.pack("<BBBBHHII", size % 256, size % 256, 0, 0, 1, 32, len(png), offset + len(data))
        data += png
    return header + entries + data


def main() -> None:
    svg = (IMG / "favicon.svg").read_text()
    (IMG / "favicon.ico").write_bytes(ico([(s, render(svg, s)) for s in SIZES]))
    print(f"wrote {IMG / 'favicon.ico'}")


if __name__ == "__main__":
    main()
