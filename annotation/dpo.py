"""DPO from a campaign's judgments: export the decided pairs into the data directory and build the
launch form's config on the server.

The results page posts to :func:`annotation.views.fine_tune_dpo`, which writes the pairs (the same rows
as the JSONL export) to ``<runs dir>/preference_pairs/campaign-<id>-pairs.jsonl`` and opens the launch form
with ``?dpo_campaign=<id>``. The runs app knows nothing of campaigns: :func:`launch_config` is
registered as that parameter's launch source (``webapp.runs.extensions``), so only the id travels
through the browser and the config (pairs path, model, DPO settings) is built here.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from django.http import HttpRequest

from annotation.ai_judges import check_source
from annotation.errors import AnnotationError
from annotation.models import Campaign, CampaignKind
from annotation.pairs import preference_pairs
from webapp.runs import paths
from webapp.runs.errors import PathNotAllowed
from webapp.runs.models import Run

#: Pairs per optimizer step and passes over the pairs that the prefilled form proposes.
PAIRS_PER_STEP = 8
EPOCHS = 3
#: Settings of the prefilled form: TRL's DPOTrainer defaults (beta 0.1, sigmoid loss).
DPO_SETTINGS = {"beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0, "max_response_length": 128}
#: Not TRL's 1e-6: a campaign gives tens of pairs, so the run makes tens of optimizer steps, and at 1e-6
#: train/loss stayed at ln 2 = 0.693 (issue 26.10). At 1e-5 SmolLM2-135M on the 64 shipped IMDB pairs
#: reaches a train/loss well below ln 2 with preference accuracy 1.0 within 22 steps (docs/annotation.md).
LEARNING_RATE = 1e-5
#: The model fields a DPO run takes over from the judged runs (the policy they started from).
MODEL_KEYS = ("name_or_path", "type", "revision", "gguf_file", "device", "mixed_precision")


def pairs_path(camp: Campaign, source: str = "human") -> Path:
    """Where a campaign's pairs are written: beside the trained reward models, in the runs directory
    (``<GRUE_DATA_DIR>/runs`` by default), which every launched run may read and every worker sees.
    Human pairs keep the original name; AI and combined pairs get ``-ai`` / ``-both``."""
    tail = "" if source == "human" else f"-{source}"
    return paths.runs_root() / "preference_pairs" / f"campaign-{camp.pk}{tail}-pairs.jsonl"


def launch_value(camp: Campaign, source: str = "human") -> str:
    """The ``dpo_campaign`` launch parameter: the id, with ``-ai``/``-both`` for AI or combined pairs."""
    return str(camp.pk) if source == "human" else f"{camp.pk}-{source}"


def export_pairs(camp: Campaign, source: str = "human") -> tuple[Path, int]:
    """Write the campaign's decided pairs (ties, both-bad and gold dropped) and return (path, count).
    ``source``: human judgments, AI judges' verdicts or both (``pairs.preference_pairs``)."""
    if camp.kind != CampaignKind.PAIRWISE:
        raise AnnotationError("DPO needs pairwise judgments; this is a Likert campaign")
    source = check_source(source)
    pairs = preference_pairs(camp, source=source)
    if not pairs:
        who = {"human": "", "ai": " from AI judges", "both": " from humans or AI judges"}[source]
        raise AnnotationError(f"no decided pairwise judgments{who} yet (ties and 'both bad' are not pairs)")
    path = pairs_path(camp, source)
    try:
        paths.check_path(path, paths.read_roots())
    except PathNotAllowed as exc:
        raise AnnotationError(f"cannot export the pairs for DPO: {exc}") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")
    os.replace(tmp, path)  # a run reading the file never sees half of it
    return path, len(pairs)


def campaign_runs(camp: Campaign) -> list[Run]:
    ids = [int(s.split(":", 1)[1]) for s in camp.systems if s.startswith("run:") and s[4:].isdigit()]
    runs = {r.pk: r for r in Run.objects.filter(pk__in=ids)}
    return [runs[i] for i in ids if i in runs]


def _model_section(runs: list[Run]) -> tuple[dict[str, Any], dict[str, Any], str]:
    """The judged runs' starting model (the most common one) and tokenizer, with a note for the user."""
    if not runs:
        return {}, {}, "the campaign's outputs were uploaded, not produced by runs: choose the model below"
    configs = [r.config or {} for r in runs]
    names = Counter((c.get("model") or {}).get("name_or_path") for c in configs)
    name, _ = names.most_common(1)[0]
    chosen = next(c for c in configs if (c.get("model") or {}).get("name_or_path") == name)
    model = {k: v for k, v in (chosen.get("model") or {}).items() if k in MODEL_KEYS}
    note = (
        "" if len(names) == 1 else f"the judged runs used {len(names)} models; the most common is filled in"
    )
    return model, dict(chosen.get("tokenizer") or {}), note


def dpo_config(camp: Campaign, pairs_file: Path, n_pairs: int, source: str = "human") -> dict[str, Any]:
    """The whole run config the launch form opens with."""
    model, tokenizer, _note = _model_section(campaign_runs(camp))
    per_step = min(PAIRS_PER_STEP, n_pairs)
    heldout = 0.1 if n_pairs >= 50 else 0.0  # too few inputs to hold some out: evaluate on the train prompts
    cfg: dict[str, Any] = {
        "name": (
            f"DPO on {camp.name}" + {"human": "", "ai": " (AI judges)", "both": " (humans + AI)"}[source]
        )[:200],
        "task": {"id": "preference_pairs", "args": {"path": str(pairs_file), "heldout_fraction": heldout}},
        "reward": {"id": "rouge_l_max"},
        "algorithm": {
            "id": "dpo",
            "learning_rate": LEARNING_RATE,
            "minibatch_size": per_step,
            "max_grad_norm": 1.0,
            "dpo": dict(DPO_SETTINGS),
        },
        "train": {
            "n_iters": max(1, math.ceil(EPOCHS * n_pairs * (1 - heldout) / per_step)),
            "prompts_per_iter": per_step,
            "eval_every": 0,
            "save_every": 0,
        },
        "eval": {"metrics": [{"id": "rouge_l_max", "args": {}}]},
    }
    if model:
        cfg["model"] = model
    if tokenizer:
        cfg["tokenizer"] = tokenizer
    return cfg


def launch_config(request: HttpRequest, value: str) -> dict[str, Any]:
    """Launch source for ``?dpo_campaign=<id>[-ai|-both]``: reads the pairs the results page exported."""
    m = re.fullmatch(r"(\d+)(?:-(ai|both))?", value)
    if m is None:
        raise ValueError(f"dpo_campaign: {value[:40]!r} is not a campaign id")
    source = m.group(2) or "human"
    camp = Campaign.objects.filter(pk=int(m.group(1))).first()
    if camp is None:
        raise ValueError(f"dpo_campaign: no campaign #{m.group(1)}")
    path = pairs_path(camp, source)
    if not path.exists():
        raise ValueError(
            f"campaign #{camp.pk}: its pairs are not exported yet; use 'Fine-tune with DPO on these "
            "judgments' on its results page"
        )
    with path.open(encoding="utf-8") as fh:
        n_pairs = sum(1 for line in fh if line.strip())
    return dpo_config(camp, path, n_pairs, source)
