"""Built-in event sinks: a run directory on disk and a terminal progress bar."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from engine.events import NullSink
from engine.jsonl import iter_jsonl, split_lines


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    return v


class RunDirSink(NullSink):
    """Writes config.json, metrics.jsonl, samples.jsonl and events.jsonl into the run directory.

    Lines are flushed as they are written so a crash loses nothing that was already reported.
    """

    def __init__(self, run_dir: str | Path):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _append(self, name: str, obj: dict[str, Any]) -> None:
        with open(self.run_dir / name, "a", encoding="utf-8") as f:
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")

    def _event(self, kind: str, **data: Any) -> None:
        self._append("events.jsonl", {"event": kind, "time": time.time(), **data})

    def truncate_after(self, step: int, rl_only: bool = True) -> None:
        """Drop lines reported after a checkpoint, so a resumed run does not duplicate them."""
        for name in ("metrics.jsonl", "samples.jsonl"):
            p = self.run_dir / name
            if not p.exists():
                continue
            lines = split_lines(p.read_text(encoding="utf-8"))
            kept = []
            for lineno, obj in iter_jsonl(lines, str(p), skip_invalid=True):
                is_rl = obj.get("phase", "rl") == "rl"
                if obj.get("step", 0) > step and (is_rl or not rl_only):
                    continue
                kept.append(lines[lineno - 1])
            p.write_text("".join(line + "\n" for line in kept), encoding="utf-8")

    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        (self.run_dir / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
        self._event("run_started", run_dir=str(run_dir or self.run_dir))

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        self._event("progress", iteration=iteration, total=total, eta_seconds=eta_seconds, phase=phase)

    def metrics(self, step: int, values: dict[str, float]) -> None:
        phase = "sft" if values and all(k.startswith("sft/") for k in values) else "rl"
        self._append(
            "metrics.jsonl", {"step": step, "phase": phase, **{k: _jsonable(v) for k, v in values.items()}}
        )

    def samples(self, step: int, split: str, rows: list[dict[str, Any]]) -> None:
        for row in rows:
            self._append("samples.jsonl", {"step": step, "split": split, **row})

    def checkpoint(self, step: int, path: str) -> None:
        self._event("checkpoint", step=step, path=path)

    def log(self, message: str) -> None:
        self._event("log", message=message)

    def finished(self, summary: dict[str, Any]) -> None:
        self._event("finished", summary=summary)

    def failed(self, error: str, traceback: str) -> None:
        self._event("failed", error=error, traceback=traceback)


class ConsoleSink(NullSink):
    """A tqdm progress bar with ETA and the latest reward/KL, plus log lines."""

    def __init__(
        self,
        stream: Any = None,
        show_metrics: tuple[str, ...] = ("train/reward_mean", "train/kl", "sft/loss"),
    ):
        self.stream = stream or sys.stderr
        self.show = show_metrics
        self.bar = None
        self.phase = None
        self.postfix: dict[str, str] = {}

    def _ensure_bar(self, total: int, phase: str, iteration: int) -> None:
        from tqdm import tqdm

        if self.bar is None or self.phase != phase:
            if self.bar is not None:
                self.bar.close()
            self.bar = tqdm(total=total, desc=phase.upper(), file=self.stream, dynamic_ncols=True, initial=0)
            self.phase = phase

    def run_started(self, config: dict[str, Any], run_dir: str | None = None) -> None:
        print(f"run {config.get('name', '')!s} -> {run_dir}", file=self.stream)

    def progress(self, iteration: int, total: int, eta_seconds: float | None, phase: str = "rl") -> None:
        self._ensure_bar(total, phase, iteration)
        self.bar.n = iteration
        if eta_seconds is not None:
            self.postfix["eta"] = f"{eta_seconds:.0f}s"
        self.bar.set_postfix(self.postfix, refresh=False)
        self.bar.refresh()

    def metrics(self, step: int, values: dict[str, float]) -> None:
        for k in self.show:
            if k in values and values[k] is not None:
                self.postfix[k.split("/")[-1]] = f"{values[k]:.4g}"
        line = eval_log_line(step, values)
        if line:
            self.log(line)

    def checkpoint(self, step: int, path: str) -> None:
        self.log(f"checkpoint at step {step}: {path}")

    def log(self, message: str) -> None:
        if self.bar is not None:
            self.bar.write(message, file=self.stream)
        else:
            print(message, file=self.stream)

    def finished(self, summary: dict[str, Any]) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        print(f"finished: {summary.get('run_dir')}", file=self.stream)

    def failed(self, error: str, traceback: str) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


# Training keys worth a log line per iteration, in display order, with short labels.
_ITERATION_KEYS = (
    ("train/reward_mean", "reward"),
    ("train/kl", "kl"),
    ("train/kl_coef", "beta"),
    ("loss/total", "loss"),
    ("sft/loss", "sft loss"),
    ("policy/entropy", "entropy"),
    ("time/iteration_s", "s/iter"),
)


def eval_log_line(step: int, values: dict[str, Any]) -> str | None:
    """One human line for the evaluation metrics in a ``metrics`` event (CLI and web log tails)."""
    evals = [f"{k[5:]}={v:.4g}" for k, v in values.items() if k.startswith("eval/") and isinstance(v, float)]
    return f"eval at step {step}: " + ", ".join(evals) if evals else None


def iteration_log_line(step: int, values: dict[str, Any]) -> str | None:
    """One human line for a training iteration's headline metrics, or None if it has none."""
    parts = [f"{label}={values[k]:.4g}" for k, label in _ITERATION_KEYS if isinstance(values.get(k), float)]
    return f"step {step}: " + ", ".join(parts) if parts else None
