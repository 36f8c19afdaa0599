"""``python manage.py up``: everything needed to use GRUE Studio on one machine, in one command.

Without DATABASE_URL / REDIS_URL it starts an embedded PostgreSQL and Redis with their data under
GRUE_DATA_DIR (default ./var), then migrates, makes sure an admin exists, starts Celery worker(s)
(with beat, for the lost-run check) and daphne, and prints the URL and login. Ctrl-C (or SIGTERM)
stops every child: server, workers, then Redis and PostgreSQL. A second ``up`` finds the data.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

ROOT = Path(__file__).resolve().parents[4]


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


class Command(BaseCommand):
    help = "Start GRUE Studio: (embedded) PostgreSQL + Redis, migrations, admin, Celery worker, ASGI server."
    requires_system_checks: list = []
    requires_migrations_checks = False

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=os.environ.get("GRUE_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("GRUE_PORT", "8000")))
        parser.add_argument("--workers", type=int, default=1, help="Celery worker processes (one run each)")
        parser.add_argument("--no-worker", action="store_true", help="web server only")

    def handle(self, *args: Any, **opts: Any) -> None:
        from webapp.embedded import Services

        data_dir = Path(settings.DATA_DIR)
        data_dir.mkdir(parents=True, exist_ok=True)
        signal.signal(signal.SIGTERM, _raise_stop)
        children: list[tuple[str, subprocess.Popen]] = []
        services = Services(data_dir)
        try:
            services.__enter__()
            if services.started:
                self.stdout.write(f"embedded {', '.join(services.started)} running, data in {data_dir}")
            env = dict(os.environ)
            env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
            env.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
            env["GRUE_DATA_DIR"] = str(data_dir)
            py = sys.executable
            self._run([py, "manage.py", "migrate", "--noinput", "-v", "0"], env, "migrations")
            self._run([py, "manage.py", "grue_admin"], env, "admin account", echo=True)
            logs = data_dir / "logs"
            logs.mkdir(exist_ok=True)
            if not opts["no_worker"]:
                for i in range(max(1, opts["workers"])):
                    name = f"grue{i + 1}@{socket.gethostname()}"
                    cmd = [
                        py,
                        "-m",
                        "celery",
                        "-A",
                        "webapp",
                        "worker",
                        "--pool=solo",
                        "--concurrency=1",
                        "-Q",
                        settings.CELERY_TASK_DEFAULT_QUEUE,
                        "-n",
                        name,
                        "--loglevel=INFO",
                    ]
                    if i == 0:
                        cmd.append("-B")
                        cmd += ["-s", str(data_dir / "celerybeat-schedule")]
                    children.append((f"worker {name}", self._spawn(cmd, env, logs / f"worker{i + 1}.log")))
            server = [
                py,
                "-m",
                "daphne",
                "-b",
                opts["host"],
                "-p",
                str(opts["port"]),
                "webapp.asgi:application",
            ]
            children.append(("web server", self._spawn(server, env, logs / "web.log")))
            self._wait_port(opts["host"], opts["port"], children)
            host = "127.0.0.1" if opts["host"] in ("0.0.0.0", "::") else opts["host"]
            self.stdout.write(self.style.SUCCESS(f"GRUE Studio is up: http://{host}:{opts['port']}/"))
            self.stdout.write(f"logs in {logs}; press Ctrl-C to stop")
            self.stdout.flush()
            while True:
                for name, proc in children:
                    if proc.poll() is not None:
                        raise CommandError(f"{name} exited with {proc.returncode}; see {logs}")
                time.sleep(0.5)
        except (KeyboardInterrupt, _Stop):
            self.stdout.write("stopping ...")
        finally:
            for _name, proc in reversed(children):
                _terminate(proc)
            for _name, proc in reversed(children):
                _wait_or_kill(proc)
            services.stop()
            self.stdout.write("stopped")

    def _run(self, cmd: list[str], env: dict[str, str], what: str, echo: bool = False) -> None:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise CommandError(f"{what} failed:\n{res.stdout}\n{res.stderr}")
        if echo and res.stdout.strip():
            self.stdout.write(res.stdout.strip())

    def _spawn(self, cmd: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
        fh = log.open("a")
        return subprocess.Popen(
            cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
        )

    def _wait_port(self, host: str, port: int, children: list[tuple[str, subprocess.Popen]]) -> None:
        target = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for name, proc in children:
                if proc.poll() is not None:
                    raise CommandError(f"{name} exited with {proc.returncode} while starting")
            with socket.socket() as s:
                if s.connect_ex((target, port)) == 0:
                    return
            time.sleep(0.2)
        raise CommandError(f"the web server did not listen on {host}:{port} within 120 s")


def _terminate(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def _wait_or_kill(proc: subprocess.Popen) -> None:
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
