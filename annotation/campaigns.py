"""Campaigns: built from the generations of runs, started, closed, configured, listed.

Items of a campaign from runs pair each run's generation for the SAME input. Inputs are matched
on the sample id first (when it carries the same prompt text in every run), then on the prompt
text itself, and what could not be matched is counted and reported: a campaign never shrinks
silently. Uploaded campaigns live in ``annotation.uploads``; both share the caps defined here.
"""

from __future__ import annotations

import hashlib
import random
from collections import defaultdict
from collections.abc import Iterable, Sequence
from itertools import combinations
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from annotation.errors import AnnotationError
from annotation.models import (
    DEFAULT_AXES,
    AssignmentMode,
    Campaign,
    CampaignKind,
    CampaignStatus,
    Item,
    Judgment,
    Membership,
    Pairing,
)
from webapp.runs.models import Run, Sample


def systems_cap() -> int:
    """Systems per campaign. All pairs of k systems is k(k-1)/2 items per prompt: 1,000 systems
    made 499,500 items from a 20 KB upload, so the count is capped before anything is built."""
    return int(getattr(settings, "ANNOTATION_MAX_SYSTEMS", 50))


def items_cap() -> int:
    """Items (pairs or Likert outputs) per campaign, checked before any row is written."""
    return int(getattr(settings, "ANNOTATION_MAX_ITEMS", 50_000))


def run_system(run_id: int) -> str:
    return f"run:{run_id}"


def prompt_hash(prompt: str) -> str:
    return hashlib.sha1(prompt.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------------------------------
# Settings shared by both ways of creating a campaign
# --------------------------------------------------------------------------------------------------


def clean_axes(axes: Any) -> list[dict[str, Any]]:
    if not axes:
        return [dict(a) for a in DEFAULT_AXES]
    out = []
    for i, ax in enumerate(axes):
        if not isinstance(ax, dict) or not str(ax.get("name", "")).strip():
            raise AnnotationError(f"axes[{i}]: needs a name")
        labels = ax.get("labels") or []
        if len(labels) != 5 or not all(isinstance(x, str) and x.strip() for x in labels):
            raise AnnotationError(f"axes[{i}] ({ax.get('name')}): needs 5 anchored labels, one per score 1–5")
        out.append({"name": str(ax["name"]).strip(), "labels": [str(x) for x in labels]})
    return out


def parse_axes_text(text: str) -> list[dict[str, Any]]:
    """Form syntax, one axis per line: ``name: label1 | label2 | label3 | label4 | label5``."""
    axes = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        if ":" not in line:
            raise AnnotationError(f"axes line {n}: expected 'name: label 1 | ... | label 5'")
        name, rest = line.split(":", 1)
        axes.append({"name": name.strip(), "labels": [x.strip() for x in rest.split("|")]})
    return clean_axes(axes)


def axes_to_text(axes: list[dict[str, Any]]) -> str:
    return "\n".join(f"{a['name']}: {' | '.join(a['labels'])}" for a in axes)


def system_pairs(systems: list[str], pairing: str, baseline: str) -> list[tuple[str, str]]:
    if pairing == Pairing.VS_BASELINE:
        if baseline not in systems:
            raise AnnotationError(f"baseline system {baseline!r} is not one of the campaign's systems")
        return [(baseline, s) for s in systems if s != baseline]
    return list(combinations(systems, 2))


def check_systems_cap(n_systems: int) -> None:
    if n_systems > systems_cap():
        raise AnnotationError(
            f"{n_systems} systems, more than the limit of {systems_cap()} per campaign "
            "(all pairs grow with the square of the number of systems); split the comparison"
        )


def items_per_prompt(kind: str, n_systems: int, pairing: str) -> int:
    if kind != CampaignKind.PAIRWISE:
        return n_systems
    if pairing == Pairing.VS_BASELINE:
        return max(0, n_systems - 1)
    return n_systems * (n_systems - 1) // 2


def clean_assignment_mode(mode: Any, kind: str) -> str:
    """``uniform`` or ``adaptive``; adaptive needs pairs of systems, so Likert campaigns refuse it."""
    mode = str(mode or AssignmentMode.UNIFORM)
    if mode not in AssignmentMode.values:
        raise AnnotationError(
            f"assignment must be one of {', '.join(AssignmentMode.values)}, not {mode[:30]!r}"
        )
    if mode == AssignmentMode.ADAPTIVE and kind != CampaignKind.PAIRWISE:
        raise AnnotationError("adaptive assignment chooses pairs of systems: it needs a pairwise campaign")
    return mode


def assignment_description(camp: Campaign, explore: float) -> str:
    """How the items were chosen, in the researcher's words (results page, results JSON)."""
    if camp.kind != CampaignKind.PAIRWISE or camp.assignment_mode != AssignmentMode.ADAPTIVE:
        return (
            f"Items were chosen uniformly: least-judged first, each up to {camp.overlap} judgments "
            "from different annotators."
        )
    return (
        "Items were chosen adaptively: each annotator got an item of the pair of systems whose "
        "comparison most reduced the uncertainty of the Bradley–Terry scores given the judgments so far "
        f"(up to {camp.overlap} judgments per item), and {explore:.0%} of requests followed the uniform "
        "order so every pair kept being compared. The choice depended only on earlier judgments, so the "
        "Bradley–Terry fit and its intervals stay valid; pairs were judged unequally often by design."
    )


def new_campaign(name: str, kind: str, user: Any, **kw: Any) -> Campaign:
    if kind not in CampaignKind.values:
        raise AnnotationError(f"kind must be one of {CampaignKind.values}")
    overlap = int(kw.get("overlap") or 3)
    if overlap < 1:
        raise AnnotationError("overlap must be at least 1")
    mode = clean_assignment_mode(kw.get("assignment_mode"), kind)
    return Campaign.objects.create(
        name=(name or "").strip()[:200] or "campaign",
        kind=kind,
        instructions=kw.get("instructions") or "",
        examples=kw.get("examples") or [],
        axes=clean_axes(kw.get("axes")) if kind == CampaignKind.LIKERT else [],
        overlap=overlap,
        pairing=kw.get("pairing") or Pairing.ALL_PAIRS,
        baseline_system=kw.get("baseline_system") or "",
        assignment_mode=mode,
        source=kw.get("source", "runs"),
        build_report=kw.get("build_report") or {},
        created_by=user if getattr(user, "is_authenticated", False) else None,
    )


def shuffle_and_store(items: list[Item], rng: random.Random) -> None:
    """Items are shown least-judged first, then in ``order``: a random order, so annotators do not
    all start on the first prompt and no system is judged first systematically."""
    rng.shuffle(items)
    for i, it in enumerate(items):
        it.order = i
    Item.objects.bulk_create(items, batch_size=2000)


# --------------------------------------------------------------------------------------------------
# Campaigns from runs
# --------------------------------------------------------------------------------------------------


def _metrics_of(sample: Sample) -> dict[str, float]:
    out: dict[str, float] = {}
    if sample.reward is not None:
        out["reward"] = float(sample.reward)
    for k, v in (sample.metrics or {}).items():
        if isinstance(v, int | float) and not isinstance(v, bool):
            out[str(k)] = float(v)
    return out


def latest_eval_samples(run: Run, split: str | None = None) -> list[Sample]:
    """A run's generations at its last evaluation, in logging order.

    Default split: the non-train splits (the final evaluation generations); ``split="train"`` takes
    the last logged training samples.
    """
    qs = Sample.objects.filter(run=run)
    if split:
        qs = qs.filter(split=split)
    else:
        from webapp.runs.gold_jobs import NOT_EVALUATION  # a gold job's re-generations are not evaluations

        splits = list(qs.exclude(split__in=NOT_EVALUATION).values_list("split", flat=True).distinct())
        qs = qs.filter(split__in=splits) if splits else qs
    last = qs.order_by("-step").values_list("step", flat=True).first()
    if last is None:
        return []
    return list(qs.filter(step=last).order_by("id"))


def _id_order(sample_id: str) -> tuple[int, int, str]:
    return (0, int(sample_id), "") if sample_id.isdigit() else (1, 0, sample_id)


def match_samples(
    per_run: dict[int, list[Sample]],
) -> tuple[list[tuple[str, dict[int, Sample]]], dict[str, Any]]:
    """Group the runs' samples into inputs every run generated for: ``[(key, {run id: sample})]``.

    1. **Sample id**: an id that occurs in every run with the same prompt text in every run.
       Ids are not unique across data sets ("0", "1", ...), hence the prompt check.
    2. **Prompt text**: the samples left over are matched on identical prompt text; a prompt that
       occurs n times in every run (a task whose prompts are all the same) gives n matches.
    3. Anything else is not present in all runs and is counted per run in the report.
    """
    run_ids = list(per_run)
    by_id: dict[int, dict[str, Sample]] = {}
    for rid, samples in per_run.items():
        first: dict[str, Sample] = {}
        for s in samples:
            if s.sample_id:
                first.setdefault(s.sample_id, s)
        by_id[rid] = first
    common_ids = set.intersection(*(set(d) for d in by_id.values())) if by_id else set()
    groups: list[tuple[str, dict[int, Sample]]] = []
    used: set[int] = set()
    id_prompt_differs = 0
    for sid in sorted(common_ids, key=_id_order):
        members = {rid: by_id[rid][sid] for rid in run_ids}
        if len({s.prompt for s in members.values()}) != 1:
            id_prompt_differs += 1
            continue
        groups.append((f"id:{sid}"[:300], members))
        used.update(s.pk for s in members.values())
    n_by_id = len(groups)
    rest: dict[int, dict[str, list[Sample]]] = {}
    for rid, samples in per_run.items():
        by_prompt: dict[str, list[Sample]] = defaultdict(list)
        for s in samples:
            if s.pk not in used:
                by_prompt[s.prompt].append(s)
        rest[rid] = by_prompt
    common_prompts = set.intersection(*(set(d) for d in rest.values())) if rest else set()
    for prompt in sorted(common_prompts):
        n = min(len(rest[rid][prompt]) for rid in run_ids)
        for k in range(n):
            members = {rid: rest[rid][prompt][k] for rid in run_ids}
            groups.append((f"prompt:{prompt_hash(prompt)}:{k}", members))
            used.update(s.pk for s in members.values())
    unmatched = {rid: sum(1 for s in per_run[rid] if s.pk not in used) for rid in run_ids}
    report = {
        "by_sample_id": n_by_id,
        "by_prompt": len(groups) - n_by_id,
        "id_prompt_differs": id_prompt_differs,
        "samples": {str(rid): len(per_run[rid]) for rid in run_ids},
        "unmatched": {str(rid): n for rid, n in unmatched.items()},
    }
    return groups, report


def describe_match(report: dict[str, Any], labels: dict[str, str] | None = None) -> str:
    """One sentence for the campaign page: how many inputs matched, how, and why others did not."""
    if not report or "by_sample_id" not in report:
        return ""
    labels = labels or {}
    parts = [f"{report['by_sample_id']} matched by sample id", f"{report['by_prompt']} by prompt text"]
    text = ", ".join(parts)
    unmatched = {rid: n for rid, n in report.get("unmatched", {}).items() if n}
    if unmatched:
        total = sum(unmatched.values())
        per = ", ".join(
            f"{labels.get(run_system(int(rid)), '#' + rid)}: {n}" for rid, n in sorted(unmatched.items())
        )
        text += f"; {total} samples not present in all runs ({per})"
    if report.get("id_prompt_differs"):
        text += (
            f"; {report['id_prompt_differs']} sample ids carried different prompts in different runs "
            "(so they were matched by prompt text where possible)"
        )
    if report.get("sampled"):
        text += f"; {report['sampled']} of them drawn at random (max items)"
    return text + "."


def _runs_and_samples(run_ids: list[int], split: str | None) -> tuple[dict[int, Run], dict[int, list[Any]]]:
    """The runs by id and each one's latest evaluation samples; an unknown run or one without
    samples is an error that names it."""
    runs = {r.pk: r for r in Run.objects.filter(pk__in=run_ids)}
    missing = [r for r in run_ids if r not in runs]
    if missing:
        raise AnnotationError(f"unknown run ids: {missing}")
    per_run = {}
    for rid in run_ids:
        samples = latest_eval_samples(runs[rid], split)
        if not samples:
            raise AnnotationError(
                f"run #{rid} ({runs[rid].name}) has no samples{' in split ' + split if split else ''}"
            )
        per_run[rid] = samples
    return runs, per_run


@transaction.atomic
def create_campaign_from_runs(
    name: str,
    run_ids: Sequence[int],
    *,
    kind: str = CampaignKind.PAIRWISE,
    user: Any = None,
    split: str | None = None,
    pairing: str = Pairing.ALL_PAIRS,
    baseline_run: int | None = None,
    overlap: int = 3,
    max_items: int | None = None,
    instructions: str = "",
    axes: Any = None,
    seed: int = 0,
    assignment_mode: str = AssignmentMode.UNIFORM,
) -> Campaign:
    """Items from the generations of the runs on the same inputs (see :func:`match_samples`)."""
    run_ids = list(dict.fromkeys(int(r) for r in run_ids))
    min_runs = 2 if kind == CampaignKind.PAIRWISE else 1
    if len(run_ids) < min_runs:
        raise AnnotationError(f"choose at least {min_runs} runs for a {kind} campaign")
    check_systems_cap(len(run_ids))
    runs, per_run = _runs_and_samples(run_ids, split)
    groups, report = match_samples(per_run)
    if not groups:
        raise AnnotationError(
            "the selected runs share no prompts: no sample id with the same prompt, and no identical "
            "prompt text, occurs in every run"
        )
    rng = random.Random(seed)
    if max_items and len(groups) > max_items:
        report["sampled"] = max_items
        picked = sorted(rng.sample(range(len(groups)), max_items))
        groups = [groups[i] for i in picked]
    systems = [run_system(r) for r in run_ids]
    baseline = run_system(baseline_run) if baseline_run else ""
    pairs = system_pairs(systems, pairing, baseline) if kind == CampaignKind.PAIRWISE else []
    n_items = len(groups) * (len(pairs) if kind == CampaignKind.PAIRWISE else len(systems))
    if n_items > items_cap():
        raise AnnotationError(
            f"{len(groups)} inputs × {n_items // len(groups)} items each = {n_items} items, more than the "
            f"limit of {items_cap()} per campaign; set 'max items' or choose fewer runs"
        )
    labels = {run_system(r): f"#{r} {runs[r].name}" for r in run_ids}
    camp = new_campaign(
        name, kind, user, overlap=overlap, pairing=pairing, baseline_system=baseline,
        instructions=instructions, axes=axes, source="runs", build_report=report,
        assignment_mode=assignment_mode,
    )  # fmt: skip
    camp.systems, camp.system_labels = systems, labels
    camp.save(update_fields=["systems", "system_labels"])
    items = []
    for key, members in groups:
        first = members[run_ids[0]]
        common = {"campaign": camp, "key": key, "prompt": first.prompt, "references": first.references or []}
        if kind == CampaignKind.PAIRWISE:
            for sa, sb in pairs:
                if rng.random() < 0.5:
                    sa, sb = sb, sa  # which system is stored as "A" is random too (kappa paradox)
                a, b = members[int(sa[4:])], members[int(sb[4:])]
                items.append(
                    Item(**common, system_a=sa, output_a=a.generation, metrics_a=_metrics_of(a), sample_a=a,
                         system_b=sb, output_b=b.generation, metrics_b=_metrics_of(b), sample_b=b)
                )  # fmt: skip
        else:
            for s in systems:
                a = members[int(s[4:])]
                items.append(
                    Item(**common, system_a=s, output_a=a.generation, metrics_a=_metrics_of(a), sample_a=a)
                )
    shuffle_and_store(items, rng)
    return camp


# --------------------------------------------------------------------------------------------------
# Lifecycle and settings
# --------------------------------------------------------------------------------------------------


def start_problems(camp: Campaign) -> list[str]:
    """Why a campaign cannot start yet (empty when it can)."""
    problems = []
    n_items = camp.items.filter(gold="").count()
    if n_items == 0:
        problems.append("the campaign has no items to judge (gold items alone are not enough)")
    members = camp.memberships.count()
    if members < camp.overlap:
        problems.append(
            f"not enough annotators: {members} joined, but each item needs {camp.overlap} judgments from different "
            f"annotators (overlap {camp.overlap}); invite {camp.overlap - members} more or lower the overlap"
        )
    if camp.kind == CampaignKind.LIKERT and not camp.axes:
        problems.append("a Likert campaign needs at least one axis")
    return problems


def start_campaign(camp: Campaign) -> Campaign:
    """Draft/closed → active, if ``start_problems`` finds nothing; ``camp`` is refreshed in place."""
    with transaction.atomic():
        locked = Campaign.objects.select_for_update().get(pk=camp.pk)
        if locked.status != CampaignStatus.ACTIVE:
            problems = start_problems(locked)
            if problems:
                raise AnnotationError("Cannot start: " + "; ".join(problems) + ".")
            locked.status = CampaignStatus.ACTIVE
            locked.started_at = locked.started_at or timezone.now()
            locked.closed_at = None
            locked.save()
    camp.refresh_from_db()
    return camp


def close_campaign(camp: Campaign) -> Campaign:
    Campaign.objects.filter(pk=camp.pk).update(status=CampaignStatus.CLOSED, closed_at=timezone.now())
    camp.refresh_from_db()
    return camp


def update_settings(camp: Campaign, **kw: Any) -> Campaign:
    """Overlap may change while active only upwards (lowering it could strand judged slots). The
    assignment mode may change at any time: the choice of pairs depends only on past judgments, so
    the ranking stays valid across a switch (docs/annotation.md, "Adaptive assignment")."""
    if kw.get("assignment_mode"):
        camp.assignment_mode = clean_assignment_mode(kw["assignment_mode"], camp.kind)
    if "overlap" in kw and kw["overlap"] is not None:
        ov = int(kw["overlap"])
        if ov < 1:
            raise AnnotationError("overlap must be at least 1")
        if camp.status != CampaignStatus.DRAFT and ov < camp.overlap:
            raise AnnotationError("overlap can only be raised once a campaign has started")
        camp.overlap = ov
    for field in ("name", "instructions"):
        if kw.get(field) is not None:
            setattr(camp, field, kw[field])
    if kw.get("axes") is not None and camp.kind == CampaignKind.LIKERT:
        camp.axes = clean_axes(kw["axes"])
    if kw.get("examples") is not None:
        camp.examples = kw["examples"]
    camp.save()
    return camp


def preview_items(camp: Campaign, n: int = 10) -> list[Item]:
    """The first items annotators will be served (least judged first, then in shuffled order)."""
    return list(camp.items.order_by("slots_taken", "order", "id")[:n])


def campaign_counts(qs: Iterable[Campaign]) -> list[dict[str, Any]]:
    camps = list(qs)
    ids = [c.pk for c in camps]

    def per_campaign(model: Any) -> dict[int, int]:
        return dict(
            model.objects.filter(campaign_id__in=ids)
            .values_list("campaign_id")
            .annotate(n=Count("id"))
            .values_list("campaign_id", "n")
        )

    items, judg, members = per_campaign(Item), per_campaign(Judgment), per_campaign(Membership)
    return [
        {
            "campaign": c,
            "items": items.get(c.pk, 0),
            "judgments": judg.get(c.pk, 0),
            "members": members.get(c.pk, 0),
        }
        for c in camps
    ]


# --------------------------------------------------------------------------------------------------
# Campaigns over one run's checkpoints: the human gold of the over-optimisation watch (issue 28 §2)
# --------------------------------------------------------------------------------------------------

#: ``Campaign.source`` of a campaign whose systems are checkpoints of one run.
CHECKPOINTS_SOURCE = "checkpoints"


def checkpoint_system(run_id: int, step: int) -> str:
    return f"ckpt:{run_id}:{step}"


def checkpoint_step(system: str) -> int | None:
    """The step of a ``ckpt:<run>:<step>`` system, else None."""
    parts = system.split(":")
    if len(parts) == 3 and parts[0] == "ckpt" and parts[2].isdigit():
        return int(parts[2])
    return None


def checkpoint_generations(run: Run, split: str | None = None) -> dict[int, list[Sample]]:
    """``{step: evaluation samples logged at that step}`` for each saved checkpoint of ``run`` that
    has them and is still on disk: the checkpoint's generations are the evaluation made at the step
    it was saved (``train.eval_every`` a multiple of ``train.save_every`` gives every checkpoint
    one). A pruned checkpoint is left out: its ranking could name a best checkpoint that can no
    longer be exported or launched from."""
    from webapp.runs.gold_jobs import NOT_EVALUATION, existing_checkpoints

    steps = [int(c.step) for c in existing_checkpoints(run.pk)[0]]
    qs = Sample.objects.filter(run=run, step__in=steps)
    qs = qs.filter(split=split) if split else qs.exclude(split__in=NOT_EVALUATION)
    out: dict[int, list[Sample]] = defaultdict(list)
    for s in qs.order_by("step", "id"):
        out[int(s.step)].append(s)
    return {step: out[step] for step in steps if out.get(step)}


@transaction.atomic
def create_campaign_from_checkpoints(
    name: str,
    run_id: int,
    *,
    steps: Sequence[int] | None = None,
    user: Any = None,
    split: str | None = None,
    overlap: int = 3,
    max_items: int | None = None,
    instructions: str = "",
    seed: int = 0,
    assignment_mode: str = AssignmentMode.UNIFORM,
) -> Campaign:
    """A pairwise campaign whose systems are the run's checkpoints (``ckpt:<run>:<step>``): each item
    pairs two checkpoints' generations for the same evaluation input, matched as
    :func:`create_campaign_from_runs` matches runs (sample id, then prompt text). Its Bradley–Terry
    ratings are the run's human gold (:func:`checkpoint_human_gold`)."""
    run = Run.objects.filter(pk=run_id).first()
    if run is None:
        raise AnnotationError(f"run: there is no run #{run_id}")
    per_step = checkpoint_generations(run, split)
    if steps is not None:
        wanted = list(dict.fromkeys(int(s) for s in steps))
        _refuse_pruned(run, wanted)
        missing = [s for s in wanted if s not in per_step]
        if missing:
            raise AnnotationError(
                f"steps: no checkpoint with evaluation generations at step(s) {missing}; "
                f"available: {sorted(per_step) or 'none'}"
            )
        per_step = {s: per_step[s] for s in wanted}
    if len(per_step) < 2:
        raise AnnotationError(
            f"run #{run.pk} has {len(per_step)} saved checkpoint(s) still on disk with evaluation generations "
            "at their step; comparing checkpoints needs at least 2 (evaluate whenever a checkpoint is saved: "
            "train.eval_every dividing train.save_every; keep them: train.keep_checkpoints)"
        )
    check_systems_cap(len(per_step))
    groups, report = match_samples(per_step)
    if not groups:
        raise AnnotationError("the checkpoints' evaluations share no prompts (by sample id or prompt text)")
    rng = random.Random(seed)
    if max_items and len(groups) > max_items:
        report["sampled"] = max_items
        picked = sorted(rng.sample(range(len(groups)), max_items))
        groups = [groups[i] for i in picked]
    order = list(per_step)
    systems = [checkpoint_system(run.pk, s) for s in order]
    step_of = dict(zip(systems, order))
    pairs = system_pairs(systems, Pairing.ALL_PAIRS, "")
    n_items = len(groups) * len(pairs)
    if n_items > items_cap():
        raise AnnotationError(
            f"{len(groups)} inputs × {len(pairs)} pairs = {n_items} items, more than the limit of "
            f"{items_cap()} per campaign; set 'max items' or choose fewer checkpoints"
        )
    report.update(run=run.pk, checkpoints=order)
    camp = new_campaign(
        name or f"{run.name}: checkpoints", CampaignKind.PAIRWISE, user, overlap=overlap,
        pairing=Pairing.ALL_PAIRS, instructions=instructions, source=CHECKPOINTS_SOURCE, build_report=report,
        assignment_mode=assignment_mode,
    )  # fmt: skip
    camp.systems = systems
    camp.system_labels = {s: f"#{run.pk} step {step_of[s]}" for s in systems}
    camp.save(update_fields=["systems", "system_labels"])
    items = []
    for key, members in groups:
        first = members[order[0]]
        common = {"campaign": camp, "key": key, "prompt": first.prompt, "references": first.references or []}
        for sa, sb in pairs:
            if rng.random() < 0.5:
                sa, sb = sb, sa  # which checkpoint is stored as "A" is random too
            a, b = members[step_of[sa]], members[step_of[sb]]
            items.append(
                Item(**common, system_a=sa, output_a=a.generation, metrics_a=_metrics_of(a), sample_a=a,
                     system_b=sb, output_b=b.generation, metrics_b=_metrics_of(b), sample_b=b)
            )  # fmt: skip
    shuffle_and_store(items, rng)
    return camp


def _refuse_pruned(run: Run, steps: Sequence[int]) -> None:
    """A requested checkpoint that was recorded but is gone from disk is refused by name."""
    from webapp.runs.gold_jobs import existing_checkpoints, missing_message

    gone = [c for c in existing_checkpoints(run.pk)[1] if int(c.step) in steps]
    if gone:
        raise AnnotationError("steps: " + "; ".join(missing_message(c) for c in gone))


def checkpoint_campaigns(run_id: int) -> list[Campaign]:
    return list(
        Campaign.objects.filter(source=CHECKPOINTS_SOURCE, build_report__run=int(run_id)).order_by("id")
    )


def checkpoint_human_gold(run: Run) -> list[dict[str, Any]]:
    """The run's human golds, one per campaign over its checkpoints that has judgments: each
    checkpoint's Bradley–Terry rating (Elo scale; ``annotation.results.rank_systems``, the ranking
    every results page shows) by step, with a sentence giving the intervals and the number of
    judgments (``webapp.runs.extensions`` gold-source format)."""
    from annotation.results import ranking  # results imports this module

    out = []
    for camp in checkpoint_campaigns(run.pk):
        if not camp.judgments.exists():
            continue
        ranked = ranking(camp)
        rows = [r for r in ranked["rows"] if checkpoint_step(r["system"]) is not None]
        series = {checkpoint_step(r["system"]): r["rating"] for r in rows}
        intervals = "; ".join(
            f"step {checkpoint_step(r['system'])}: {r['rating']:.0f} ({r['low']:.0f}–{r['high']:.0f}), "
            f"win rate {r['win_rate']:.2f}" if r["win_rate"] is not None else
            f"step {checkpoint_step(r['system'])}: {r['rating']:.0f} ({r['low']:.0f}–{r['high']:.0f})"
            for r in sorted(rows, key=lambda r: checkpoint_step(r["system"]) or 0)
        )  # fmt: skip
        note = (
            f"Human gold: Bradley–Terry rating (Elo scale, 95% interval) of each checkpoint from "
            f"{ranked['n']} human pairwise judgments in campaign #{camp.pk} “{camp.name}” — {intervals}."
        )
        if not ranked["enough_data"]:
            note += " " + ranked["message"]
        out.append(
            {"key": f"human:{camp.pk}", "label": f"human: {camp.name} (campaign #{camp.pk})", "series": series,
             "note": note, "campaign_id": camp.pk}
        )  # fmt: skip
    return out
