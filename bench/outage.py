"""A long database outage under a training run (issue #14): nothing lost, nothing stored twice.

    DATABASE_URL=... REDIS_URL=... .venv/bin/python bench/outage.py [--outage-s 120] [--json out.json]

A real Celery worker process (solo pool, its own queue) reaches PostgreSQL only through a TCP proxy
that this script controls (``tests/helpers.py``'s ``TcpProxy``, the one the outage tests use). A tiny
PPO run trains on it, logging metrics, log lines, samples and checkpoints. Once its first points are
stored the proxy is cut for ``--outage-s`` seconds (every open connection reset, every new one reset
at once: the database is gone for the worker, while this script still reads it directly), then
restored; the run goes on to its end. By default the run watchdog (``manage.py watch_runs`` with its
production defaults) runs beside it on a direct connection, as under ``manage.py up``.

Measured, against what the engine itself wrote to the run directory (``metrics.jsonl``,
``samples.jsonl``, ``events.jsonl``: the ground truth):
  - metric points lost / duplicated / stored with another value, log lines (iteration, evaluation,
    checkpoint, engine messages), samples and checkpoints lost / duplicated;
  - the run's final status and every status it showed on the way (was it ever marked lost?);
  - iterations trained during the outage (training does not wait for the database);
  - seconds from the restore until everything written before it was stored (the backlog);
  - the worker's RSS before the cut and its peak during the outage and the backlog (the recorder's
    queue is bounded, so buffering cannot grow without limit).
The run is sized by a short calibration run on the same worker (which also warms it up) so that it
keeps training for ``--after-s`` seconds after the restore.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import os
import re
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "webapp.settings")

import dj_database_url  # noqa: E402
import django  # noqa: E402
import psutil  # noqa: E402
from tqdm import tqdm  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.contrib.auth.models import Group, User  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connection  # noqa: E402

from tests.conftest import WorkerProcess, start_watchdog  # noqa: E402
from tests.helpers import TcpProxy, run_dir_points, tiny_run_config  # noqa: E402
from webapp.runs import lifecycle  # noqa: E402
from webapp.runs.models import Checkpoint, MetricPoint, Run, RunLog, Sample  # noqa: E402

TAG = "bench-outage"
ACTIVE = ("queued", "running")


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def wait(cond: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def rss_mib(pid: int) -> float:
    """Resident memory of the worker and its children (the solo pool trains in the main process)."""
    try:
        proc = psutil.Process(pid)
        procs = [proc, *proc.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0.0
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.NoSuchProcess:
            pass
    return total / 2**20


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "events.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # the line being written right now
                pass
    return out


def iterations_done(run_dir: Path) -> int:
    return max(
        (
            int(e["iteration"])
            for e in read_events(run_dir)
            if e["event"] == "progress" and e.get("phase") == "rl"
        ),
        default=0,
    )


def stored_keys(run_id: int) -> set[tuple[str, int]]:
    return set(MetricPoint.objects.filter(run_id=run_id).values_list("key", "step"))


def task_done(worker: WorkerProcess, task_id: str) -> bool:
    """The worker's own word that execute_run returned (a status can say "lost" while it still runs)."""
    return re.search(rf"execute_run\[{re.escape(task_id)}\] (succeeded|raised)", worker.log()) is not None


def calibrate(worker: WorkerProcess, user: User) -> float:
    """Seconds per iteration of the bench's run shape on this worker right now."""
    run = lifecycle.launch_run(tiny_run_config(12, "outage-calibration", save_every=0), user=user, tags=[TAG])
    wait(lambda: task_done(worker, run.task_id), 600, "the calibration run")
    rl = [
        e["time"]
        for e in read_events(Path(Run.objects.get(pk=run.pk).run_dir))
        if e["event"] == "progress" and e.get("phase") == "rl"
    ]
    return (rl[-1] - rl[1]) / max(1, len(rl) - 2)


def bench_config(n_iters: int) -> dict[str, Any]:
    cfg = tiny_run_config(n_iters, "outage", save_every=max(1, n_iters // 8))
    cfg["train"]["eval_every"] = max(1, n_iters // 6)
    return cfg


def count_lines(run: Run) -> dict[str, Any]:
    """Log lines by kind, each expected once: iteration and evaluation lines (one per step that has
    the metrics), checkpoint lines (one per checkpoint event) and the engine's own messages."""
    run_dir = Path(run.run_dir)
    expected: collections.Counter[str] = collections.Counter()
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row.get("phase") == "rl" and any(
            isinstance(row.get(k), float) for k in ("train/reward_mean", "train/kl")
        ):
            expected[f"step {row['step']}:"] += 1
        if any(k.startswith("eval/") and isinstance(v, float) for k, v in row.items()):
            expected[f"eval at step {row['step']}:"] += 1
    for ev in read_events(run_dir):
        if ev["event"] == "checkpoint":
            expected[f"checkpoint at step {ev['step']}:"] += 1
        elif ev["event"] == "log":
            for ln in str(ev["message"]).splitlines():
                if ln.strip():
                    expected[ln] += 1
    stored: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    others: list[str] = []
    for line in RunLog.objects.filter(run=run).values_list("line", flat=True):
        m = re.match(r"(step \d+:|eval at step \d+:|checkpoint at step \d+:)", line)
        if m:
            stored[m.group(1)] += 1
        elif line.startswith(("started on ", "finished after ")):
            own[line.split(" ")[0]] += 1  # the recorder's first and last line of each execution
        elif line in expected:
            stored[line] += 1
        else:
            others.append(line)  # written by someone else (the watchdog's "worker lost; resumed …")
    return {
        "expected": sum(expected.values()),
        "stored": sum(stored.values()),
        "lost": sum((expected - stored).values()),
        "duplicated": sum((stored - expected).values()),
        "executions_started": own["started"],
        "executions_finished": own["finished"],
        "other_writers_lines": others,
    }


def count_samples(run: Run) -> dict[str, int]:
    expected = collections.Counter(
        (r["step"], r["split"], r["prompt"], r["generation"])
        for r in map(json.loads, (Path(run.run_dir) / "samples.jsonl").read_text().splitlines())
    )
    stored = collections.Counter(
        Sample.objects.filter(run=run).values_list("step", "split", "prompt", "generation")
    )
    return {
        "expected": sum(expected.values()),
        "stored": sum(stored.values()),
        "lost": sum((expected - stored).values()),
        "duplicated": sum((stored - expected).values()),
    }


def count_points(run: Run) -> dict[str, int]:
    truth = run_dir_points(run.run_dir)
    rows = list(MetricPoint.objects.filter(run=run).values_list("key", "step", "value"))
    stored = {(k, s): v for k, s, v in rows}
    differ = 0
    for key, value in truth.items():
        if key in stored:
            got = stored[key]
            same = (value is None and (got is None or math.isnan(got))) or (
                value is not None and got is not None and math.isclose(got, value, rel_tol=1e-6, abs_tol=1e-9)
            )
            differ += not same
    return {
        "expected": len(truth),
        "stored": len(rows),
        "lost": len(truth.keys() - stored.keys()),
        "duplicated": len(rows) - len(stored),
        "not_in_run_dir": len(stored.keys() - truth.keys()),
        "other_value": differ,
    }


def run_bench(args: argparse.Namespace) -> dict[str, Any]:
    call_command("migrate", verbosity=0)
    user, _ = User.objects.get_or_create(username="bench-researcher")
    user.groups.add(Group.objects.get_or_create(name="researcher")[0])
    Run.objects.filter(tags__contains=[TAG]).delete()
    db = dict(connection.settings_dict)
    if not db["HOST"] or str(db["HOST"]).startswith("/"):
        # A unix socket (the embedded server of run-with-services): its loopback TCP port instead.
        tcp_url = os.environ.get("GRUE_DATABASE_TCP_URL")
        if not tcp_url:
            raise SystemExit(
                "DATABASE_URL is a unix socket: run under `python -m webapp.embedded run-with-services`"
            )
        db.update(
            {
                k: v
                for k, v in dj_database_url.parse(tcp_url).items()
                if k in ("HOST", "PORT", "USER", "PASSWORD")
            }
        )
    proxy = TcpProxy((db["HOST"], int(db["PORT"] or 5432)))
    auth = quote(db["USER"] or "", safe="") + (f":{quote(db['PASSWORD'], safe='')}" if db["PASSWORD"] else "")
    runs_dir = Path(tempfile.mkdtemp(prefix="grue-outage-"))
    settings.RUNS_DIR = runs_dir
    worker = WorkerProcess(
        db["NAME"],
        runs_dir,
        extra_env={
            "DATABASE_URL": f"postgres://{auth}@127.0.0.1:{proxy.port}/{db['NAME']}",
            "GRUE_HEARTBEAT_INTERVAL": "5",  # the production default (the test fixtures use 0.5)
            "GRUE_RECORDER_GIVE_UP_S": str(args.give_up_s),
        },
    )
    settings.CELERY_TASK_DEFAULT_QUEUE = worker.queue
    watchdog = None
    spare = None
    if args.watchdog:  # production defaults (GRUE_LOST_AFTER 60 s, a sweep every 10 s), the workers' queue
        watchdog = start_watchdog(db["NAME"], runs_dir, runs_dir / "watchdog.log", CELERY_QUEUE=worker.queue)
    out: dict[str, Any] = {
        "outage_s": args.outage_s,
        "cpu_count": os.cpu_count(),
        "load_avg_1m_start": os.getloadavg()[0],
        "watchdog": bool(args.watchdog),
        "spare_worker": bool(args.spare_worker),
        "lost_after_s": settings.GRUE_LOST_AFTER,
        "watch_interval_s": settings.GRUE_WATCH_INTERVAL,
    }
    try:
        log(f"worker {worker.name} up, database through 127.0.0.1:{proxy.port}; calibrating")
        s_per_iter = calibrate(worker, user)
        n_iters = args.iters or math.ceil((args.before_s + args.outage_s + args.after_s) / s_per_iter)
        out.update(calibration_s_per_iter=s_per_iter, n_iters=n_iters)
        log(f"{s_per_iter:.3f} s/iteration: the run gets {n_iters} iterations")
        run = lifecycle.launch_run(bench_config(n_iters), user=user, tags=[TAG])
        wait(lambda: MetricPoint.objects.filter(run_id=run.pk).exists(), 600, "the first stored points")
        run_dir = Path(Run.objects.get(pk=run.pk).run_dir)
        if args.spare_worker:  # started once the first worker has the run: a free worker on its queue
            spare = WorkerProcess(
                db["NAME"],
                runs_dir,
                queue=worker.queue,
                name=f"spare-{worker.queue}@bench",
                extra_env={"GRUE_HEARTBEAT_INTERVAL": "5"},  # it reaches the database directly
            )
        statuses = [Run.objects.get(pk=run.pk).status]

        def note_status() -> None:
            status = Run.objects.values_list("status", flat=True).get(pk=run.pk)
            if status != statuses[-1]:
                statuses.append(status)
                log(f"run status: {status}")

        time.sleep(args.before_s)  # normal operation first: a baseline of stored points and memory
        out["rss_before_cut_mib"] = rss_mib(worker.proc.pid)
        iters_at_cut = iterations_done(run_dir)
        stored_at_cut = MetricPoint.objects.filter(run_id=run.pk).count()
        proxy.cut()
        cut_at = time.monotonic()
        log(f"database cut at iteration {iters_at_cut} ({stored_at_cut} points stored)")
        peak = out["rss_before_cut_mib"]
        with tqdm(
            total=args.outage_s,
            desc="outage",
            unit="s",
            file=sys.stderr,
            bar_format="{l_bar}{bar}| {n:.0f}/{total} s {postfix}",
        ) as bar:
            while (elapsed := time.monotonic() - cut_at) < args.outage_s:
                peak = max(peak, rss_mib(worker.proc.pid))
                note_status()
                bar.n = min(elapsed, args.outage_s)
                bar.set_postfix_str(f"iteration {iterations_done(run_dir)}, worker RSS peak {peak:.0f} MiB")
                time.sleep(0.5)
        out["stored_during_outage"] = MetricPoint.objects.filter(run_id=run.pk).count() - stored_at_cut
        truth_at_restore = set(run_dir_points(run_dir))
        iters_at_restore = iterations_done(run_dir)
        proxy.restore()
        restored_at = time.monotonic()
        out["outage_measured_s"] = restored_at - cut_at
        out["rss_peak_outage_mib"] = peak
        out["iterations_during_outage"] = iters_at_restore - iters_at_cut
        out["points_written_during_outage"] = len(truth_at_restore) - stored_at_cut
        out["proxy_connections_reset"] = proxy.refused
        log(f"database restored; {out['iterations_during_outage']} iterations trained during the outage")

        def backlog_stored() -> bool:
            nonlocal peak
            peak = max(peak, rss_mib(worker.proc.pid))
            note_status()
            return truth_at_restore <= stored_keys(run.pk)

        wait(backlog_stored, args.give_up_s, "the backlog to be stored", interval=0.1)
        out["backlog_stored_after_restore_s"] = time.monotonic() - restored_at
        out["rss_peak_outage_and_backlog_mib"] = peak
        log(f"backlog stored {out['backlog_stored_after_restore_s']:.1f} s after the restore")

        def finished() -> bool:
            note_status()
            if spare is not None and "execute_run[" in spare.log():  # it took the re-queued run
                if not re.search(r"execute_run\[\w+\] (succeeded|raised)", spare.log()):
                    return False
            return task_done(worker, run.task_id)

        wait(finished, 1800, "the run to end", interval=0.5)
        note_status()
        run.refresh_from_db()
        out["iterations_after_restore"] = iterations_done(run_dir) - iters_at_restore
        out["final_status"] = run.status
        out["statuses_seen"] = statuses
        out["error"] = run.error
        out["points"] = count_points(run)
        out["log_lines"] = count_lines(run)
        out["samples"] = count_samples(run)
        ckpt_events = [e["step"] for e in read_events(run_dir) if e["event"] == "checkpoint"]
        ckpt_rows = list(Checkpoint.objects.filter(run=run).values_list("step", flat=True))
        out["checkpoints"] = {
            "expected": len(ckpt_events),
            "stored": len(ckpt_rows),
            "lost": len(set(ckpt_events) - set(ckpt_rows)),
            "duplicated": len(ckpt_rows) - len(set(ckpt_rows)),
        }
        wlog = worker.log()
        out["recorder_retries_logged"] = wlog.count("database error while storing run")
        out["recorder_gave_up"] = "gives up" in wlog
        out["run_id"] = run.pk
    finally:
        if watchdog is not None:
            os.killpg(watchdog.pid, signal.SIGTERM)
            watchdog.wait(timeout=30)
            out["watchdog_log"] = (runs_dir / "watchdog.log").read_text()[-2000:]
        worker.stop()
        if spare is not None:
            out["spare_worker_took_the_run"] = "execute_run[" in spare.log()
            spare.stop()
        proxy.close()
    out["load_avg_1m_end"] = os.getloadavg()[0]
    return out


def table(r: dict[str, Any]) -> str:
    rows = [
        ("outage (measured)", f"{r['outage_measured_s']:.1f} s"),
        (
            "run",
            f"#{r['run_id']}, {r['n_iters']} iterations ({r['calibration_s_per_iter']:.3f} s/iteration calibrated)",
        ),
        ("final status", f"{r['final_status']} (seen: {' → '.join(r['statuses_seen'])})"),
        ("iterations trained during the outage", str(r["iterations_during_outage"])),
        (
            "points written during the outage / stored meanwhile",
            f"{r['points_written_during_outage']} / {r['stored_during_outage']}",
        ),
        ("backlog stored after the restore", f"{r['backlog_stored_after_restore_s']:.1f} s"),
        ("iterations after the restore", str(r["iterations_after_restore"])),
        (
            "worker RSS before the cut / peak in outage / peak incl. backlog",
            f"{r['rss_before_cut_mib']:.0f} / {r['rss_peak_outage_mib']:.0f} / {r['rss_peak_outage_and_backlog_mib']:.0f} MiB",
        ),
        ("recorder retries logged", f"{r['recorder_retries_logged']} (gave up: {r['recorder_gave_up']})"),
    ]
    for kind in ("points", "log_lines", "samples", "checkpoints"):
        c = r[kind]
        extra = (
            f", other value {c['other_value']}, not in run dir {c['not_in_run_dir']}"
            if kind == "points"
            else ""
        )
        if kind == "log_lines":
            extra = f" (+{len(c['other_writers_lines'])} by others; executions {c['executions_started']})"
        rows.append(
            (
                kind.replace("_", " "),
                f"{c['expected']} written, {c['stored']} stored: lost {c['lost']}, duplicated {c['duplicated']}{extra}",
            )
        )
    width = max(len(a) for a, _ in rows)
    return "\n".join(f"{a.ljust(width)}  {b}" for a, b in rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--outage-s", type=float, default=120.0, help="how long the database is cut (default 120)"
    )
    ap.add_argument("--before-s", type=float, default=10.0, help="normal operation before the cut")
    ap.add_argument(
        "--after-s", type=float, default=45.0, help="training left after the restore (sizes the run)"
    )
    ap.add_argument("--iters", type=int, default=0, help="iterations of the run (default: from calibration)")
    ap.add_argument("--give-up-s", type=float, default=900.0, help="the worker's GRUE_RECORDER_GIVE_UP_S")
    ap.add_argument(
        "--no-watchdog", dest="watchdog", action="store_false", help="do not run manage.py watch_runs"
    )
    ap.add_argument(
        "--spare-worker",
        action="store_true",
        help="a second, idle worker on the same queue that reaches the database (only the first is cut off)",
    )
    ap.add_argument("--json", type=Path, default=None, help="also write the results to this JSON file")
    args = ap.parse_args()
    result = run_bench(args)
    print(table(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    ok = all(
        result[k]["lost"] == 0 and result[k]["duplicated"] == 0
        for k in ("points", "log_lines", "samples", "checkpoints")
    )
    return 0 if ok and result["final_status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
