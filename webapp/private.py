"""Private files and directories (issue 16 item 6): the secret key, service passwords, data, logs.

Used by settings (no Django imports here) and by the embedded services. Why not write-then-chmod:
between the two calls the file exists with the umask's mode, readable by other local users.
"""

from __future__ import annotations

import os
import secrets
import stat
import time
from pathlib import Path

PRIVATE_UMASK = 0o077


def ensure_private_dir(path: Path) -> Path:
    """Create ``path`` (and parents) as 0700, or take group/other read and write away from an
    existing directory this user owns. Traverse bits (x) are kept: as root, the embedded PostgreSQL
    runs as its own system user and must traverse the data directory to reach its own (0700) one."""
    path = Path(path)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        st = path.stat()
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid == os.getuid() and mode & 0o066:
            path.chmod(0o700 | (mode & 0o011))
    except OSError:
        pass
    return path


def write_private(path: Path, text: str) -> None:
    """Replace ``path`` with ``text``, created 0600 from the start (temp file + rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def read_or_create_secret(path: Path, nbytes: int = 50) -> str:
    """A random secret kept in ``path``, created 0600 atomically (``O_CREAT|O_EXCL`` with the mode);
    concurrent starters agree on one value."""
    path = Path(path)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        for _ in range(50):  # another process may be writing it right now
            text = path.read_text().strip()
            if text:
                return text
            time.sleep(0.1)
        raise RuntimeError(f"{path} is empty; delete it to generate a new secret") from None
    value = secrets.token_urlsafe(nbytes)
    with os.fdopen(fd, "w") as fh:
        fh.write(value)
    return value
