"""Every GRUE task end to end: SFT warm start + PPO or NLPO on its shipped fixture with a builtin tiny model,
through ``engine.train``, then ``engine.evaluate`` writes a results file with the task's full metric set.

Each task starts from its offline preset (so the preset's data pool, reward and metric wiring is what runs)
and shrinks it: 4 prompts, 6-token generations, one SFT step and one RL iteration.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

import engine
from engine.config import parse_config
from engine.presets import load_preset
from engine.registry import metrics, tasks

# task -> (causal?, RL algorithm exercised). PPO and NLPO alternate so both run on both model families.
TASKS = {
    "imdb": (True, "ppo"),
    "commongen": (False, "nlpo"),
    "cnn_daily_mail": (False, "ppo"),
    "totto": (False, "nlpo"),
    "narrative_qa": (False, "ppo"),
    "iwslt2017en_de": (False, "nlpo"),
    "wmt16en_de": (False, "ppo"),
    "daily_dialog": (True, "nlpo"),
}

VOCAB = 50257  # GPT-2's, shared by both builtin tiny models

# A key every metric id must put into the results (the metric's headline value), and the range a
# finite value of it must lie in. Bounded scores are checked on their whole scale; perplexities of the
# (nearly random) tiny models must lie between 1 and a few times the vocabulary size (a uniform model
# scores exactly VOCAB); TER is edits / reference words, at most about 1 for these short generations.
EXPECTED_KEY = {
    "sentiment": ("semantic/sentiment_vader", 0.0, 1.0),
    "perplexity": ("fluency_metrics/perplexity", 1.0, 20 * VOCAB),
    "generation_perplexity": ("fluency_metrics/generation_perplexity", 1.0, 20 * VOCAB),
    "diversity": ("diversity_metrics/distinct-1", 0.0, 1.0),
    "meteor": ("lexical/meteor", 0.0, 1.0),
    "rouge": ("lexical/rouge_rouge1", 0.0, 1.0),
    "bleu": ("lexical/bleu", 0.0, 1.0),
    "bertscore": ("semantic/bert_score", -1.0, 1.0),
    "cider": ("lexical/cider", 0.0, 10.0),
    "parent": ("table_to_text/parent_overall_f_score", 0.0, 1.0),
    "rouge_l_max": ("lexical/rouge_l_max", 0.0, 1.0),
    "sacrebleu": ("lexical/sacrebleu", 0.0, 1.0),
    "chrf": ("lexical/chrf", 0.0, 1.0),
    "ter": ("lexical/ter", 0.0, 2.0),
    "intent_accuracy": ("intent/accuracy", 0.0, 1.0),
}


def check_range(metric_id: str, value: object) -> None:
    key, lo, hi = EXPECTED_KEY[metric_id]
    assert isinstance(value, float) and math.isfinite(value), (key, value)  # NaN is a failure too
    assert lo <= value <= hi, (key, value, (lo, hi))


def tiny(task: str, tmp_path: Path) -> dict:
    causal, rl = TASKS[task]
    cfg = load_preset(f"{task}_supervised_{rl}_offline")
    cfg["model"] = {"name_or_path": "builtin:tiny-gpt2" if causal else "builtin:tiny-t5"}
    cfg["tokenizer"].update({"max_prompt_length": 48, "pad_token_as_eos_token": True})
    gen = {"max_new_tokens": 6, "min_new_tokens": 0, "batch_size": 4, "num_beams": 1}
    cfg["rollout"].update(gen)
    cfg["eval"]["generation"].update(gen)
    cfg["task"].update({"max_train_samples": 4, "max_eval_samples": 4})
    cfg["train"].update(
        {
            "n_iters": 1,
            "prompts_per_iter": 4,
            "eval_every": 0,
            "save_every": 0,
            "log_samples": 2,
            "output_dir": str(tmp_path / "run"),
        }
    )
    cfg["algorithm"].update({"minibatch_size": 4, "n_epochs": 1})
    if rl == "nlpo":
        cfg["algorithm"]["nlpo"] = {"top_mask": 0.9, "min_tokens_to_keep": 10, "mask_update_interval": 1}
    for m in cfg["eval"]["metrics"]:
        if m["id"] in ("perplexity", "generation_perplexity"):  # not SmolLM2: the builtin tiny LM here
            m["args"] = {k: v for k, v in m.get("args", {}).items() if k not in ("model", "gguf_file")}
    cfg["model"]["mixed_precision"] = "no"  # fp32: the outcome must not depend on the CPU's bf16 kernels
    cfg["supervised"].update({"epochs": 1, "batch_size": 4, "max_steps": 1, "max_target_length": 12})
    return cfg


def _canonical(metric_id: str) -> object:
    return metrics.get(metric_id)  # aliases (bert_score -> bertscore) register the same class


@pytest.mark.parametrize("task", list(TASKS))
def test_task_runs_end_to_end(task, tmp_path):
    raw = tiny(task, tmp_path)
    cfg = parse_config(raw)
    assert cfg.supervised.enabled and cfg.algorithm.id == TASKS[task][1]

    # The preset evaluates at least the metrics the task itself declares as its GRUE set.
    declared = {
        _canonical(m["id"]) for m in getattr(tasks.build(cfg.task.id, **cfg.task.args), "default_metrics", [])
    }
    assert declared <= {_canonical(m.id) for m in cfg.eval.metrics}

    summary = engine.train(cfg)
    assert summary["stopped"] is False
    assert summary["sft_steps"] >= 1 and summary["iterations"] == 1
    run_dir = Path(summary["run_dir"])
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    assert any(line.get("phase") == "sft" and "sft/loss" in line for line in lines)
    rl = [line for line in lines if "train/reward_mean" in line]
    assert len(rl) == 1 and math.isfinite(rl[0]["train/reward_mean"])
    final = summary["eval"]
    for m in cfg.eval.metrics:
        key = f"eval/{EXPECTED_KEY[m.id][0]}"
        assert key in final, (m.id, sorted(final))
        check_range(m.id, final[key])

    out = tmp_path / "results.json"
    result = engine.evaluate(
        cfg, split="test", model_path=summary["model_dir"], output=str(out), max_samples=4
    )
    saved = json.loads(out.read_text())
    assert saved["split"] == "test" and saved["n_samples"] == len(saved["samples"]) <= 4
    assert saved["metrics"] == pytest.approx(result["metrics"], nan_ok=True)
    for m in cfg.eval.metrics:
        check_range(m.id, saved["metrics"][EXPECTED_KEY[m.id][0]])
    assert math.isfinite(saved["metrics"]["reward_mean"])
    rows = saved["samples"]
    assert all({"prompt", "generation", "references", "reward"} <= set(row) for row in rows)
    assert all(math.isfinite(row["reward"]) for row in rows)
    # the reported mean reward is the mean of the per-sample rewards
    assert saved["metrics"]["reward_mean"] == pytest.approx(sum(r["reward"] for r in rows) / len(rows))


def test_quick_start_preset_through_the_cli(tmp_path):
    """The README quick start: `train --preset synthetic_ppo`, then `eval --run` writes a results file."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    run_dir = tmp_path / "quick"
    train = [
        sys.executable, "-m", "engine", "train", "--preset", "synthetic_ppo", "--quiet",
        "--set", "train.n_iters=2", "--set", "train.prompts_per_iter=8", "--set", "train.eval_every=0",
        "--set", "task.max_eval_samples=4", "--set", f"train.output_dir={run_dir}",
    ]  # fmt: skip
    done = subprocess.run(train, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["iterations"] == 2
    out = tmp_path / "results.json"
    ev = [
        sys.executable,
        "-m",
        "engine",
        "eval",
        "--run",
        str(run_dir),
        "--split",
        "test",
        "--output",
        str(out),
    ]
    done = subprocess.run(ev, cwd=root, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    saved = json.loads(out.read_text())
    assert saved["split"] == "test" and saved["n_samples"] == 4 == len(saved["samples"])
    assert {"reward_mean", "diversity_metrics/distinct-1"} <= set(saved["metrics"])
    assert saved["model"].endswith("model")


# Known values on each task's shipped fixture, without a model: the first reference of every test sample
# scored as the generation must get each reference-based metric's best value, and an empty generation its
# worst. (The end-to-end run above can only check ranges: what a random tiny model writes is noise.)
BEST_AND_WORST = {
    # key: (corpus value when generating a reference, corpus value when generating nothing)
    "lexical/bleu": (1.0, 0.0),
    "lexical/rouge_rouge1": (1.0, 0.0),
    "lexical/rouge_rougeL": (1.0, 0.0),
    "lexical/rouge_l_max": (1.0, 0.0),
    "lexical/sacrebleu": (1.0, 0.0),
    "lexical/chrf": (1.0, 0.0),
    "lexical/ter": (0.0, 1.0),
    "semantic/bert_score": (1.0, 0.0),
}


@pytest.mark.parametrize("task", [t for t in TASKS if t != "imdb"])  # IMDB's metrics read no references
def test_fixture_references_score_best_and_empty_generations_worst(task):
    from engine.data import load_task
    from engine.metrics import build_metrics, compute_all

    cfg = parse_config(tiny(task, Path("/nonexistent")))
    samples = load_task(cfg.task, "test")[:4]
    assert len(samples) == 4 and all(s.references for s in samples)
    model_free = [
        m for m in cfg.eval.metrics if m.id not in ("perplexity", "generation_perplexity", "intent_accuracy")
    ]
    built = build_metrics(model_free)
    prompts = [s.prompt for s in samples]
    refs = [s.references for s in samples]
    meta = [s.meta for s in samples]
    best, _ = compute_all(built, prompts, [r[0] for r in refs], refs, meta)
    worst, _ = compute_all(built, prompts, [""] * 4, refs, meta)
    checked = [k for k in BEST_AND_WORST if k in best]
    assert checked, sorted(best)
    for key in checked:
        hi, lo = BEST_AND_WORST[key]
        assert best[key] == pytest.approx(hi, abs=1e-4), (key, best[key])
        assert worst[key] == pytest.approx(lo, abs=1e-4), (key, worst[key])
    if "lexical/meteor" in best:  # 1 - 0.5 (chunks / matches)^3 for an exact match: one chunk
        assert 0.99 < best["lexical/meteor"] < 1.0 and worst["lexical/meteor"] == 0.0
    if "table_to_text/parent_overall_f_score" in best:  # ToTTo: F against several references and the table
        assert (
            best["table_to_text/parent_overall_f_score"] > 0.5
            and worst["table_to_text/parent_overall_f_score"] == 0.0
        )
