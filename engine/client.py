"""A small client of the GRUE Studio API (``/api/v1/``) for scripts and notebooks.

    from engine.client import Client
    c = Client("https://grue.example.org", token="grue_…")   # or GRUE_URL / GRUE_TOKEN
    c.runs(status="succeeded")           # list of run dicts
    c.metrics(12)                        # pandas DataFrame: key, step, value, time
    c.pairs(3)                           # a campaign's preference pairs

Only the standard library talks HTTP (urllib), so the engine stays free of web dependencies; pandas is
imported when a DataFrame is asked for. Errors: ``ApiError`` carries the HTTP status, the server's
message and the field it names; ``ApiError.retryable`` tells a transient failure (network, 429, 5xx),
worth sending again, from a bad request, which would fail the same way again.

The token is sent only where it is safe: https, or plain http to this machine (loopback); redirects
are never followed (``check_server_url``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any


class ApiError(Exception):
    """A failed API call: ``status`` (0 when the server could not be reached), ``message``, ``field``."""

    def __init__(self, status: int, message: str, field: str | None = None, retry_after: float | None = None):
        where = f" ({field})" if field else ""
        super().__init__(f"HTTP {status}: {message}{where}" if status else message)
        self.status = status
        self.message = message
        self.field = field
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        return self.status == 0 or self.status == 429 or self.status >= 500


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` names this machine: ``localhost`` (and ``*.localhost``, RFC 6761) or a loopback
    IP address written the standard way (``127.0.0.0/8``, ``::1``); ``0177.0.0.1`` and other spellings
    are not recognised, so they count as remote."""
    host = host.strip("[]").lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_server_url(url: str) -> None:
    """Refuse a server URL the token must not be sent to: not http(s), no host, or plain ``http`` to
    anything but this machine (the token and the run's data would cross the network unencrypted).
    ``ValueError`` says why."""
    parsed = urllib.parse.urlparse(url)
    if parsed.scheme not in ("http", "https") or not parsed.hostname:
        raise ValueError(f"server URL must be https://HOST[:PORT], got {url!r}")
    if parsed.username or parsed.password:
        raise ValueError("server URL must not hold a user or password; the API token authenticates")
    if parsed.scheme == "http" and not is_loopback_host(parsed.hostname):
        raise ValueError(
            f"refusing plain http to {parsed.hostname}: the API token would cross the network "
            "unencrypted. Use https:// (plain http is accepted only for a loopback address: localhost, "
            "127.0.0.1, ::1)"
        )


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """Redirects are not followed: ``Authorization`` would go with them to wherever they point."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # urllib then raises the 3xx as an HTTPError


_OPENER = urllib.request.build_opener(_NoRedirect)


class Client:
    """Calls the API with a token (``Authorization: Bearer``). ``url`` is the site's root."""

    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 30.0):
        url = url or os.environ.get("GRUE_URL")
        token = token or os.environ.get("GRUE_TOKEN")
        if not url:
            raise ValueError("no server URL: pass url= or set GRUE_URL")
        if not token:
            raise ValueError("no API token: pass token= or set GRUE_TOKEN (create one at /settings/tokens/)")
        check_server_url(url)
        self.url = url.rstrip("/")
        self.token = token
        self.timeout = timeout

    # ------------------------------------------------------------------ transport
    def request(self, method: str, path: str, body: Any = None, params: dict[str, Any] | None = None) -> Any:
        """One call; returns the decoded JSON or raises ApiError."""
        url = f"{self.url}/api/v1{path}"
        if params:
            query = {k: v for k, v in params.items() if v is not None}
            if query:
                url += "?" + urllib.parse.urlencode(query)
        data = None if body is None else json.dumps(body, allow_nan=False).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self.token}")
        req.add_header("Accept", "application/json")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with _OPENER.open(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                where = exc.headers.get("Location", "?") if exc.headers else "?"
                raise ApiError(
                    exc.code,
                    f"the server redirects to {where}; redirects are not followed (the token would be "
                    "sent on to another address): use the final URL",
                    "url",
                ) from None
            raw = exc.read()
            try:
                info = json.loads(raw)
            except ValueError:
                info = {"error": raw[:300].decode(errors="replace") or exc.reason}
            retry = exc.headers.get("Retry-After") if exc.headers else None
            raise ApiError(
                exc.code,
                str(info.get("error") or exc.reason),
                info.get("field"),
                float(retry) if retry and retry.replace(".", "", 1).isdigit() else None,
            ) from None
        except (urllib.error.URLError, OSError) as exc:  # refused, reset, timeout, DNS
            reason = getattr(exc, "reason", exc)
            raise ApiError(0, f"cannot reach {self.url}: {reason}") from None
        return json.loads(raw) if raw else None

    # ------------------------------------------------------------------ runs
    def runs(self, **filters: Any) -> list[dict[str, Any]]:
        """Runs, newest first; filters: status, task, algorithm, project, tag, limit, offset."""
        return self.request("GET", "/runs", params=filters)["runs"]

    def run(self, run_id: int) -> dict[str, Any]:
        return self.request("GET", f"/runs/{int(run_id)}")

    def create_run(
        self,
        config: dict[str, Any],
        *,
        name: str | None = None,
        project: str | None = None,
        tags: list[str] | None = None,
        notes: str | None = None,
        launch: bool = False,
        remote: bool = False,
    ) -> dict[str, Any]:
        """A draft run to stream into (``launch=False``) or one queued on the server's workers.
        ``remote=True``: the run trains on this machine, so its paths are this machine's and the
        server does not check them against its own allowed roots."""
        body = {
            "config": config,
            "name": name,
            "project": project,
            "tags": tags,
            "notes": notes,
            "launch": launch,
            "remote": remote or None,
        }
        return self.request("POST", "/runs", {k: v for k, v in body.items() if v is not None})

    def send_events(self, run_id: int, batch_id: str, events: list[dict[str, Any]]) -> dict[str, Any]:
        """Append a batch; sending the same ``batch_id`` again stores nothing more."""
        return self.request("POST", f"/runs/{int(run_id)}/events", {"batch_id": batch_id, "events": events})

    def set_status(self, run_id: int, status: str, **fields: Any) -> dict[str, Any]:
        """``running`` (with ``host``), ``succeeded``/``cancelled`` (with ``summary``), ``failed``
        (with ``error``, ``traceback``)."""
        return self.request("POST", f"/runs/{int(run_id)}/status", {"status": status, **fields})

    def metric_series(self, run_id: int, keys: list[str] | None = None) -> dict[str, dict[str, list[Any]]]:
        params = {"keys": ",".join(keys)} if keys else None
        return self.request("GET", f"/runs/{int(run_id)}/metrics", params=params)["series"]

    def metrics(self, run_id: int, keys: list[str] | None = None) -> Any:
        """Every point of the run as a pandas DataFrame with columns key, step, value, time."""
        import pandas as pd

        rows = [
            (key, step, value, time)
            for key, s in self.metric_series(run_id, keys).items()
            for step, value, time in zip(s["steps"], s["values"], s["times"], strict=True)
        ]
        df = pd.DataFrame(rows, columns=["key", "step", "value", "time"])
        df["value"] = df["value"].astype(float)
        df["time"] = pd.to_datetime(df["time"], utc=True)
        return df

    # ------------------------------------------------------------------ campaigns
    def campaigns(self) -> list[dict[str, Any]]:
        return self.request("GET", "/campaigns")["campaigns"]

    def pairs(
        self, campaign_id: int, *, include_gold: bool = False, source: str = "human"
    ) -> list[dict[str, Any]]:
        """A campaign's decided pairwise judgments as ``{prompt, chosen, rejected, meta}``; ``source``
        is ``human``, ``ai`` (the AI judges' verdicts) or ``both`` (``meta.source`` says which)."""
        params = {"source": source, **({"include_gold": "true"} if include_gold else {})}
        return self.request("GET", f"/campaigns/{int(campaign_id)}/pairs", params=params)["pairs"]

    def download_pairs(
        self, campaign_id: int, path: str, *, include_gold: bool = False, source: str = "human"
    ) -> int:
        """Write the pairs as JSONL (the format ``engine.reward_model`` trains on); returns the count."""
        pairs = self.pairs(campaign_id, include_gold=include_gold, source=source)
        with open(path, "w", encoding="utf-8") as f:
            for p in pairs:
                f.write(json.dumps(p, ensure_ascii=False) + "\n")
        return len(pairs)
