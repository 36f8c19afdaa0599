"""Train the shipped IMDB sentiment model (``engine/rewards/assets/imdb_tfidf_lr.json.gz``).

Why a script: the study's reward must be reproducible from the public data set, not a binary of
unknown origin. Given the IMDB train and test JSONL (``text``, ``label`` 1 = positive), it builds the
vocabulary from the train split (uni- and bigrams with document frequency >= ``--min-df``, the
``--max-features`` most frequent), fits an L2 logistic regression (scikit-learn's lbfgs, ``C``) on the
TF-IDF features of ``engine.rewards.tfidf_sentiment``, reports train and test accuracy and writes the
weights as gzipped JSON (no pickle).

    python -m engine.tools.train_tfidf_sentiment --train ../shared/datasets/imdb/train.jsonl \
        --test ../shared/datasets/imdb/test.jsonl --out engine/rewards/assets/imdb_tfidf_lr.json.gz

scikit-learn is used for the fit only; scoring needs nothing but the standard library.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import math
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from engine.data.sources import read_records
from engine.rewards.tfidf_sentiment import FORMAT, TfidfLogReg, tokens


def _rows(path: str) -> tuple[list[str], list[int]]:
    rows = [r for r in read_records(path, "train_tfidf_sentiment") if "text" in r and "label" in r]
    return [str(r["text"]) for r in rows], [int(r["label"]) for r in rows]


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def train(
    train_texts: list[str], train_labels: list[int], min_df: int, max_features: int, c: float
) -> dict[str, Any]:
    """Vocabulary, idf and a fitted logistic regression, as the shipped file's fields."""
    import numpy as np
    from scipy.sparse import csr_matrix
    from sklearn.linear_model import LogisticRegression

    docs = [tokens(t) for t in train_texts]
    df = Counter(t for d in docs for t in set(d))
    kept = sorted((t for t, n in df.items() if n >= min_df), key=lambda t: (-df[t], t))[:max_features]
    vocab = sorted(kept)
    n = len(docs)
    idf = [math.log((1 + n) / (1 + df[t])) + 1.0 for t in vocab]
    model = TfidfLogReg(vocab, idf, [0.0] * len(vocab), 0.0)
    rows, cols, vals = [], [], []
    for r, text in enumerate(train_texts):
        for i, v in model.features(text).items():
            rows.append(r)
            cols.append(i)
            vals.append(v)
    x = csr_matrix((vals, (rows, cols)), shape=(n, len(vocab)), dtype=np.float64)
    clf = LogisticRegression(C=c, max_iter=2000)
    clf.fit(x, np.asarray(train_labels))
    return {
        "vocab": vocab,
        "idf": [round(v, 6) for v in idf],
        "coef": [round(float(v), 6) for v in clf.coef_[0]],
        "intercept": round(float(clf.intercept_[0]), 6),
    }


def accuracy(model: TfidfLogReg, texts: list[str], labels: list[int]) -> float:
    probs = model.prob_positive(texts)
    return sum((p >= 0.5) == bool(y) for p, y in zip(probs, labels)) / max(1, len(labels))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--train", required=True, help="IMDB train JSONL (text, label)")
    ap.add_argument("--test", required=True, help="IMDB test JSONL, for the reported accuracy")
    ap.add_argument("--out", required=True)
    ap.add_argument("--min-df", type=int, default=3)
    ap.add_argument("--max-features", type=int, default=50_000)
    ap.add_argument("-C", type=float, default=4.0, dest="c", help="inverse L2 strength")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    tr_x, tr_y = _rows(args.train)
    te_x, te_y = _rows(args.test)
    fit = train(tr_x, tr_y, args.min_df, args.max_features, args.c)
    model = TfidfLogReg(fit["vocab"], fit["idf"], fit["coef"], fit["intercept"])
    meta = {
        "train_file_sha256": _sha256(args.train),
        "test_file_sha256": _sha256(args.test),
        "n_train": len(tr_y),
        "n_test": len(te_y),
        "min_df": args.min_df,
        "max_features": args.max_features,
        "C": args.c,
        "train_accuracy": round(accuracy(model, tr_x, tr_y), 4),
        "test_accuracy": round(accuracy(model, te_x, te_y), 4),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(out, "wt", encoding="utf-8", compresslevel=9) as fh:
        json.dump({"format": FORMAT, "meta": meta, **fit}, fh, separators=(",", ":"))
    print(json.dumps(meta, indent=2), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
