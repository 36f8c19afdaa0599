"""Static files served by the app itself (daphne serves none): versioned URLs, long caching, gzip.

Why here and not a reverse proxy: ``manage.py up`` on one machine has no proxy in front, and a run
page's first visit is dominated by the 1.2 MB plotly bundle (issue #13 item 8). So:

- ``{% static %}`` URLs carry ``?v=<content hash>`` (``VersionedStaticStorage``); a request whose
  ``v`` matches the file's current hash is answered with ``Cache-Control: immutable`` for a year, so
  a repeat visit asks the server for nothing. Without a matching ``v`` (an old page, a hand-typed
  URL) the answer must be revalidated (``no-cache``) and carries the same ``ETag``, so a repeat
  costs a 304.
- Each file is read once per process into memory, gzip-compressed once when it is text (plotly:
  1.18 MB → ~0.4 MB), and answered in one body instead of ``FileResponse``'s 4 KiB chunks, each of
  which is a separate ASGI message under daphne. A changed file (its mtime or size) is re-read, so
  editing JS during development needs no restart.
"""

from __future__ import annotations

import gzip
import hashlib
import mimetypes
import os
import posixpath
import threading
from dataclasses import dataclass

from django.contrib.staticfiles import finders
from django.contrib.staticfiles.storage import StaticFilesStorage
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseNotModified
from django.utils.cache import patch_vary_headers
from django.views.decorators.http import require_GET

# One year: the longest lifetime browsers honour; the URL changes whenever the content does.
IMMUTABLE = "public, max-age=31536000, immutable"
REVALIDATE = "no-cache"
COMPRESSIBLE = ("text/", "application/javascript", "application/json", "image/svg+xml")
MIN_GZIP_BYTES = 1024
TYPES = {".js": "application/javascript", ".mjs": "application/javascript"}


@dataclass(frozen=True)
class Asset:
    """One static file as it is served: the bytes, their gzip form (None when it does not pay),
    the short content hash used as ``v`` and ``ETag``, and the file's identity when read."""

    body: bytes
    gz: bytes | None
    digest: str
    content_type: str
    stamp: tuple[int, int]


_assets: dict[str, Asset] = {}
_lock = threading.Lock()


def _find(path: str) -> str | None:
    clean = posixpath.normpath(path).lstrip("/")
    if not clean or clean.startswith("..") or clean == ".":
        return None
    found = finders.find(clean)
    return found if isinstance(found, str) else None


def asset(path: str) -> Asset | None:
    """The served form of static file ``path`` (relative to a static dir), or None if there is
    none. Read and compressed on first use, again only when the file changes on disk."""
    found = _find(path)
    if found is None:
        return None
    try:
        st = os.stat(found)
    except OSError:
        return None
    stamp = (st.st_mtime_ns, st.st_size)
    cached = _assets.get(found)
    if cached is not None and cached.stamp == stamp:
        return cached
    with _lock:
        cached = _assets.get(found)
        if cached is not None and cached.stamp == stamp:
            return cached
        with open(found, "rb") as fh:
            body = fh.read()
        ext = os.path.splitext(found)[1].lower()
        ctype = TYPES.get(ext) or mimetypes.guess_type(found)[0] or "application/octet-stream"
        gz = None
        if len(body) >= MIN_GZIP_BYTES and ctype.startswith(COMPRESSIBLE):
            # Level 6: within a few % of level 9's size at a third of its time (paid once per file).
            packed = gzip.compress(body, compresslevel=6, mtime=0)
            gz = packed if len(packed) < len(body) * 0.9 else None
        made = Asset(body, gz, hashlib.sha256(body).hexdigest()[:16], ctype, stamp)
        _assets[found] = made
        return made


#: The app's own assets that its pages load (not Django admin's ~130 files, nor ``build/``, whose
#: git-ignored ``node_modules`` can hold thousands): what ``warm`` prepares.
WARM_PREFIXES = ("vendor/", "js/", "css/", "img/", "annotation/")


def warm() -> int:
    """Read and compress the app's page assets now (the server calls this at start-up): otherwise the
    first visitor after a restart pays plotly's gzip (~0.1 s) on the page load. Returns how many;
    other files are still prepared on first use."""
    n = 0
    for finder in finders.get_finders():
        for path, _storage in finder.list([]):
            if path.startswith(WARM_PREFIXES) and asset(path) is not None:
                n += 1
    return n


class VersionedStaticStorage(StaticFilesStorage):
    """``{% static %}`` with ``?v=<content hash>`` appended, so browsers may cache for a year."""

    def url(self, name: str | None) -> str:
        base = super().url(name)
        found = asset(name) if name else None
        return f"{base}?v={found.digest}" if found is not None else base


def _accepts_gzip(request: HttpRequest) -> bool:
    for part in request.headers.get("Accept-Encoding", "").split(","):
        token, _, params = part.strip().partition(";")
        if token.strip().lower() in ("gzip", "*"):
            return params.replace(" ", "") not in ("q=0", "q=0.0", "q=0.00", "q=0.000")
    return False


@require_GET
def serve(request: HttpRequest, path: str) -> HttpResponse:
    """A static file from the app's static dirs, in every mode (see the module docstring)."""
    found = asset(path)
    if found is None:
        raise Http404(path)
    etag = f'"{found.digest}"'
    versioned = request.GET.get("v") == found.digest
    if etag in [t.strip() for t in request.headers.get("If-None-Match", "").split(",")]:
        response: HttpResponse = HttpResponseNotModified()
    else:
        use_gz = found.gz is not None and _accepts_gzip(request)
        response = HttpResponse(found.gz if use_gz else found.body, content_type=found.content_type)
        if use_gz:
            response["Content-Encoding"] = "gzip"
    response["ETag"] = etag
    response["Cache-Control"] = IMMUTABLE if versioned else REVALIDATE
    if found.gz is not None:
        patch_vary_headers(response, ["Accept-Encoding"])
    return response
