"""BERTScore (Zhang et al., ICLR 2020), implemented here with a local HF encoder.

Each text is encoded; the hidden states of one layer give contextual token embeddings, which are
L2-normalised. With cosine matrix S (candidate tokens x reference tokens):

    P = sum_i w(c_i) max_j S_ij / sum_i w(c_i)      R = sum_j w(r_j) max_i S_ij / sum_j w(r_j)
    F = 2 P R / (P + R)

w = 1, or the IDF of the token over the references when ``idf=True``
(``log((M + 1) / (df + 1))`` with M references, as in the paper's code). Special tokens ([CLS],
[SEP]) weigh 0 but can be matched (``special_tokens="match"``, what the ``bert_score`` package does;
``"drop"`` removes them). With several references P, R and F are each the best over the references,
as the ``bert_score`` package reports them (tests/engine/test_metric_parity.py). No baseline
rescaling (that needs per-model baseline files that ship with the bert_score package).
"""

from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Any

from engine.assets import MissingAssetError
from engine.assets import minilm_dir as _minilm_dir
from engine.metrics.base import (
    Metric,
    MetricError,
    MetricResult,
    cached_load,
    check_inputs,
    mean,
    resolve_device,
    resolve_model_path,
)
from engine.registry import metrics

DEFAULT_MODEL = "builtin:minilm"
# MiniLM's 4th of 6 layers: on CommonGen it ranks human > concept list > mismatched reference, the last
# layer ranks the concept list above the human sentence (docs/metrics.md).
MINILM_LAYER = 4


def minilm_dir() -> Path:
    """The offline MiniLM encoder; a missing wheel is a MetricError (the metric's error type)."""

    try:
        return _minilm_dir()
    except MissingAssetError as exc:
        raise MetricError(f"BERTScore's offline default encoder: {exc}; or pass model=<HF encoder>") from None


def greedy_match(cand: Any, ref: Any, cand_w: Any = None, ref_w: Any = None) -> tuple[float, float, float]:
    """P, R, F of greedy cosine matching between two sets of token vectors (rows)."""
    import torch

    cand = torch.nn.functional.normalize(torch.as_tensor(cand, dtype=torch.float32), dim=-1)
    ref = torch.nn.functional.normalize(torch.as_tensor(ref, dtype=torch.float32), dim=-1)
    if cand.shape[0] == 0 or ref.shape[0] == 0:
        return 0.0, 0.0, 0.0
    sim = cand @ ref.T
    cw = torch.ones(cand.shape[0]) if cand_w is None else torch.as_tensor(cand_w, dtype=torch.float32)
    rw = torch.ones(ref.shape[0]) if ref_w is None else torch.as_tensor(ref_w, dtype=torch.float32)
    p = float((sim.max(dim=1).values * cw).sum() / cw.sum()) if float(cw.sum()) > 0 else 0.0
    r = float((sim.max(dim=0).values * rw).sum() / rw.sum()) if float(rw.sum()) > 0 else 0.0
    f = 2 * p * r / (p + r) if p + r > 0 else 0.0
    return p, r, f


@metrics.register("bertscore", "BERTScore P/R/F1: greedy cosine matching of contextual embeddings")
class BertScore(Metric):
    """BERTScore with any HF encoder; the default is the MiniLM shipped in a wheel (works offline).

    ``layer`` indexes ``hidden_states`` (0 = embeddings; default: 4 for the offline MiniLM, else the last).
    """

    reward_key = "semantic/bert_score"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        layer: int | None = None,
        idf: bool = False,
        batch_size: int = 32,
        max_length: int = 512,
        special_tokens: str = "match",
        device: str = "auto",
        language: str | None = None,
    ):
        import torch
        from transformers import AutoModel, AutoTokenizer

        # ``language`` is accepted for RL4LMs configs; the encoder is chosen by ``model`` alone.
        device = resolve_device(device)
        path = str(minilm_dir()) if model == DEFAULT_MODEL else resolve_model_path(model)
        try:
            self.tokenizer = cached_load(("tok", path), lambda: AutoTokenizer.from_pretrained(path))
            self.model = cached_load(
                ("encoder", path, device), lambda: AutoModel.from_pretrained(path).to(device).eval()
            )
        except OSError as exc:
            raise MetricError(f"bertscore: cannot load encoder {model!r}: {exc}") from exc
        n_layers = int(getattr(self.model.config, "num_hidden_layers", 0))
        default_layer = MINILM_LAYER if model == DEFAULT_MODEL else n_layers
        self.layer = default_layer if layer is None else int(layer)
        if not -n_layers - 1 <= self.layer <= n_layers:
            raise MetricError(f"bertscore: layer {layer} out of range 0..{n_layers} for {model!r}")
        if special_tokens not in ("match", "drop"):
            raise MetricError(f"bertscore: special_tokens must be 'match' or 'drop', got {special_tokens!r}")
        self.special_tokens = special_tokens
        self.idf, self.batch_size, self.device = idf, batch_size, device
        self.max_length = min(
            max_length, int(getattr(self.tokenizer, "model_max_length", max_length) or max_length)
        )
        self._torch = torch

    def embed(self, texts: list[str]) -> list[tuple[Any, list[int]]]:
        """Per text: (token vectors, their token ids); special tokens dropped unless ``special_tokens="match"``."""
        torch = self._torch
        out = []
        special = set(self.tokenizer.all_special_ids)
        for i in range(0, len(texts), self.batch_size):
            batch = [t.strip() for t in texts[i : i + self.batch_size]]
            enc = self.tokenizer(
                batch, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
            ).to(self.device)
            with torch.no_grad():
                hs = self.model(**enc, output_hidden_states=True).hidden_states[self.layer]
            for j in range(len(batch)):
                ids = enc["input_ids"][j].tolist()
                keep = [
                    k
                    for k, t in enumerate(ids)
                    if enc["attention_mask"][j][k] and (self.special_tokens == "match" or t not in special)
                ]
                out.append((hs[j, keep].float().cpu(), [ids[k] for k in keep]))
        return out

    def _idf_weights(self, references: list[list[str]]) -> dict[int, float]:
        flat = [r for refs in references for r in refs]
        df: Counter = Counter()
        for r in flat:
            df.update(set(self.tokenizer(r, add_special_tokens=False)["input_ids"]))
        m = len(flat)
        return {t: math.log((m + 1) / (c + 1)) for t, c in df.items()} | {-1: math.log(m + 1)}

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta, need_references=True)
        flat_refs = [r for refs in references for r in refs]
        embs = self.embed(list(generations) + flat_refs)
        gen_embs, ref_embs = embs[: len(generations)], embs[len(generations) :]
        idf = self._idf_weights(references) if self.idf else None

        special = set(self.tokenizer.all_special_ids)

        def weights(ids: list[int]) -> list[float]:
            # special tokens ([CLS], [SEP]) weigh 0 but, with special_tokens="match", can still be matched
            return [0.0 if t in special else (1.0 if idf is None else idf.get(t, idf[-1])) for t in ids]

        ps, rs, fs = [], [], []
        k = 0
        for (g_vec, g_ids), refs in zip(gen_embs, references):
            # Several references: the best P, R and F, each over the references (the bert_score
            # package's rule; P and R may come from different references than F).
            best = (0.0, 0.0, -math.inf)
            for _ in refs:
                r_vec, r_ids = ref_embs[k]
                k += 1
                prf = greedy_match(g_vec, r_vec, weights(g_ids), weights(r_ids))
                best = (max(best[0], prf[0]), max(best[1], prf[1]), max(best[2], prf[2]))
            ps.append(best[0])
            rs.append(best[1])
            fs.append(best[2] if refs else 0.0)
        return {
            "semantic/bert_score": (fs, mean(fs)),
            "semantic/bert_score_precision": (ps, mean(ps)),
            "semantic/bert_score_recall": (rs, mean(rs)),
        }


metrics.add("bert_score", BertScore, "alias of bertscore (RL4LMs id)")
