"""Hyperparameter sweeps: a grid or random search over config paths, run one after another or in
N processes (``python -m engine sweep SWEEP.yaml``).

A sweep file::

    name: lr-kl                          # prefix of the run names
    base: ppo.yaml                       # a run config (path relative to this file), or
    # config: {...}                      # the base config inline
    method: grid                         # grid | random
    count: 8                             # random: how many runs (grid: every combination)
    seed: 0                              # random: the draw of the values
    metric: eval/reward_mean             # the final metric reported per run
    output_dir: sweeps/lr-kl             # run i writes output_dir/run-<i>
    parameters:
      algorithm.learning_rate: {values: [1.0e-5, 3.0e-5]}
      kl.init_kl_coef: {min: 0.01, max: 0.2, log: true}   # random only: uniform (or log-uniform)
      train.seed: {values: [0, 1]}

Every run's config is checked before the first one starts (an unknown path or a bad value names the
parameter and the field). The summary (``sweep.json`` in ``output_dir``) lists each run's varied
values, run directory, status and final metric.
"""

from __future__ import annotations

import itertools
import json
import math
import multiprocessing
import random
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import engine  # engine.train loads the trainer (torch) on first call: the CLI stays light
from engine import dotted
from engine.config import ConfigError, RunConfig, parse_config
from engine.config_files import read_config_file
from engine.yamlio import safe_load

SUMMARY_FILE = "sweep.json"
_KEYS = {"name", "base", "config", "method", "count", "seed", "metric", "output_dir", "parameters"}


class SweepError(ValueError):
    """A sweep file that cannot run; the message names the key."""


@dataclass
class Parameter:
    path: str
    values: list[Any] | None = None
    low: float | None = None
    high: float | None = None
    log: bool = False

    def draw(self, rng: random.Random) -> Any:
        if self.values is not None:
            return rng.choice(self.values)
        assert self.low is not None and self.high is not None
        if self.log:
            return math.exp(rng.uniform(math.log(self.low), math.log(self.high)))
        return rng.uniform(self.low, self.high)


@dataclass
class Sweep:
    name: str
    base: dict[str, Any]
    method: str
    parameters: list[Parameter]
    count: int = 0
    seed: int = 0
    metric: str = "eval/reward_mean"
    output_dir: Path = Path("sweeps/sweep")
    runs: list[dict[str, Any]] = field(default_factory=list)


def _parameter(path: str, spec: Any, method: str) -> Parameter:
    where = f"parameters.{path}"
    if not isinstance(spec, dict):
        raise SweepError(f"{where}: expected {{values: [...]}} or {{min: .., max: ..}}, got {spec!r}")
    unknown = set(spec) - {"values", "min", "max", "log"}
    if unknown:
        raise SweepError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    if "values" in spec:
        values = spec["values"]
        if not isinstance(values, list) or not values:
            raise SweepError(f"{where}.values: expected a non-empty list")
        return Parameter(path, values=list(values))
    if method == "grid":
        raise SweepError(f"{where}: a grid needs a list of values (min/max ranges are for method: random)")
    try:
        low, high = float(spec["min"]), float(spec["max"])
    except (KeyError, TypeError, ValueError):
        raise SweepError(f"{where}: give values: [...] or numeric min and max") from None
    log = bool(spec.get("log", False))
    if not low < high or (log and low <= 0):
        raise SweepError(f"{where}: need min < max{' and min > 0 for log: true' if log else ''}")
    return Parameter(path, low=low, high=high, log=log)


def load_sweep(path: str | Path, output_dir: str | None = None) -> Sweep:
    """Read and check a sweep file; ``output_dir`` overrides the file's."""
    path = Path(path)
    try:
        data = safe_load(path.read_bytes())
    except OSError as exc:
        raise SweepError(f"{path}: cannot read the sweep file ({exc.strerror})") from None
    except yaml.YAMLError as exc:
        raise SweepError(f"{path}: not valid YAML: {exc}") from None
    return sweep_from_data(
        data, str(path), base_dir=path.parent, default_name=path.stem, output_dir=output_dir
    )


def sweep_from_data(
    data: Any,
    source: str,
    base_dir: Path | None = None,
    default_name: str = "sweep",
    output_dir: str | None = None,
    max_runs: int | None = None,
) -> Sweep:
    """A checked sweep from its parsed mapping. ``base_dir`` None refuses ``base`` (a config file):
    the web app passes None, so a sweep launched there never reads a file named by the user.
    ``max_runs`` caps the expansion (the web app's limit), checked before any config is built."""
    if not isinstance(data, dict):
        raise SweepError(f"{source}: expected a mapping")
    unknown = set(data) - _KEYS
    if unknown:
        raise SweepError(
            f"{source}: unknown key(s) {', '.join(sorted(unknown))} (known: {', '.join(sorted(_KEYS))})"
        )
    if ("base" in data) == ("config" in data):
        raise SweepError(f"{source}: give exactly one of base (a config file) or config (inline)")
    if "base" in data:
        if base_dir is None:
            raise SweepError(f"{source}: base: give the base config inline under config: here")
        base, unhonoured = read_config_file(str((base_dir / str(data["base"])).resolve()))
        if unhonoured:
            raise SweepError(f"{source}: base config has RL4LMs keys GRUE cannot honour: {unhonoured}")
    else:
        base = data["config"]
        if not isinstance(base, dict):
            raise SweepError(f"{source}: config: expected a mapping")
    method = str(data.get("method", "grid"))
    if method not in ("grid", "random"):
        raise SweepError(f"{source}: method: expected grid or random, got {method!r}")
    params = data.get("parameters")
    if not isinstance(params, dict) or not params:
        raise SweepError(f"{source}: parameters: expected a mapping of config paths to values")
    try:
        count, seed = int(data.get("count", 0)), int(data.get("seed", 0))
    except (TypeError, ValueError):
        raise SweepError(f"{source}: count and seed must be integers") from None
    if method == "random" and count < 1:
        raise SweepError(f"{source}: count: method random needs count >= 1")
    name = str(data.get("name") or default_name)
    sweep = Sweep(
        name=name,
        base=base,
        method=method,
        parameters=[_parameter(str(k), v, method) for k, v in params.items()],
        count=count,
        seed=seed,
        metric=str(data.get("metric", "eval/reward_mean")),
        output_dir=Path(output_dir or data.get("output_dir") or Path("sweeps") / name),
    )
    n = count if method == "random" else math.prod(len(p.values or []) for p in sweep.parameters)
    if max_runs is not None and n > max_runs:
        raise SweepError(f"{source}: {n} runs; at most {max_runs} per sweep here")
    sweep.runs = expand(sweep)
    return sweep


def assignments(sweep: Sweep) -> list[dict[str, Any]]:
    """The varied values of every run: the grid's product in file order, or ``count`` seeded draws."""
    if sweep.method == "grid":
        keys = [p.path for p in sweep.parameters]
        return [dict(zip(keys, combo)) for combo in itertools.product(*(p.values for p in sweep.parameters))]
    rng = random.Random(sweep.seed)
    return [{p.path: p.draw(rng) for p in sweep.parameters} for _ in range(sweep.count)]


def expand(sweep: Sweep) -> list[dict[str, Any]]:
    """One entry per run: ``{index, name, values, config}`` with every config validated."""
    out = []
    for i, values in enumerate(assignments(sweep)):
        data = json.loads(json.dumps(sweep.base))  # a deep copy of plain data
        for key, value in values.items():
            dotted.set_path(data, key, value)
        data["name"] = f"{sweep.name}-{i:03d}"
        data.setdefault("train", {})["output_dir"] = str(sweep.output_dir / f"run-{i:03d}")  # one dir per run
        try:
            cfg: RunConfig = parse_config(data, source=f"sweep run {i} ({_fmt(values)})")
        except ConfigError as exc:
            raise SweepError(str(exc)) from None
        out.append({"index": i, "name": data["name"], "values": values, "config": cfg.to_dict()})
    return out


def _fmt(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items())


def _run_one(run: dict[str, Any], metric: str) -> dict[str, Any]:
    """Train one run (in this process or a pool worker); failures are reported, never raised."""
    entry = {k: run[k] for k in ("index", "name", "values")}
    entry["run_dir"] = run["config"]["train"]["output_dir"]
    try:
        summary = engine.train(run["config"])
    except Exception as exc:  # noqa: BLE001 - one failed run does not stop the sweep
        entry.update(status="failed", error=f"{type(exc).__name__}: {exc}", traceback=traceback.format_exc())
        entry["metric"] = None
        return entry
    final = {**(summary.get("final_metrics") or {}), **(summary.get("eval") or {})}
    value = final.get(metric)
    entry.update(status="stopped" if summary.get("stopped") else "succeeded")
    entry["metric"] = float(value) if isinstance(value, (int, float)) else None
    return entry


def run_sweep(sweep: Sweep, processes: int = 1, progress: Any = None) -> list[dict[str, Any]]:
    """Run every configuration (``processes`` at a time, each in a fresh spawned process) and write
    ``sweep.json``; returns the per-run entries in run order."""
    sweep.output_dir.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    say = progress or (lambda msg: None)
    if processes <= 1:
        for run in sweep.runs:
            say(f"[{run['index'] + 1}/{len(sweep.runs)}] {run['name']}: {_fmt(run['values'])}")
            results.append(_run_one(run, sweep.metric))
    else:
        ctx = multiprocessing.get_context("spawn")  # no forked torch state
        with ctx.Pool(processes) as pool:
            pending = [pool.apply_async(_run_one, (run, sweep.metric)) for run in sweep.runs]
            for i, job in enumerate(pending):
                results.append(job.get())
                say(f"[{i + 1}/{len(sweep.runs)}] {results[-1]['name']}: {results[-1]['status']}")
    summary = {
        "name": sweep.name,
        "method": sweep.method,
        "metric": sweep.metric,
        "parameters": [p.path for p in sweep.parameters],
        "runs": results,
    }
    (sweep.output_dir / SUMMARY_FILE).write_text(json.dumps(summary, indent=2, default=str))
    return results


def table(sweep: Sweep, results: list[dict[str, Any]]) -> str:
    """A plain-text table: one row per run, the varied values, status and the final metric."""
    keys = [p.path for p in sweep.parameters]
    head = ["run", *keys, "status", sweep.metric]
    rows = [
        [
            r["name"],
            *(
                f"{r['values'][k]:.4g}" if isinstance(r["values"][k], float) else str(r["values"][k])
                for k in keys
            ),
            r["status"],
            "" if r["metric"] is None else f"{r['metric']:.4f}",
        ]
        for r in results
    ]
    widths = [max(len(str(c)) for c in col) for col in zip(head, *rows)]
    return "\n".join("  ".join(str(c).ljust(w) for c, w in zip(row, widths)) for row in [head, *rows])
