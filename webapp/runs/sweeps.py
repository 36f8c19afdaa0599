"""Sweeps in the web app: the CLI's sweep format (engine/sweep.py) launched as a group of runs.

A sweep is the runs that carry its tag ``sweep:<name>-<id>`` (no table of its own: the run table,
its filters and every run action already work on them). Launching validates every configuration
before the first run is queued and creates them all in one transaction. The web app accepts the
base config inline only (``config:``), never ``base:`` (a file on the server), and drops
``train.output_dir``: each run gets its own directory from the worker, as any launched run.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import yaml
from django.db import connection, transaction

from engine import yamlio
from engine.dotted import flatten
from engine.sweep import SweepError, sweep_from_data
from webapp.runs import lifecycle, queries
from webapp.runs.models import ACTIVE_STATUSES, MetricPoint, Run

TAG_PREFIX = "sweep:"
#: Runs one sweep may launch from the web app.
MAX_RUNS = 64
#: Config paths that differ between a sweep's runs without being hyperparameters.
_NOT_VARIED = {"name", "train.output_dir"}

EXAMPLE = """name: lr-seed
method: grid                 # or random, with count: N and optional seed: S
metric: train/reward_mean    # the final metric shown on the sweep page
parameters:
  algorithm.learning_rate: {values: [0.0003, 0.001]}
  train.seed: {values: [0, 1]}
  # kl.init_kl_coef: {min: 0.01, max: 0.2, log: true}   # ranges: method random only
config:                      # the base config (the launch form's YAML view gives one)
  model: {name_or_path: "builtin:tiny-gpt2"}
  task: {id: synthetic_increasing_numbers}
  reward: {id: increasing_numbers}
  train: {n_iters: 5, prompts_per_iter: 4, eval_every: 0}
"""


def sweep_text_for(config: dict[str, Any], dump: Any) -> str:
    """A sweep document around a launch form's config, for the sweep page to open with: the config
    becomes the base, and a grid over the learning rate (a third of it, it, three times it) and two
    seeds is proposed as a starting point the researcher edits. ``dump`` is the launch form's YAML
    dumper, so the base reads exactly as the form's YAML view."""
    base = {k: v for k, v in config.items() if v is not None}
    name = str(base.get("name") or "sweep")
    lr = (base.get("algorithm") or {}).get("learning_rate")
    lines = [
        f"name: {json.dumps(name)}",
        "method: grid                 # or random, with count: N and optional seed: S",
        "metric: train/reward_mean    # the final metric shown on the sweep page",
        "parameters:                  # dotted config paths; values (grid) or min/max[/log] (random)",
    ]
    if isinstance(lr, int | float) and lr > 0:
        lrs = ", ".join(f"{x:.3g}" for x in (lr / 3, lr, lr * 3))
        lines.append(f"  algorithm.learning_rate: {{values: [{lrs}]}}")
    lines.append("  train.seed: {values: [0, 1]}")
    lines.append("config:                      # the launch form's config")
    lines += ["  " + line for line in dump(base).splitlines()]
    return "\n".join(lines) + "\n"


def launch_sweep(text: str, user: Any) -> tuple[str, list[Run]]:
    """Validate the sweep and queue all its runs; returns (tag, runs). Raises SweepError (nothing
    saved) or the launch errors of ``lifecycle.launch_run`` (the whole sweep is rolled back)."""
    try:
        data = yamlio.safe_load(text)
    except yaml.YAMLError as exc:
        raise SweepError(f"sweep: not valid YAML: {exc}") from None
    sweep = sweep_from_data(data, "sweep", base_dir=None, max_runs=MAX_RUNS)
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", sweep.name).strip("-")[:40] or "sweep"
    tag = f"{TAG_PREFIX}{slug}-{uuid.uuid4().hex[:6]}"
    runs = []
    with transaction.atomic():
        for entry in sweep.runs:
            config = dict(entry["config"])
            config["train"] = {**config["train"], "output_dir": None}
            runs.append(lifecycle.launch_run(config, user=user, name=entry["name"], tags=[tag]))
    return tag, runs


def sweep_runs(tag: str) -> list[Run]:
    return list(Run.objects.filter(tags__contains=[tag]).order_by("id"))


def varied_paths(runs: list[Run]) -> list[str]:
    """Config paths whose values differ between the runs (the sweep's hyperparameters)."""
    flat = [flatten(r.config or {}, empty=False) for r in runs]
    keys = sorted({k for f in flat for k in f} - _NOT_VARIED)
    return [k for k in keys if len({repr(f.get(k)) for f in flat}) > 1]


def final_metrics(runs: list[Run], key: str) -> dict[int, float | None]:
    """Each run's value of ``key`` at its last stored step (None when it has none yet)."""
    rows = (
        MetricPoint.objects.filter(run_id__in=[r.pk for r in runs], key=key)
        .order_by("run_id", "-step")
        .distinct("run_id")
        .values_list("run_id", "value")
    )
    found = dict(rows)
    return {r.pk: found.get(r.pk) for r in runs}


def sweep_table(tag: str, metric: str) -> dict[str, Any]:
    """Rows for the sweep page and the data of its parallel-coordinates chart."""
    runs = sweep_runs(tag)
    paths = varied_paths(runs)
    values = final_metrics(runs, metric)
    rows = []
    for i, run in enumerate(runs):
        flat = flatten(run.config or {}, empty=False)
        rows.append(
            {
                "run": run,
                "values": [flat.get(p) for p in paths],
                "metric": values[run.pk],
                "status": run.status,
                # The compare page's colour for the same run (its "overlay" link keeps this order).
                "color": queries.run_color(i),
            }
        )
    chart = {
        "paths": paths,
        "metric": metric,
        "runs": [
            {
                "id": r["run"].pk,
                "name": r["run"].name,
                "values": r["values"],
                "metric": r["metric"],
                "color": r["color"],
            }
            for r in rows
        ],
    }
    return {"tag": tag, "runs": runs, "paths": paths, "rows": rows, "chart": chart}


def cancel_sweep(tag: str) -> int:
    """Cancel every run of the sweep that can still be cancelled; returns how many."""
    n = 0
    for run in sweep_runs(tag):
        if lifecycle.can_cancel(run):
            lifecycle.cancel_run(run)
            n += 1
    return n


def sweep_list(limit: int = 500) -> list[dict[str, Any]]:
    """Every sweep (a ``sweep:`` tag), newest first: its first run's name, how many runs it has in
    each status, when it was launched and whether any run is still queued or running. A sweep used
    to be reachable only from the page its launch redirected to (issue 26.3); this is the page a
    user returns to. One query, grouped in PostgreSQL over the tags' GIN-indexed array."""
    table = Run._meta.db_table
    sql = (
        "SELECT t.tag, count(*), min(r.created), (array_agg(r.name ORDER BY r.id))[1], "
        "array_agg(r.status ORDER BY r.id) "
        f"FROM {table} r CROSS JOIN LATERAL unnest(r.tags) AS t(tag) "
        "WHERE t.tag LIKE %s GROUP BY t.tag ORDER BY min(r.id) DESC LIMIT %s"
    )
    with connection.cursor() as cur:
        cur.execute(sql, [TAG_PREFIX + "%", limit])  # the prefix holds no LIKE wildcard
        rows = cur.fetchall()
    out = []
    for tag, n, created, first_name, statuses in rows:
        counts: dict[str, int] = {}
        for status in statuses:
            counts[status] = counts.get(status, 0) + 1
        out.append(
            {
                "tag": tag,
                "short": tag[len(TAG_PREFIX) :],
                "n": n,
                "created": created,
                "first_name": first_name,
                "counts": sorted(counts.items()),
                "active": any(st in ACTIVE_STATUSES for st in statuses),
            }
        )
    return out


def cancellable_runs(tag: str) -> list[Run]:
    """The sweep's runs a cancel would stop (the confirmation page lists them)."""
    return [run for run in sweep_runs(tag) if lifecycle.can_cancel(run)]


def sweep_status(tag: str, metric: str) -> dict[str, Any]:
    """What the sweep page refreshes while the sweep runs: each run's status and final metric, and
    how many runs a cancel would still stop (0 hides the button)."""
    runs = sweep_runs(tag)
    values = final_metrics(runs, metric)
    return {
        "runs": [{"id": r.pk, "status": r.status, "metric": values[r.pk]} for r in runs],
        "cancellable": sum(1 for r in runs if lifecycle.can_cancel(r)),
        "active": any(r.status in ACTIVE_STATUSES for r in runs),
    }


#: Rows of the new-sweep page's "fields to vary" form.
FIELD_ROWS = 4


def parse_value(text: str) -> Any:
    """One value typed into the fields form: an int, a float (``1e-5`` included, which YAML 1.1
    reads as a string), true/false, null, else the text itself."""
    text = text.strip()
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            pass
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if lowered in ("null", "none", "~"):
        return None
    return text


def _sweep_doc(text: str) -> dict[str, Any]:
    try:
        data = yamlio.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as exc:
        raise SweepError(f"sweep: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise SweepError("sweep: the YAML must be a mapping (name, method, parameters, config)")
    return data


def fields_from_text(text: str) -> dict[str, Any]:
    """The fields form's initial values from a sweep document: method, count and one row per swept
    path with a ``values`` list (ranges stay in the YAML, which the page shows beside the form)."""
    try:
        data = _sweep_doc(text)
    except SweepError:
        data = {}
    params = data.get("parameters") if isinstance(data.get("parameters"), dict) else {}
    rows = [
        {"path": str(path), "values": ", ".join("null" if v is None else str(v) for v in spec["values"])}
        for path, spec in params.items()
        if isinstance(spec, dict) and isinstance(spec.get("values"), list)
    ][:FIELD_ROWS]
    rows += [{"path": "", "values": ""}] * (FIELD_ROWS - len(rows))
    method = data.get("method") if data.get("method") in ("grid", "random") else "grid"
    return {"method": method, "count": data.get("count") or "", "rows": rows}


def text_with_fields(text: str, method: str, count: str, rows: list[tuple[str, str]]) -> str:
    """The sweep document ``text`` with its method, count and swept values replaced by the fields
    form's (issue 26.3: pick the fields and values in a form; the YAML stays the advanced view, and
    its ranges and base config are kept). Raises SweepError when no field is chosen."""
    data = _sweep_doc(text)
    old = data.get("parameters") if isinstance(data.get("parameters"), dict) else {}
    params: dict[str, Any] = {
        path: spec for path, spec in old.items() if not (isinstance(spec, dict) and "values" in spec)
    }
    for path, values in rows:
        path = path.strip()
        items = [parse_value(v) for v in values.split(",") if v.strip()]
        if path and items:
            params[path] = {"values": items}
        elif path:
            raise SweepError(f"sweep: give {path} at least one value (comma-separated)")
    if not params:
        raise SweepError("sweep: choose at least one field to vary, with its values")
    data["method"] = method if method in ("grid", "random") else "grid"
    if data["method"] == "random":
        if not str(count).strip().isdigit() or int(count) < 1:
            raise SweepError("sweep: method random needs a count of runs (1 or more)")
        data["count"] = int(count)
    else:
        data.pop("count", None)
    data["parameters"] = params
    order = ["name", "method", "count", "seed", "metric", "parameters"]
    ordered = {k: data[k] for k in order if k in data} | {k: v for k, v in data.items() if k not in order}
    return yaml.safe_dump(ordered, sort_keys=False, allow_unicode=True)
