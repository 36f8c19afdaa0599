"""Running the grid: one run trained and test-evaluated per cell and seed, in this process or in a
pool of spawned processes, resumable.

Resumable by construction: a run's ``result.json`` marks it finished (skipped on a re-run); a run with
``eval_results.json`` but no ``result.json`` only lacks its test evaluation; a run with a checkpoint
continues from it (``engine.train(resume_from=...)``, same trajectory); anything else starts afresh.
The grid is more than one sitting on a CPU, so every re-run of the command picks up where it stopped.
torch is imported only inside the functions that train (this module is imported by the web app's
import of ``engine.study``)."""

from __future__ import annotations

import json
import math
import multiprocessing
import os
import platform
import shutil
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import engine
from engine.events import NullSink
from engine.models.loading import cpu_has_fast_bf16
from engine.study.budgets import Budget, Study, cell_config, cost_units, get_budget, get_study, test_config
from engine.study.common import RESULT_FILE, STUDY_FILE, TEST_FILE, StudyError, run_key


@dataclass
class Job:
    study: str
    budget: str
    cell: str
    seed: int
    run_dir: str
    keep_weights: bool = False
    threads: int | None = None

    @property
    def key(self) -> str:
        return run_key(self.cell, self.seed)


def run_state(run_dir: Path) -> str:
    """``done``, ``evaluate`` (trained, test evaluation missing), ``resume`` (a checkpoint), ``new``."""
    if (run_dir / RESULT_FILE).exists():
        return "done"
    if (run_dir / "eval_results.json").exists():
        return "evaluate"
    if (run_dir / "checkpoints" / "latest.json").exists():
        return "resume"
    return "new"


class _ProgressSink(NullSink):
    """One progress line per logged step of the run in training (stderr), throttled, with the last RL
    iteration's time, reward and KL: what to watch early in a long grid (docs/reproduction.md)."""

    def __init__(self, label: str, say: Callable[[str], None], every_s: float = 10.0):
        self.label, self.say, self.every_s = label, say, every_s
        self._last = 0.0
        self._stats = ""

    def metrics(self, step: int, values: dict[str, float]) -> None:
        shown = (
            ("time/iteration_s", "{:.1f} s/iter"),
            ("train/reward_mean", "reward {:.3f}"),
            ("train/kl", "kl {:.4f}"),
        )
        parts = [fmt.format(values[k]) for k, fmt in shown if isinstance(values.get(k), (int, float))]
        if parts:
            self._stats = ", " + ", ".join(parts)

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        now = time.monotonic()
        if iteration not in (0, total) and now - self._last < self.every_s:
            return
        self._last = now
        eta = f", ETA {fmt_seconds(eta_seconds)}" if eta_seconds is not None else ""
        stats = self._stats if phase == "rl" and iteration else ""
        self.say(f"  {self.label}: {phase} {iteration}/{total}{stats}{eta}")


def fmt_seconds(s: float | None) -> str:
    if s is None or not math.isfinite(s):
        return "?"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h{m:02d}m" if h else (f"{m}m{sec:02d}s" if m else f"{sec}s")


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; the platform's processor string elsewhere)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def engine_commit() -> str | None:
    """The git commit of the engine that made a run, ``+changes`` when ``engine/`` differs from it, or
    None outside this project's checkout (an installed wheel, even one inside another repository's
    virtualenv). Why: runs of one study span days of commits, and a result should say which code made
    it, not leave it to the commit log's dates."""
    root = Path(engine.__file__).resolve().parent.parent

    def git(*args: str) -> str:
        done = subprocess.run(
            ["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=True
        )
        return done.stdout

    try:
        top, head = git("rev-parse", "--show-toplevel", "--short=12", "HEAD").split()
        if Path(top).resolve() != root:
            return None
        changed = git("status", "--porcelain", "--", "engine").strip()
    except (OSError, subprocess.SubprocessError, ValueError):
        return None
    return f"{head}+changes" if changed else head


def machine_record(cfg: dict[str, Any]) -> dict[str, Any]:
    """Where and how a run was made: runs of one study made on different machines are compared, so each
    result says its CPU, whether bf16 is native there, the precision it ran in, threads and versions."""
    import torch  # the run that calls this has loaded torch already

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "gpu": gpu,
        "native_bf16": cpu_has_fast_bf16() if gpu is None else bool(torch.cuda.is_bf16_supported()),
        "mixed_precision": cfg.get("model", {}).get("mixed_precision"),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "engine_commit": engine_commit(),
    }


def _prune_weights(run_dir: Path) -> None:
    """Drop checkpoints and the saved model of an evaluated run (hundreds of MB each for SmolLM2):
    the report and the reference file need metrics and samples only."""
    for name in ("checkpoints", "model"):
        shutil.rmtree(run_dir / name, ignore_errors=True)


def run_job(
    job: Job, say: Callable[[str], None] | None = None, should_stop: Callable[[], bool] | None = None
) -> dict[str, Any]:
    """Train (or resume) one run, then evaluate it on the test prompts; writes ``result.json``.

    Returns ``{key, status: done|stopped|failed|skipped, ...}``; failures are returned, not raised,
    so one broken run does not stop the grid."""
    say = say or (lambda m: None)
    if job.threads:
        import torch  # this process trains: it loads torch anyway

        torch.set_num_threads(job.threads)
    study, budget = get_study(job.study), get_budget(job.budget)
    run_dir = Path(job.run_dir)
    state = run_state(run_dir)
    out: dict[str, Any] = {"key": job.key, "cell": job.cell, "seed": job.seed, "state_before": state}
    if state == "done":
        return {**out, "status": "skipped"}
    cfg = cell_config(study, job.cell, job.seed, budget, run_dir)
    t0 = time.perf_counter()
    try:
        if state in ("new", "resume"):
            if state == "new" and run_dir.exists():
                shutil.rmtree(run_dir)  # a run that died before its first checkpoint starts afresh
            sink = _ProgressSink(job.key, say)
            summary = engine.train(
                cfg,
                sink=sink,
                should_stop=should_stop,
                resume_from=str(run_dir) if state == "resume" else None,
            )
            if summary.get("stopped"):
                return {**out, "status": "stopped", "train_s": time.perf_counter() - t0}
        t1 = time.perf_counter()
        trained_model = run_dir / "model"
        result = engine.evaluate(
            test_config(cfg, budget),
            split="test",
            model_path=str(trained_model) if job.cell != "zero_shot" else None,
            output=run_dir / TEST_FILE,
            progress=lambda line: say(f"  {job.key}: test evaluation, {line}"),
        )
        t2 = time.perf_counter()
    except Exception as exc:  # noqa: BLE001 - reported per run; the grid goes on
        return {
            **out,
            "status": "failed",
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc(),
        }
    record = {
        "study": study.id,
        "budget": budget.name,
        "cell": job.cell,
        "seed": job.seed,
        "test": {"split": "test", "n_samples": result["n_samples"], "metrics": result["metrics"]},
        "train_s": round(t1 - t0, 3),
        "test_eval_s": round(t2 - t1, 3),
        # Where the test evaluation's minutes went (generation, reward, each metric): evidence for
        # what to speed up, since on a 2-core machine it is a fifth of an RL run.
        "test_eval_timings_s": result.get("timings_s"),
        "machine": machine_record(cfg),
        "finished_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    tmp = run_dir / f".{RESULT_FILE}.tmp"
    tmp.write_text(json.dumps(record, indent=2))
    tmp.replace(run_dir / RESULT_FILE)
    if not job.keep_weights:
        _prune_weights(run_dir)
    return {**out, "status": "done", "train_s": record["train_s"], "test_eval_s": record["test_eval_s"]}


def _run_job_in_pool(job: Job) -> dict[str, Any]:
    return run_job(job, say=lambda m: print(m, file=sys.stderr, flush=True))


def _check_study_dir(out: Path, study: Study, budget: Budget, seeds: list[int]) -> dict[str, Any]:
    """Create or re-open ``out/study.json``; a directory of another study or budget is refused."""
    path = out / STUDY_FILE
    if path.exists():
        meta = json.loads(path.read_text())
        if meta.get("study") != study.id or meta.get("budget", {}).get("name") != budget.name:
            raise StudyError(
                f"{out} holds study {meta.get('study')!r} with budget {meta.get('budget', {}).get('name')!r}; "
                f"give another --out for {study.id!r} with budget {budget.name!r}"
            )
        if meta.get("budget") != budget.to_dict():
            raise StudyError(
                f"{out}: the {budget.name!r} budget changed since this study started (engine/study/budgets.py "
                "BUDGETS); finish it with the old code or start a new --out"
            )
        meta["seeds"] = sorted(set(meta.get("seeds", [])) | set(seeds))
    else:
        meta = {
            "study": study.id,
            "title": study.title,
            "cells": list(study.cells),
            "seeds": sorted(set(seeds)),
            "budget": budget.to_dict(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(meta, indent=2))
    return meta


class _Progress:
    """One line per finished run of a study sitting: how many are done, and an ETA from the cost
    units (``cost_units``) trained so far in this sitting."""

    def __init__(
        self,
        bud: Budget,
        n_jobs: int,
        total_units: float,
        done_units: float,
        n_done: int,
        say: Callable[[str], None],
    ):
        self.bud, self.n_jobs, self.total_units, self.say = bud, n_jobs, total_units, say
        self.done_units, self.n_done, self.units_here = done_units, n_done, 0.0
        self.t_start = time.perf_counter()

    def __call__(self, res: dict[str, Any], job: Job) -> None:
        if res["status"] == "done":
            units = cost_units(job.cell, self.bud)
            self.done_units += units
            self.units_here += units
            self.n_done += 1
        elapsed = time.perf_counter() - self.t_start
        rate = elapsed / self.units_here if self.units_here else None
        eta = rate * (self.total_units - self.done_units) if rate else None
        detail = {
            "done": f"trained in {fmt_seconds(res.get('train_s'))}, test evaluation {fmt_seconds(res.get('test_eval_s'))}",
            "skipped": "already done",
            "stopped": "stopped (checkpointed; re-run the command to resume)",
            "failed": f"FAILED: {res.get('error', '')}",
        }[res["status"]]
        self.say(
            f"[{self.n_done}/{self.n_jobs} done] {job.key} ({res.get('state_before')}): {detail}; "
            f"elapsed {fmt_seconds(elapsed)}, ETA {fmt_seconds(eta) if self.n_done < self.n_jobs else '0s'}"
        )


def run_study(
    study_id: str,
    out: str | Path,
    seeds: list[int] | None = None,
    budget: str = "small",
    workers: int = 1,
    keep_weights: bool = False,
    say: Callable[[str], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
    cells: list[str] | None = None,
) -> list[dict[str, Any]]:
    """Run (or continue) the whole grid; returns one entry per run in grid order.

    ``workers`` > 1 trains that many runs at once in spawned processes, each with its share of the
    CPU threads. ``should_stop`` (one process only) is handed to the trainer, which checkpoints and
    stops; the next call resumes from there. ``cells`` restricts this sitting to some cells of the
    grid (the report covers whatever has finished)."""
    study, bud = get_study(study_id), get_budget(budget)
    unknown = set(cells or []) - set(study.cells)
    if unknown:
        raise StudyError(f"unknown cell(s) {', '.join(sorted(unknown))}; cells: {', '.join(study.cells)}")
    seeds = list(seeds) if seeds else list(study.default_seeds)
    out = Path(out)
    say = say or (lambda m: print(m, file=sys.stderr, flush=True))
    _check_study_dir(out, study, bud, seeds)
    jobs = [
        Job(study.id, bud.name, cell, seed, str(out / "runs" / run_key(cell, seed)), keep_weights)
        for seed in seeds
        for cell in study.cells
        if not cells or cell in cells
    ]
    total_units = sum(cost_units(j.cell, bud) for j in jobs)
    done_units = sum(cost_units(j.cell, bud) for j in jobs if run_state(Path(j.run_dir)) == "done")
    n_done = sum(run_state(Path(j.run_dir)) == "done" for j in jobs)
    say(
        f"study {study.id} ({bud.name}): {len(jobs)} runs ({len(jobs) // len(seeds)} cells x {len(seeds)} seeds) "
        f"into {out}; {n_done} already done"
    )
    report = _Progress(bud, len(jobs), total_units, done_units, n_done, say)
    results: list[dict[str, Any]] = []
    if workers <= 1:
        for job in jobs:
            if should_stop is not None and should_stop():
                break
            if run_state(Path(job.run_dir)) != "done":
                say(f"{job.key}: {run_state(Path(job.run_dir))}")
            res = run_job(job, say=say, should_stop=should_stop)
            results.append(res)
            report(res, job)
            if res["status"] == "stopped":
                break
    else:
        threads = max(1, (os.cpu_count() or 1) // workers)
        ctx = multiprocessing.get_context("spawn")  # no forked torch state
        pending = [replace(j, threads=threads) for j in jobs]
        with ctx.Pool(workers) as pool:
            handles = [(j, pool.apply_async(_run_job_in_pool, (j,))) for j in pending]
            for job, handle in handles:
                res = handle.get()
                results.append(res)
                report(res, job)
    failed = [r for r in results if r["status"] == "failed"]
    for r in failed:
        say(f"{r['key']} failed:\n{r.get('traceback', '')}")
    return results
