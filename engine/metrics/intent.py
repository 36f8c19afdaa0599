"""DailyDialog intent (dialogue-act) classifier and the intent-accuracy metric.

RL4LMs scores dialogue generations with a RoBERTa act classifier from the hub; that model is not
reachable offline, so the project trains its own: TF-IDF word n-grams + multinomial logistic
regression over the four DailyDialog acts (1 inform, 2 question, 3 directive, 4 commissive), on
"<previous utterance> || <utterance>" texts (RL4LMs's classifier input is the last history utterance
plus the generation, too). The saved model is plain JSON + a NumPy ``.npz`` (no pickle: loading a
model never executes code).

Train:  ``python -m engine.metrics.intent train --data <DailyDialog dir or .jsonl> --out DIR``
A model trained on the full DailyDialog train split ships in ``assets/intent_dailydialog/`` and is
the metric's default. The metric id ``intent_accuracy`` is registered in ``dialog.py`` (which imports
this module lazily), so ``python -m engine.metrics.intent`` does not import this file twice.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from engine import jsonl
from engine.metrics.base import Metric, MetricError, MetricResult, check_inputs

ACTS = {1: "inform", 2: "question", 3: "directive", 4: "commissive"}
EOU = "<EOU>"
SEP = " || "
DEFAULT_MODEL_DIR = Path(__file__).parent / "assets" / "intent_dailydialog"
TOKEN_PATTERN = r"(?u)\b\w+\b|[?!.,]"


def _clean(text: str) -> str:
    return text.replace(EOU, " ").strip()


def classifier_text(previous: str, utterance: str) -> str:
    return _clean(previous) + SEP + _clean(utterance)


def last_utterance(prompt: str, meta: dict[str, Any] | None = None) -> str:
    """The utterance the generation answers: ``meta["history"][-1]`` or the prompt's last ``<EOU>`` piece."""
    if meta and isinstance(meta.get("history"), list) and meta["history"]:
        return str(meta["history"][-1])
    parts = [p.strip() for p in prompt.split(EOU) if p.strip()]
    return parts[-1] if parts else ""


def dialogue_examples(rows: list[dict[str, Any]], where: str = "data") -> tuple[list[str], list[int]]:
    """(classifier texts, act labels) for every utterance of DailyDialog rows (``dialog``, ``act``)."""
    texts, labels = [], []
    for i, row in enumerate(rows):
        dialog, acts = row.get("dialog"), row.get("act")
        if isinstance(dialog, str):
            dialog = [u.strip() for u in dialog.split("__eou__") if u.strip()]
        if not isinstance(dialog, list) or not isinstance(acts, list):
            raise MetricError(
                f"{where}: row {i + 1}: needs 'dialog' (list of utterances) and 'act' (list of ints)"
            )
        prev = ""
        for utt, act in zip(dialog, acts):
            if int(act) not in ACTS:
                raise MetricError(f"{where}: row {i + 1}: act {act!r} is not one of {sorted(ACTS)}")
            texts.append(classifier_text(prev, utt))
            labels.append(int(act))
            prev = utt
    return texts, labels


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return jsonl.read_jsonl(path, error=MetricError, objects_only=False)


class IntentClassifier:
    """TF-IDF + logistic regression, stored as arrays so that loading is safe and fast."""

    def __init__(
        self,
        vocab: dict[str, int],
        idf: np.ndarray,
        coef: np.ndarray,
        intercept: np.ndarray,
        classes: list[int],
        config: dict[str, Any],
    ):
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.classes, self.config = classes, config
        self.coef, self.intercept = coef, intercept
        self.vectorizer = TfidfVectorizer(
            vocabulary=vocab,
            ngram_range=tuple(config["ngram_range"]),
            token_pattern=config["token_pattern"],
            lowercase=True,
            sublinear_tf=config["sublinear_tf"],
        )
        self.vectorizer.idf_ = idf

    @classmethod
    def train(
        cls,
        texts: list[str],
        labels: list[int],
        max_features: int = 30000,
        c: float = 4.0,
        ngram_max: int = 2,
    ) -> IntentClassifier:
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression

        config = {
            "ngram_range": [1, ngram_max],
            "token_pattern": TOKEN_PATTERN,
            "sublinear_tf": True,
            "max_features": max_features,
            "C": c,
        }
        vec = TfidfVectorizer(
            ngram_range=(1, ngram_max),
            token_pattern=TOKEN_PATTERN,
            lowercase=True,
            sublinear_tf=True,
            max_features=max_features,
            min_df=2,
        )
        x = vec.fit_transform(texts)
        from threadpoolctl import threadpool_limits

        lr = LogisticRegression(C=c, max_iter=2000)
        with threadpool_limits(1):  # BLAS threads make lbfgs on sparse features ~50x slower on busy cores
            lr.fit(x, labels)
        vocab = {t: int(i) for t, i in vec.vocabulary_.items()}
        return cls(
            vocab,
            vec.idf_.astype(np.float64),
            lr.coef_.astype(np.float32),
            lr.intercept_.astype(np.float32),
            [int(k) for k in lr.classes_],
            config,
        )

    def scores(self, texts: list[str]) -> np.ndarray:
        x = self.vectorizer.transform(texts)
        return np.asarray(x @ self.coef.T.astype(np.float64)) + self.intercept

    def predict(self, texts: list[str]) -> list[int]:
        if not texts:
            return []
        return [self.classes[i] for i in self.scores(texts).argmax(axis=1)]

    def save(self, out: Path, extra: dict[str, Any] | None = None) -> None:
        out.mkdir(parents=True, exist_ok=True)
        vocab = self.vectorizer.vocabulary
        (out / "vocab.json").write_text(
            json.dumps(vocab, ensure_ascii=False, sort_keys=True), encoding="utf-8"
        )
        np.savez_compressed(
            out / "weights.npz", idf=self.vectorizer.idf_, coef=self.coef, intercept=self.intercept
        )
        meta = {
            "format": "grue-intent-tfidf-lr/1",
            "classes": self.classes,
            "labels": {str(k): v for k, v in ACTS.items()},
            "config": self.config,
            **(extra or {}),
        }
        (out / "config.json").write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> IntentClassifier:
        p = Path(path)
        cfg_file = p / "config.json"
        if not cfg_file.is_file():
            raise MetricError(
                f"intent classifier: {cfg_file} not found; train one with "
                "`python -m engine.metrics.intent train --data <dailydialog dir> --out DIR`"
            )
        cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
        if cfg.get("format") != "grue-intent-tfidf-lr/1":
            raise MetricError(f"intent classifier: {cfg_file}: unknown format {cfg.get('format')!r}")
        vocab = json.loads((p / "vocab.json").read_text(encoding="utf-8"))
        with np.load(p / "weights.npz", allow_pickle=False) as w:
            return cls(
                vocab, w["idf"], w["coef"], w["intercept"], [int(c) for c in cfg["classes"]], cfg["config"]
            )


def _reference_intent(m: dict[str, Any], i: int) -> int | None:
    for key in ("intent", "act"):
        if key in m and m[key] is not None:
            v = m[key]
            v = v[0] if isinstance(v, list | tuple) and v else v
            try:
                v = int(v)
            except (TypeError, ValueError):
                raise MetricError(f"meta[{i}].{key}: expected an act id 1-4, got {m[key]!r}") from None
            if v not in ACTS:
                raise MetricError(f"meta[{i}].{key}: act {v} is not one of {sorted(ACTS)}")
            return v
    return None


class IntentAccuracy(Metric):
    """1 when the classifier's act for (last utterance, generation) equals the reference act, else 0.

    The reference act is ``meta["intent"]`` (RL4LMs: a one-element list) or ``meta["act"]``; when the
    meta has neither, the classifier's act for the first reference is used.
    """

    reward_key = "intent/accuracy"

    def __init__(self, model_dir: str | None = None):
        self.clf = IntentClassifier.load(model_dir or DEFAULT_MODEL_DIR)

    def scores(
        self,
        prompts: list[str],
        generations: list[str],
        references: list[list[str]],
        meta: list[dict[str, Any]] | None = None,
    ) -> list[float]:
        meta = meta if meta is not None else [{} for _ in generations]
        prev = [last_utterance(p, m) for p, m in zip(prompts, meta)]
        pred = self.clf.predict([classifier_text(a, g) for a, g in zip(prev, generations)])
        targets = [_reference_intent(m, i) for i, m in enumerate(meta)]
        missing = [i for i, t in enumerate(targets) if t is None]
        if missing:
            if any(not references[i] for i in missing):
                raise MetricError("intent_accuracy: a sample has neither meta 'intent' nor a reference")
            ref_pred = self.clf.predict([classifier_text(prev[i], references[i][0]) for i in missing])
            for i, t in zip(missing, ref_pred):
                targets[i] = t
        return [1.0 if p == t else 0.0 for p, t in zip(pred, targets)]

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta)
        per = self.scores(prompts, generations, references, meta)
        return {"intent/accuracy": (per, sum(per) / len(per) if per else math.nan)}


def _split_files(data: Path) -> tuple[Path, Path | None]:
    if data.is_dir():
        train = data / "train.jsonl"
        held = next((data / f for f in ("test.jsonl", "validation.jsonl") if (data / f).is_file()), None)
        if not train.is_file():
            raise MetricError(f"{data}: no train.jsonl")
        return train, held
    return data, None


def train_main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m engine.metrics.intent train",
        description="Train the DailyDialog act classifier used by intent_accuracy.",
    )
    ap.add_argument(
        "--data", required=True, help="DailyDialog folder (train.jsonl, test.jsonl) or a train .jsonl"
    )
    ap.add_argument("--eval", help="held-out .jsonl (default: <data>/test.jsonl or validation.jsonl)")
    ap.add_argument("--out", required=True, help="output folder")
    ap.add_argument("--max-features", type=int, default=30000)
    ap.add_argument("--C", type=float, default=4.0)
    args = ap.parse_args(argv)
    train_file, held = _split_files(Path(args.data))
    held = Path(args.eval) if args.eval else held
    t0 = time.time()
    texts, labels = dialogue_examples(read_jsonl(train_file), str(train_file))
    print(f"[intent] {len(texts)} training utterances from {train_file}", flush=True)
    clf = IntentClassifier.train(texts, labels, max_features=args.max_features, c=args.C)
    report: dict[str, Any] = {
        "train_file": str(train_file),
        "train_utterances": len(texts),
        "train_seconds": round(time.time() - t0, 1),
    }
    if held is not None:
        ht, hl = dialogue_examples(read_jsonl(held), str(held))
        pred = clf.predict(ht)
        acc = sum(p == y for p, y in zip(pred, hl)) / len(hl)
        majority = Counter(labels).most_common(1)[0][0]
        base = sum(y == majority for y in hl) / len(hl)
        report.update(
            {
                "eval_file": str(held),
                "eval_utterances": len(hl),
                "eval_accuracy": round(acc, 4),
                "majority_baseline": round(base, 4),
            }
        )
        print(
            f"[intent] held-out accuracy {acc:.4f} (majority class {base:.4f}) on {len(hl)} utterances",
            flush=True,
        )
    clf.save(Path(args.out), {"training": report})
    print(f"[intent] saved to {args.out} in {time.time() - t0:.1f}s", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] != "train":
        print("usage: python -m engine.metrics.intent train --data DIR --out DIR", file=sys.stderr)
        return 2
    try:
        return train_main(argv[1:])
    except MetricError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
