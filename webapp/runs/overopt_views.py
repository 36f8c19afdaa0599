"""The run page's rubric and over-optimisation panels, and the compare view's gold chart.

Why template tags and not views: the panels are parts of pages that already exist (the run page, the
compare view); computing them where they are rendered keeps those views untouched, and each panel
reads only its own few rows (the run's rubric samples, three metric keys, the checkpoints).

- Rubric panel: the run's rubric (criteria, weights, scales, as configured in ``reward`` or in a
  ``gold`` evaluation metric) and the judge's mean per-criterion scores (``rubric/<name>`` of the
  logged samples) at the first and the newest logged step of each split.
- Over-optimisation panel: proxy and gold against training progress and against √KL from the
  initial policy (``engine.overopt``), the best evaluation by gold and its checkpoint, and the
  warning when gold fell at N consecutive evaluations while the proxy rose, or stayed more than two
  standard errors below its best at N consecutive evaluations while the proxy stood above its value
  there (the errors from the stored evaluation samples, or from a gold job's per-step errors). The
  gold key is ``eval/gold`` unless the researcher picks another evaluation metric (``?gold=``); N is
  ``?falls=``.

Everything shown is escaped by the templates; numbers go to the charts through ``json_script``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any
from urllib.parse import urlencode

from django import template
from django.http import HttpRequest
from django.urls import reverse

from engine import overopt
from engine.rewards.rubric import DETAIL_PREFIX, RubricError, parse_rubric
from webapp.runs import extensions, gold_jobs
from webapp.runs.models import Artifact, MetricPoint, Run, Sample

register = template.Library()

MAX_FALLS = 50
SAMPLE_ROWS = 2000


# -------------------------------------------------------------------------------------------- rubric


def _rubric_configs(config: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """``(where, args)`` of every rubric in a run config: the reward, its components, gold metrics."""
    found: list[tuple[str, Mapping[str, Any]]] = []
    reward = config.get("reward") or {}
    if isinstance(reward, Mapping):
        if reward.get("id") == "rubric":
            found.append(("reward", reward.get("args") or {}))
        for i, comp in enumerate(reward.get("components") or []):
            if isinstance(comp, Mapping) and comp.get("id") == "rubric":
                found.append((f"reward component {i + 1}", comp.get("args") or {}))
    for metric in (config.get("eval") or {}).get("metrics") or []:
        if isinstance(metric, Mapping) and metric.get("id") == "gold":
            inner = (metric.get("args") or {}).get("reward") or {}
            if isinstance(inner, Mapping) and inner.get("id") == "rubric":
                found.append(("gold (evaluations)", inner.get("args") or {}))
    return found


def rubric_context(run: Run) -> dict[str, Any] | None:
    """What the rubric panel shows, or None for a run without a rubric."""
    configs = _rubric_configs(run.config or {})
    if not configs:
        return None
    rubrics = []
    for where, args in configs:
        try:
            rubric = parse_rubric(args)
        except RubricError as exc:
            rubrics.append({"where": where, "error": str(exc), "criteria": []})
            continue
        judge = args.get("judge") if isinstance(args.get("judge"), Mapping) else {"backend": "local"}
        criteria = [
            {"name": c.name, "description": c.description, "weight": c.weight, "low": c.low, "high": c.high,
             "labels": [f"{k} = {t}" for k, t in c.labels]}
            for c in rubric.criteria
        ]  # fmt: skip
        judge_text = str(judge.get("backend", "local"))
        if judge.get("model") or judge.get("endpoint"):
            judge_text += f" ({judge.get('model') or judge.get('endpoint')})"
        rubrics.append({"where": where, "criteria": criteria, "judge": judge_text, "error": ""})
    names = [c["name"] for r in rubrics for c in r["criteria"]]
    rows = list(
        Sample.objects.filter(run_id=run.pk)
        .order_by("-id")
        .values_list("split", "step", "metrics")[:SAMPLE_ROWS]
    )
    by_split: dict[str, dict[int, dict[str, list[float]]]] = {}
    for split, step, metrics in rows:
        for key, value in (metrics or {}).items():
            if key.startswith(DETAIL_PREFIX) and isinstance(value, int | float):
                by_split.setdefault(split, {}).setdefault(step, {}).setdefault(
                    key[len(DETAIL_PREFIX) :], []
                ).append(value)
    shown = [n for n in dict.fromkeys(names)] + sorted(
        {k for steps in by_split.values() for s in steps.values() for k in s} - set(names)
    )
    tables = []
    for split in sorted(by_split):
        steps = sorted(by_split[split])
        picks = [steps[0]] if len(steps) == 1 else [steps[0], steps[-1]]
        tables.append(
            {
                "split": split,
                "rows": [
                    {
                        "step": s,
                        "n": max((len(v) for v in by_split[split][s].values()), default=0),
                        "means": [_mean(by_split[split][s].get(n)) for n in shown],
                    }
                    for s in picks
                ],
            }
        )
    return {"rubrics": rubrics, "columns": shown, "tables": tables}


def _mean(values: list[float] | None) -> float | None:
    return sum(values) / len(values) if values else None


# ------------------------------------------------------------------------------- over-optimisation


def _series(run_ids: Iterable[int], keys: Iterable[str]) -> dict[int, dict[str, dict[int, float]]]:
    out: dict[int, dict[str, dict[int, float]]] = {}
    rows = MetricPoint.objects.filter(run_id__in=list(run_ids), key__in=list(keys)).values_list(
        "run_id", "key", "step", "value"
    )
    for run_id, key, step, value in rows:
        if value is not None:
            out.setdefault(run_id, {}).setdefault(key, {})[int(step)] = float(value)
    return out


def eval_keys(run_ids: Iterable[int]) -> list[str]:
    """Evaluation keys a researcher can pick as gold (not the proxy itself)."""
    keys = (
        MetricPoint.objects.filter(run_id__in=list(run_ids), key__startswith="eval/")
        .values_list("key", flat=True)
        .distinct()
    )
    return sorted(k for k in keys if k not in ("eval/reward_mean", "eval/reward_std"))


def _params(request: HttpRequest | None, default_gold: str = overopt.GOLD_KEY) -> tuple[str, int]:
    gold = default_gold
    falls = overopt.DEFAULT_FALLS
    if request is not None:
        gold = (request.GET.get("gold") or gold).strip()[:200]
        try:
            falls = min(max(int(request.GET.get("falls", falls)), 1), MAX_FALLS)
        except ValueError:
            falls = overopt.DEFAULT_FALLS
    return gold, falls


def pick_default_gold(choices: list[str], jobs: list[dict[str, Any]]) -> str:
    """``eval/gold`` when the run logged it, else the newest gold scored after the fact, else the
    first source offered (a human campaign over the checkpoints)."""
    if overopt.GOLD_KEY in choices:
        return overopt.GOLD_KEY
    done = [j["key"] for j in jobs if j["kind"] == gold_jobs.GOLD_KIND and j["key"] in choices]
    if done:
        return done[-1]
    return overopt.GOLD_KEY


def gold_errors(
    run: Run,
    gold_key: str,
    rows: list[tuple[int, str, Any]] | None = None,
    jobs: Sequence[Artifact] | None = None,
) -> dict[int, float]:
    """Each step's standard error of the gold, for the watch's below-the-best rule: a gold job's own
    per-step errors when the key is a job's, else the sample standard deviation / √n of the stored
    evaluation samples' per-sample scores (``eval/<name>`` is ``metrics[<name>]`` of a sample, as in
    ``engine.overopt.sample_errors``). Empty for golds without per-sample scores (a human campaign's
    ratings): the rule then does not run. ``jobs``: the run's ``gold_jobs.jobs_of``, when the caller
    has it already (the run page reads them once per view)."""
    job = gold_jobs.job_with_key(run, gold_key, jobs)
    if job is not None:
        return {
            int(e["step"]): float(e["se"])
            for e in (job.meta or {}).get("steps") or []
            if isinstance(e.get("se"), int | float) and math.isfinite(e["se"])
        }
    if not gold_key.startswith("eval/"):
        return {}
    rows = eval_sample_rows(run, gold_key, jobs) if rows is None else rows
    return {step: se for step, (_n, se) in overopt.step_errors((st, v) for st, _sid, v in rows).items()}


def eval_sample_rows(
    run: Run, gold_key: str, jobs: Sequence[Artifact] | None = None
) -> list[tuple[int, str, Any]]:
    """``(step, sample_id, score)`` of the samples scored for an ``eval/`` key: one query for both the
    per-step errors and the per-prompt scores. A gold job's key (``eval/gold:<label>``) reads the
    per-sample gold the job stored: on the evaluation samples, or on the samples it re-generated from
    the checkpoints (``gold_jobs.REGEN_SPLIT``). ``jobs`` as in :func:`gold_errors`."""
    if not gold_key.startswith("eval/"):
        return []
    name = gold_key.removeprefix("eval/")
    split = gold_jobs.eval_split(run)
    if name.startswith(gold_jobs.SAMPLE_KEY_PREFIX):
        job = gold_jobs.job_with_key(run, gold_key, jobs)
        if job is not None and (job.meta or {}).get("prompts"):
            split = gold_jobs.REGEN_SPLIT
    rows = Sample.objects.filter(run_id=run.pk, split=split, metrics__has_key=name)
    return [(st, sid, m.get(name)) for st, sid, m in rows.values_list("step", "sample_id", "metrics")]


def gold_scores(
    run: Run, gold_key: str, rows: list[tuple[int, str, Any]] | None = None
) -> dict[int, dict[str, float]]:
    """Each evaluation's per-sample gold by prompt (``sample_id``), so that the below-the-best rule
    compares two evaluations over the prompts they share (``engine.overopt.difference_error``): a
    run's evaluations score the same prompts, and the paired difference has no share of the prompts'
    own spread. Empty for golds without stored per-sample scores (a campaign's, a gold job's that
    predates per-sample tags)."""
    rows = eval_sample_rows(run, gold_key) if rows is None else rows
    return overopt.group_scores(r for r in rows if r[1])


def watch_of(
    run: Run,
    series: Mapping[str, Mapping[int, float]],
    gold_key: str,
    falls: int,
    jobs: Sequence[Artifact] | None = None,
) -> dict[str, Any]:
    """The watch of one run as template context (and the chart's data). ``jobs``: the run's gold
    jobs when the caller has read them (one query per view, not one per helper)."""
    proxy_key, proxy = overopt.pick_proxy(series)
    ckpts = {c.step: c.path for c in gold_jobs.existing_checkpoints(run.pk)[0]}  # not the pruned ones
    jobs = gold_jobs.jobs_of(run, gold_jobs.GOLD_KIND) if jobs is None else jobs  # read once for both
    rows = eval_sample_rows(run, gold_key, jobs)
    errors, scores = gold_errors(run, gold_key, rows, jobs), gold_scores(run, gold_key, rows)
    w = overopt.watch(
        series.get(gold_key) or {}, proxy, series.get(overopt.KL_KEY), ckpts, falls, errors, scores=scores
    )
    data = w.to_dict()
    data.update(run_id=run.pk, run_name=run.name, gold_key=gold_key, proxy_key=proxy_key)
    return {
        "run": run,
        "watch": w,
        "data": data,
        "proxy_key": proxy_key,
        "best_checkpoint_path": ckpts.get(w.best_checkpoint) if w.best_checkpoint is not None else None,
    }


def overopt_context(run: Run, request: HttpRequest | None) -> dict[str, Any] | None:
    """What the over-optimisation panel shows, or None for a run with nothing to watch (no
    evaluation metric, no evaluation generations, no checkpoint)."""
    choices = eval_keys([run.pk])
    gold_jobs.fail_stale_jobs(run_ids=[run.pk])  # a job whose worker died shows as failed
    artifacts = gold_jobs.jobs_of(run)  # read once: the helpers below take them
    jobs = [gold_jobs.job_json(j) for j in artifacts]
    ckpts, pruned = gold_jobs.existing_checkpoints(run.pk)
    has_evals = bool(gold_jobs.eval_steps(run.pk)) if not choices else True
    sources = extensions.gold_sources(run)
    if not choices and not has_evals and not ckpts and not sources:
        return None
    gold_key, falls = _params(request, pick_default_gold(choices, jobs))
    source = next((g for g in sources if g["key"] == gold_key), None)
    series = _series([run.pk], [gold_key, overopt.KL_KEY, *overopt.PROXY_KEYS]).get(run.pk, {})
    if source is not None:
        series[gold_key] = {int(k): float(v) for k, v in source["series"].items()}
    ctx: dict[str, Any] = {
        "choices": choices,
        "sources": sources,
        "source": source,
        "gold_key": gold_key,
        "falls": falls,
        "has_gold": bool(series.get(gold_key)),
        "jobs": [j for j in jobs if j["kind"] == gold_jobs.GOLD_KIND],
        "can_score": has_evals and not run.is_reference,
        "jobs_url": reverse("runs:gold_jobs", args=[run.pk]),
        "pruned": [c.step for c in pruned],
    }
    if ctx["has_gold"]:
        ctx.update(watch_of(run, series, gold_key, falls, artifacts))
    ctx["regenerated"] = gold_jobs.regenerated_for(run, gold_key, artifacts)
    exports = {j["step"]: j for j in jobs if j["kind"] == gold_jobs.EXPORT_KIND}
    gold_at = series.get(gold_key) or {}
    best = ctx.get("watch").best_checkpoint if ctx.get("watch") is not None else None
    ctx["checkpoints"] = [
        {"step": c.step, "gold": gold_at.get(int(c.step)), "best": c.step == best,
         "export": exports.get(int(c.step)),
         "launch_url": reverse("runs:launch") + "?" + urlencode({"checkpoint": f"{run.pk}:{c.step}"})}
        for c in ckpts
    ]  # fmt: skip
    return ctx


# ------------------------------------------------------------------------------------ template tags


@register.inclusion_tag("runs/_rubric_panel.html")
def rubric_panel(run: Run) -> dict[str, Any]:
    return {"rubric": rubric_context(run), "run": run}


@register.inclusion_tag("runs/_overopt_panel.html", takes_context=True)
def overopt_panel(context: Any, run: Run) -> dict[str, Any]:
    return {"overopt": overopt_context(run, context.get("request")), "run": run}


EACH_NEWEST = ":*"


def source_choices(runs: list[Run], sources: Mapping[int, list[dict[str, Any]]]) -> list[dict[str, str]]:
    """The compare view's menu entries for golds other apps compute (a human campaign over a run's
    checkpoints): ``<kind>:*``, each run's newest gold of that kind (to see several runs' human golds
    at once), then every run's own golds by key."""
    kinds = sorted({g["key"].split(":", 1)[0] for gs in sources.values() for g in gs if ":" in g["key"]})
    out = [{"value": k + EACH_NEWEST, "label": f"{k}: each run's newest"} for k in kinds]
    for run in runs:
        for g in sources.get(run.pk, []):
            out.append({"value": g["key"], "label": f"#{run.pk} {run.name} — {g['label']}"})
    return out


def pick_source(golds: list[dict[str, Any]], gold_key: str) -> dict[str, Any] | None:
    """The run's gold named by ``gold_key`` (a key, or ``<kind>:*`` for its newest of that kind)."""
    if gold_key.endswith(EACH_NEWEST):
        kind = gold_key[: -len(EACH_NEWEST)] + ":"
        return next((g for g in reversed(golds) if g["key"].startswith(kind)), None)
    return next((g for g in golds if g["key"] == gold_key), None)


@register.inclusion_tag("runs/_overopt_compare.html", takes_context=True)
def overopt_compare(context: Any, runs: list[Run]) -> dict[str, Any]:
    """Proxy and gold of every compared run that has the gold, on the same two axes: a logged
    evaluation key, or a gold another app computes (a human campaign's Bradley–Terry ratings, drawn
    as on the run page, with its note)."""
    gold_key, falls = _params(context.get("request"))
    ids = [r.pk for r in runs]
    series = _series(ids, [gold_key, overopt.KL_KEY, *overopt.PROXY_KEYS])
    sources = {r.pk: extensions.gold_sources(r) for r in runs}
    notes = []
    for r in runs:
        source = pick_source(sources[r.pk], gold_key)
        if source is not None:
            series.setdefault(r.pk, {})[gold_key] = {int(k): float(v) for k, v in source["series"].items()}
            notes.append({"run": r, "label": source["label"], "note": source["note"]})
    watches = [watch_of(r, series[r.pk], gold_key, falls) for r in runs if series.get(r.pk, {}).get(gold_key)]
    labels = {n["run"].pk: n["label"] for n in notes}
    for w in watches:
        w["data"]["gold_key"] = labels.get(w["run"].pk, gold_key)  # the chart's legend names the campaign
    shown = [(w["run"], gold_jobs.regenerated_for(w["run"], gold_key)) for w in watches]
    return {
        "watches": watches,
        "regenerated": [{**table, "run": run} for run, table in shown if table is not None],
        "ids_param": context.get("ids_param", ""),
        "gold_key": gold_key,
        "falls": falls,
        "choices": eval_keys(ids),
        "source_choices": source_choices(runs, sources),
        "notes": notes,
        "data": [w["data"] for w in watches],
    }
