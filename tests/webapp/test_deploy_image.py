"""The container image (issue 25.4): built from a checkout that ran ``make up`` or ``make test``, it
must not carry that checkout's secrets (``var/``: secret key, services.json with passwords, database
files), runs or virtualenv, and torch is installed hash-checked like every other package.

No Docker on these machines, so the build is read as Docker reads it: every ``COPY`` source,
resolved in the build context, after the context's ``.dockerignore``."""

from __future__ import annotations

import fnmatch
import shlex
from pathlib import Path

from tests.conftest import ROOT

DOCKERFILE = ROOT / "deploy" / "Dockerfile"


def _instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue
        pending += line.rstrip("\\").rstrip() + " " if line.rstrip().endswith("\\") else line
        if not line.rstrip().endswith("\\") and pending.strip():
            word, _, rest = pending.strip().partition(" ")
            out.append((word.upper(), rest.strip()))
            pending = ""
    return out


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins, ``!`` re-includes; a pattern matches a path or
    any of its parent directories."""
    parts = rel.split("/")
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for raw in patterns:
        neg = raw.startswith("!")
        pat = raw[1:] if neg else raw
        pat = pat.rstrip("/")
        for prefix in prefixes:
            if fnmatch.fnmatch(prefix, pat) or (
                pat.startswith("**/") and fnmatch.fnmatch(prefix.split("/")[-1], pat[3:])
            ):
                ignored = not neg
                break
    return ignored


def test_the_image_copies_no_local_state_of_the_checkout(tmp_path: Path) -> None:
    copies = [shlex.split(args)[:-1] for kind, args in _instructions() if kind == "COPY"]
    sources = [s for srcs in copies for s in srcs if not s.startswith("--")]
    assert "." not in sources and "./" not in sources, "COPY . . takes var/, runs/ and .venv along"
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    # What a checkout that ran `make up`/`make test` holds beside the code.
    local_state = [
        "var/secret_key",
        "var/services.json",
        "var/postgres/base/1/1259",
        "var/secrets/grue_app.password",
        "runs/imdb-1/model/model.safetensors",
        ".venv/bin/python",
        "webapp/__pycache__/settings.cpython-311.pyc",
        "deploy/production.env",
    ]
    for path in local_state:
        copied = any(path == s.rstrip("/") or path.startswith(s.rstrip("/") + "/") for s in sources)
        assert not copied or _ignored(path, patterns), f"{path} would be in the image"
        assert _ignored(path, patterns), f".dockerignore lets {path} into the build context"
    for needed in ("engine/config.py", "webapp/settings.py", "annotation/models.py", "manage.py"):
        assert any(needed == s or needed.startswith(s.rstrip("/") + "/") for s in sources), needed
        assert not _ignored(needed, patterns), needed
    assert not _ignored("deploy/compose.env.example", patterns)


def test_torch_is_installed_from_the_hash_lock() -> None:
    runs = [args for kind, args in _instructions() if kind == "RUN"]
    torch_runs = [r for r in runs if "torch" in r and "pip install" in r]
    assert torch_runs, "torch is installed in a RUN of its own"
    for r in torch_runs:
        for install in r.split("pip install")[1:]:
            assert "--require-hashes" in install.split("&&")[0], (
                f"unchecked install: pip install{install[:120]}"
            )
    # The lock's torch entry (name and hash) is what that RUN extracts.
    lock = (ROOT / "requirements.lock").read_text()
    assert "torch==" in lock and "--hash=sha256:" in lock.split("torch==", 1)[1].split("\n", 2)[1]
