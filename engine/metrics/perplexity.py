"""Perplexity of the generations under a fixed reference causal LM (fluency).

RL4LMs computes this metric on the *references* (so it never changes with the policy, a bug); here
the generated texts are scored. Each generation is scored after the model's BOS token (GPT-2: its
``<|endoftext|>``), optionally after its prompt (``condition_on_prompt``): only generation tokens count.

* per sample: ``exp(mean NLL of the generation's tokens)``;
* corpus: ``exp(total NLL / total generation tokens)`` (token-weighted, like the usual corpus perplexity).
An empty generation is scored as the model ending at once: the NLL of its EOS token (so that every
sample has a finite value; NaN would break JSON consumers of per-sample rows).
"""

from __future__ import annotations

import math
from typing import Any

from engine.metrics.base import (
    Metric,
    MetricError,
    MetricResult,
    cached_load,
    check_inputs,
    resolve_device,
    resolve_model_path,
)
from engine.registry import metrics

DEFAULT_MODEL = "builtin:tiny-gpt2"


@metrics.register("perplexity", "perplexity of the generations under a fixed reference causal LM")
class Perplexity(Metric):
    """``model``: HF causal LM directory or hub name, or a builtin tiny model (``builtin:tiny-gpt2``)."""

    reward_key = "fluency_metrics/perplexity"

    def __init__(
        self,
        model: str = DEFAULT_MODEL,
        tokenizer: str | None = None,
        condition_on_prompt: bool = False,
        batch_size: int = 8,
        max_length: int = 512,
        device: str = "auto",
        gguf_file: str | None = None,
    ):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = resolve_device(device)
        path = resolve_model_path(model)
        kw: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
        try:
            tok_path = resolve_model_path(tokenizer) if tokenizer else path
            self.tokenizer = cached_load(
                ("tok", tok_path, gguf_file), lambda: AutoTokenizer.from_pretrained(tok_path, **kw)
            )
            self.model = cached_load(
                ("causal", path, gguf_file, device),
                lambda: (
                    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw).to(device).eval()
                ),
            )
        except OSError as exc:
            raise MetricError(f"perplexity: cannot load causal LM {model!r}: {exc}") from exc
        bos = self.tokenizer.bos_token_id
        if bos is None:
            bos = self.tokenizer.eos_token_id
        if bos is None:
            raise MetricError(f"perplexity: tokenizer of {model!r} has neither a BOS nor an EOS token")
        self.bos = int(bos)
        eos = self.tokenizer.eos_token_id
        self.eos = int(eos if eos is not None else bos)
        self.condition_on_prompt = condition_on_prompt
        cfg = self.model.config
        limit = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None)
        self.max_length = min(max_length, int(limit)) if limit else max_length  # longer texts keep their end
        self.batch_size, self.device = batch_size, device

    def token_nlls(self, prompts: list[str], generations: list[str]) -> list[list[float]]:
        """Negative log-likelihood of every generation token (natural log)."""
        import torch

        seqs: list[tuple[list[int], int]] = []
        for p, g in zip(prompts, generations):
            ctx = [self.bos] + (
                self.tokenizer(p, add_special_tokens=False)["input_ids"] if self.condition_on_prompt else []
            )
            gen = self.tokenizer(g, add_special_tokens=False)["input_ids"] or [self.eos]
            ids = (ctx + gen)[-self.max_length :]
            seqs.append((ids, min(len(gen), len(ids) - 1)))
        out: list[list[float]] = []
        for i in range(0, len(seqs), self.batch_size):
            batch = seqs[i : i + self.batch_size]
            width = max(len(s) for s, _ in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros(len(batch), width, dtype=torch.long)
            for j, (s, _) in enumerate(batch):
                ids[j, : len(s)] = torch.tensor(s)
                mask[j, : len(s)] = 1
            with torch.no_grad():
                logits = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device)).logits
            logp = torch.log_softmax(logits.float(), dim=-1)
            for j, (s, n_gen) in enumerate(batch):
                nll = []
                for pos in range(len(s) - n_gen, len(s)):
                    nll.append(-float(logp[j, pos - 1, s[pos]]))
                out.append(nll)
        return out

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta)
        nlls = self.token_nlls(list(prompts), list(generations))
        per = [
            math.exp(sum(n) / len(n)) if n else math.nan for n in nlls
        ]  # n is empty only if truncated away
        total = sum(len(n) for n in nlls)
        corpus = math.exp(sum(sum(n) for n in nlls) / total) if total else math.nan
        return {"fluency_metrics/perplexity": (per, corpus)}


metrics.add("causal_perplexity", Perplexity, "alias of perplexity (RL4LMs id), scoring generations")
