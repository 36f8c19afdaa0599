"""``python manage.py up``: everything needed to use GRUE Studio on one machine, in one command.

Without DATABASE_URL / REDIS_URL it starts an embedded PostgreSQL and Redis with their data under
GRUE_DATA_DIR (default ./var), then migrates (as the owner role), makes sure an admin exists, and
starts Celery worker(s), the run watchdog (lost-run detection and automatic resume) and the web
server, all connecting as the data-only app role. A second ``up`` finds the data.

It supervises what it started the way systemd or supervisord would (issue 14 item 1): a child that
exits is restarted with exponential backoff (1 s, 2 s, 4 s ... 60 s; reset after a minute of good
health), a dead embedded Redis or PostgreSQL is restarted on the same address, and every change is
reported on stdout. Each child runs in its own process group; stopping (Ctrl-C or SIGTERM) and
restarting signal the whole group, so no grandchild is left behind.

DEBUG is off unless ``--debug`` is given, and ``--debug`` is refused on a non-loopback address.
Files are created with umask 077 (data, logs, Redis files, secrets are readable by this user only).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from webapp.private import PRIVATE_UMASK, ensure_private_dir
from webapp.runs import workers
from webapp.security import is_loopback

ROOT = Path(__file__).resolve().parents[4]
BACKOFF_MAX = 60.0
HEALTHY_AFTER = 60.0
STOP_TIMEOUT_S = float(os.environ.get("GRUE_STOP_TIMEOUT_S", "8"))


class _Stop(Exception):
    pass


def _raise_stop(signum: int, frame: Any) -> None:
    raise _Stop()


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is running"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with status {code}"


@dataclass
class Child:
    """One supervised process: its command, log file, restart count and backoff."""

    name: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    started_at: float = 0.0
    restarts: int = 0
    backoff: float = 1.0
    restart_at: float | None = None
    #: Variables this child gets on top of the shared environment (a GPU worker's devices and GPUs).
    env: dict[str, str] | None = None


class Command(BaseCommand):
    help = (
        "Start GRUE Studio: (embedded) PostgreSQL + Redis, migrations, admin, Celery worker(s), "
        "run watchdog, web server; supervise and restart them."
    )
    requires_system_checks: list = []
    requires_migrations_checks = False

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--host", default=os.environ.get("GRUE_HOST", "127.0.0.1"))
        parser.add_argument("--port", type=int, default=int(os.environ.get("GRUE_PORT", "8000")))
        parser.add_argument("--workers", type=int, default=1, help="Celery worker processes (one run each)")
        parser.add_argument("--no-worker", action="store_true", help="web server (and watchdog) only")
        parser.add_argument(
            "--gpu-workers",
            type=int,
            default=0,
            help="also start N GPU workers (queue <CELERY_QUEUE>-gpu only; one run at a time each)",
        )
        parser.add_argument(
            "--gpus-per-worker",
            type=int,
            default=None,
            help="GPUs each GPU worker owns (default: the detected GPUs split evenly; needed where none "
            "is detected). Worker i sees its own CUDA_VISIBLE_DEVICES block when GPUs are detected",
        )
        parser.add_argument(
            "--debug", action="store_true", help="Django DEBUG pages (development; loopback addresses only)"
        )

    def say(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def handle(self, *args: Any, **opts: Any) -> None:
        from webapp.embedded import Services

        debug = bool(opts["debug"]) or bool(settings.DEBUG)
        if debug and not is_loopback(opts["host"]):
            why = "--debug" if opts["debug"] else "DEBUG=1 (from the environment)"
            raise CommandError(
                f"refusing {why} on {opts['host']}: DEBUG pages show settings and tracebacks to anyone who "
                "can reach the server. Bind 127.0.0.1 for development, or run without DEBUG."
            )
        os.umask(PRIVATE_UMASK)
        data_dir = ensure_private_dir(Path(settings.DATA_DIR))
        signal.signal(signal.SIGTERM, _raise_stop)
        self.children: list[Child] = []
        services = Services(data_dir)
        try:
            services.__enter__()
            if services.started:
                self.say(f"embedded {', '.join(services.started)} running, data in {data_dir}")
            services.use_least_privilege()
            if services.least_privilege:
                services.write_state()
                self.say("database: migrations as role grue_owner, the app as role grue_app (no DDL rights)")
            env = self._child_env(data_dir, debug)
            self._prepare_database(env)
            py = sys.executable
            logs = ensure_private_dir(data_dir / "logs")
            self.logs = logs
            if not opts["no_worker"]:
                self._add_gpu_workers(opts, logs)
                self._add_cpu_workers(opts, logs)
            self.children.append(
                Child("run watchdog", [py, "manage.py", "watch_runs"], logs / "watchdog.log"),
            )
            server = [py, "-m", "webapp.server", "-b", opts["host"], "-p", str(opts["port"])]
            server += ["webapp.asgi:application"]
            web = Child("web server", server, logs / "web.log")
            self.children.append(web)
            for child in self.children:
                self._start(child, env)
            self._wait_port(opts["host"], opts["port"], web)
            host = "127.0.0.1" if opts["host"] in ("0.0.0.0", "::") else opts["host"]
            self.say(self.style.SUCCESS(f"GRUE Studio is up: http://{host}:{opts['port']}/"))
            self.say(f"logs in {logs}; press Ctrl-C to stop")
            self._supervise(services, env)
        except (KeyboardInterrupt, _Stop):
            self._hold_signals()
            self.say("stopping ...")
        finally:
            # A second Ctrl-C (people press it again when stopping takes seconds) must not cut the
            # shutdown short: that would leave the embedded PostgreSQL and the workers running.
            self._hold_signals()
            self._stop_all()
            services.stop()
            self.say("stopped")

    def _hold_signals(self) -> None:
        def still_stopping(signum: int, frame: Any) -> None:
            try:
                self.say(
                    f"still stopping (workers checkpoint their runs, at most {STOP_TIMEOUT_S:.0f} s; "
                    "then PostgreSQL and Redis shut down)"
                )
            except RuntimeError:  # the signal came in the middle of a write to stdout: say nothing
                pass

        signal.signal(signal.SIGINT, still_stopping)
        signal.signal(signal.SIGTERM, still_stopping)

    def _child_env(self, data_dir: Path, debug: bool) -> dict[str, str]:
        """The environment every child process gets: this checkout importable, the data directory,
        DEBUG stated explicitly (never inherited by accident)."""
        env = dict(os.environ)
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        env.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")
        env["GRUE_DATA_DIR"] = str(data_dir)
        env["DEBUG"] = "1" if debug else "0"
        if debug:
            self.say("DEBUG is on (development only)")
        return env

    def _prepare_database(self, env: dict[str, str]) -> None:
        """Migrations (as the owner role when least privilege is on), the admin account and the
        reference runs, each a child process that must succeed before anything serves."""
        migrate_env = dict(env)
        if env.get("GRUE_MIGRATE_DATABASE_URL"):
            migrate_env["DATABASE_URL"] = env["GRUE_MIGRATE_DATABASE_URL"]
        py = sys.executable
        self._run([py, "manage.py", "migrate", "--noinput", "-v", "0"], migrate_env, "migrations")
        self._run([py, "manage.py", "grue_admin"], env, "admin account", echo=True)
        self._run([py, "manage.py", "load_reference_runs"], env, "reference runs", echo=True)

    def _add_cpu_workers(self, opts: dict[str, Any], logs: Path) -> None:
        """The Celery workers of the default (CPU) queue, one run each (solo pool)."""
        py = sys.executable
        # With dedicated GPU workers the others stay on the CPU queue (no GPU detection).
        cpu_env = {"GRUE_WORKER_DEVICES": "cpu"} if opts["gpu_workers"] > 0 else None
        n_cpu = max(0 if opts["gpu_workers"] > 0 else 1, opts["workers"])
        for i in range(n_cpu):
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
                # Not used here (workers coordinate through the database and the broker), and
                # their shutdown held a stopping worker for seconds after its run had stopped.
                "--without-gossip",
                "--without-mingle",
                "--loglevel=INFO",
            ]
            self.children.append(
                Child(
                    f"worker {name}",
                    cmd,
                    logs / f"worker{i + 1}.log",
                    env=cpu_env,
                )
            )

    # ------------------------------------------------------------------ supervision

    def _supervise(self, services: Any, env: dict[str, str]) -> None:
        while True:
            try:
                self._supervise_once(services, env)
            except (KeyboardInterrupt, _Stop):
                raise
            except Exception as exc:  # noqa: BLE001 - the supervisor itself must not die
                self.say(f"supervisor error (retrying): {type(exc).__name__}: {exc}")
            time.sleep(0.5)

    def _supervise_once(self, services: Any, env: dict[str, str]) -> None:
        for event in services.check_and_restart():
            self.say(event)
        now = time.monotonic()
        for child in self.children:
            proc = child.proc
            if child.restart_at is None and proc is not None and proc.poll() is not None:
                _kill_group(proc.pid, signal.SIGKILL)  # whatever it left behind in its group
                if now - child.started_at >= HEALTHY_AFTER:
                    child.backoff = 1.0
                child.restart_at = now + child.backoff
                self.say(
                    f"{child.name} {_describe_exit(proc.returncode)}; restarting in {child.backoff:.0f} s "
                    f"(see {child.log})"
                )
                child.backoff = min(BACKOFF_MAX, child.backoff * 2)
            if child.restart_at is not None and now >= child.restart_at:
                child.restart_at = None
                child.restarts += 1
                self._start(child, env)
                self.say(f"{child.name} restarted (pid {child.proc.pid}, restart {child.restarts})")

    def _add_gpu_workers(self, opts: dict[str, Any], logs: Path) -> None:
        """GPU workers: each consumes only the GPU run queue, advertises its GPUs
        (``GRUE_WORKER_GPUS``, webapp/runs/workers.py) and, where GPUs are detected, sees only its
        own block of them (``CUDA_VISIBLE_DEVICES``), so two workers never share a GPU."""
        n = opts["gpu_workers"]
        if n <= 0:
            return
        detected = _detected_gpus()
        per = opts["gpus_per_worker"]
        if per is None:
            if detected < n:
                raise CommandError(
                    f"--gpu-workers {n}: {detected} GPU(s) detected; give --gpus-per-worker (GPUs each "
                    "worker owns) or start fewer GPU workers"
                )
            per = detected // n
        if per < 1:
            raise CommandError("--gpus-per-worker must be at least 1")
        if detected and n * per > detected:
            raise CommandError(f"{n} GPU workers x {per} GPUs need {n * per} GPUs; {detected} detected")
        queue = workers.run_queue({"resources": {"devices": "cuda"}})
        py = sys.executable
        for i in range(n):
            name = f"grue-gpu{i + 1}@{socket.gethostname()}"
            env = {"GRUE_WORKER_DEVICES": "cuda", "GRUE_WORKER_GPUS": str(per)}
            if detected:
                env["CUDA_VISIBLE_DEVICES"] = ",".join(str(g) for g in range(i * per, (i + 1) * per))
            cmd = [py, "-m", "celery", "-A", "webapp", "worker", "--pool=solo", "--concurrency=1"]
            cmd += ["-Q", queue, "-n", name, "--loglevel=INFO"]
            self.children.append(Child(f"GPU worker {name}", cmd, logs / f"gpu-worker{i + 1}.log", env=env))
            self.say(
                f"GPU worker {name}: {per} GPU(s)"
                + (f", CUDA_VISIBLE_DEVICES={env['CUDA_VISIBLE_DEVICES']}" if detected else "")
            )

    def _start(self, child: Child, env: dict[str, str]) -> None:
        fh = child.log.open("a")
        if child.env:
            env = {**env, **child.env}
        try:
            child.proc = subprocess.Popen(
                child.cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True
            )
        finally:
            fh.close()
        child.started_at = time.monotonic()

    def _stop_all(self) -> None:
        children = list(reversed(getattr(self, "children", [])))
        for child in children:
            if child.proc is not None and child.proc.poll() is None:
                _kill_group(child.proc.pid, signal.SIGTERM)
        # Workers stop their run at its next step with a checkpoint (webapp/runs/tasks.py) and exit;
        # what is still running after STOP_TIMEOUT_S is killed (its run is marked lost on the next up).
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for child in children:
            if child.proc is None:
                continue
            try:
                child.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                self.say(f"{child.name} did not stop within {STOP_TIMEOUT_S:.0f} s; killing it")
                _kill_group(child.proc.pid, signal.SIGKILL)
                child.proc.wait()
            # Anything still in the group (a grandchild that ignored SIGTERM) goes too. Linux does not
            # hand out a process-group id while the group has members, so this reaches only ours.
            _kill_group(child.proc.pid, signal.SIGKILL)

    def _run(self, cmd: list[str], env: dict[str, str], what: str, echo: bool = False) -> None:
        res = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
        if res.returncode != 0:
            raise CommandError(f"{what} failed:\n{res.stdout}\n{res.stderr}")
        if echo and res.stdout.strip():
            self.say(res.stdout.strip())

    def _wait_port(self, host: str, port: int, web: Child) -> None:
        target = "127.0.0.1" if host in ("0.0.0.0", "::") else host
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for child in self.children:
                if child.proc is not None and child.proc.poll() is not None:
                    raise CommandError(
                        f"{child.name} {_describe_exit(child.proc.returncode)} while starting; see {child.log}"
                    )
            with socket.socket() as s:
                if s.connect_ex((target, port)) == 0:
                    return
            time.sleep(0.2)
        raise CommandError(f"the web server did not listen on {host}:{port} within 120 s; see {web.log}")


def _detected_gpus() -> int:
    """GPUs on this machine, asked in a child process so that ``up`` itself never loads torch (nor
    initialises CUDA before the workers fork)."""
    res = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.cuda.device_count())"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    try:
        return int(res.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return 0


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
