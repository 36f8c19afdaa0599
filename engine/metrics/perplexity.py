"""Two perplexities, under two explicit ids, because they answer different questions.

``perplexity`` (and RL4LMs's id ``causal_perplexity``) is **the paper's metric**: the *policy's*
perplexity on the task's *reference* texts (RL4LMs ``Perplexity``): the references are joined with
blank lines and scored by the evaluated model with a sliding window of ``stride`` tokens. It rises when
RL degrades the language model, which is what the GRUE tables report. The evaluated model is handed
over by the evaluation (``bind_policy``); used on its own, ``model`` names a fixed model instead.
Corpus value only (RL4LMs has no per-sample value). RL4LMs supports causal models only; for an
encoder-decoder policy each reference is scored given its prompt (an extension, stated in docs/metrics.md).

``generation_perplexity`` is the fluency of the *generations* under a fixed reference causal LM.
Each generation is scored after the model's BOS token (GPT-2: its ``<|endoftext|>``), optionally after
its prompt (``condition_on_prompt``): only generation tokens count.

* per sample: ``exp(mean NLL of the generation's tokens)``;
* corpus: ``exp(total NLL / total generation tokens)`` (token-weighted, like the usual corpus perplexity).
An empty generation is scored as the model ending at once: the NLL of its EOS token (so that every
sample has a finite value; NaN would break JSON consumers of per-sample rows).
"""

from __future__ import annotations

import inspect
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


@metrics.register(
    "generation_perplexity", "perplexity of the generations under a fixed reference causal LM (fluency)"
)
class Perplexity(Metric):
    """``model``: HF causal LM directory or hub name, or a builtin tiny model (``builtin:tiny-gpt2``)."""

    reward_key = "fluency_metrics/generation_perplexity"

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
        return {"fluency_metrics/generation_perplexity": (per, corpus)}


@metrics.register(
    "perplexity", "RL4LMs's (the paper's) perplexity: the evaluated policy's perplexity on the references"
)
class PolicyPerplexity(Metric):
    """``stride``: sliding-window step in tokens (RL4LMs's configs: 512); ``max_length``: window size
    (default: the model's context, at most 1024); ``model``: a fixed model to score instead of the
    evaluated policy (only used when no policy is bound, e.g. from Python or as a check)."""

    key = "fluency_metrics/perplexity"

    def __init__(
        self,
        stride: int = 512,
        max_length: int | None = None,
        model: str | None = None,
        tokenizer: str | None = None,
        gguf_file: str | None = None,
        device: str = "auto",
    ):
        if int(stride) < 1:
            raise MetricError(f"perplexity: stride must be >= 1, got {stride}")
        self.stride = int(stride)
        self.max_length = max_length
        self.model_name, self.tokenizer_name, self.gguf_file = model, tokenizer, gguf_file
        self.device = resolve_device(device)
        self._bound: tuple[Any, bool, Any, Any] | None = None

    def bind_policy(self, lm: Any, is_seq2seq: bool, tokenizer: Any, device: Any) -> None:
        """Score this model (the evaluated policy) on the references."""
        self._bound = (lm, is_seq2seq, tokenizer, device)

    def _model(self) -> tuple[Any, bool, Any, Any]:
        if self._bound is not None:
            return self._bound
        if not self.model_name:
            raise MetricError(
                "perplexity (RL4LMs's) scores the evaluated policy on the references: it runs inside an "
                "evaluation (training or `python -m engine eval`); on its own give args.model, or use "
                "generation_perplexity for the fluency of generations under a fixed LM"
            )
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = resolve_model_path(self.model_name)
        kw: dict[str, Any] = {"gguf_file": self.gguf_file} if self.gguf_file else {}
        tok_path = resolve_model_path(self.tokenizer_name) if self.tokenizer_name else path
        try:
            tok = cached_load(
                ("tok", tok_path, self.gguf_file), lambda: AutoTokenizer.from_pretrained(tok_path, **kw)
            )
            lm = cached_load(
                ("causal", path, self.gguf_file, self.device),
                lambda: (
                    AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **kw)
                    .to(self.device)
                    .eval()
                ),
            )
        except OSError as exc:
            raise MetricError(f"perplexity: cannot load causal LM {self.model_name!r}: {exc}") from exc
        return lm, False, tok, self.device

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        check_inputs(prompts, generations, references, meta)
        lm, is_seq2seq, tok, device = self._model()
        was_training = lm.training
        lm.eval()
        try:
            if is_seq2seq:
                value = self._seq2seq(lm, tok, device, list(prompts), [list(r) for r in references])
            else:
                value = self._causal(lm, tok, device, [r for refs in references for r in refs])
        finally:
            lm.train(was_training)
        return {self.key: (None, value)}

    def _causal(self, lm: Any, tok: Any, device: Any, texts: list[str]) -> float:
        """RL4LMs's sliding window over the joined references: exp(sum of window NLLs / tokens)."""
        import torch

        if not texts:
            return math.nan
        ids = tok("\n\n".join(texts), return_tensors="pt")["input_ids"]
        n = ids.shape[1]
        cfg = lm.config
        limit = getattr(cfg, "n_positions", None) or getattr(cfg, "max_position_embeddings", None) or 1024
        window = int(self.max_length or min(int(limit), 1024))
        # Only the scored positions need logits: with RL4LMs's stride of half the window that halves the
        # LM head's work and, with logsumexp in place of a full log-softmax, drops a window x vocabulary
        # tensor (200 MB for SmolLM2's 49k tokens); 10-20 % faster on SmolLM2 (docs/benchmarks.md).
        trims = "logits_to_keep" in inspect.signature(lm.forward).parameters
        total, end = 0.0, 0
        with torch.no_grad():
            for i in range(0, n, self.stride):
                begin = max(i + self.stride - window, 0)
                end = min(i + self.stride, n)
                trg_len = end - i  # may be shorter than the stride on the last window
                x = ids[:, begin:end].to(device)
                k = min(trg_len, x.shape[1] - 1)  # tokens scored: the first token has no context
                if k < 1:
                    continue
                kw = {"logits_to_keep": k + 1} if trims else {}
                logits = lm(input_ids=x, **kw).logits[0, -(k + 1) : -1].float()
                target = x[0, -k:, None]
                nll = torch.logsumexp(logits, dim=-1) - logits.gather(-1, target).squeeze(-1)
                # RL4LMs multiplies the window's mean NLL by trg_len (HF's recipe): kept as is.
                total += float(nll.mean()) * trg_len
        return math.exp(total / end) if end else math.nan

    def _seq2seq(self, lm: Any, tok: Any, device: Any, prompts: list[str], refs: list[list[str]]) -> float:
        """Encoder-decoder policy: NLL of each reference given its prompt, token-weighted."""
        import torch

        total, count = 0.0, 0
        with torch.no_grad():
            for prompt, rs in zip(prompts, refs):
                for ref in rs:
                    enc = tok([prompt], return_tensors="pt", truncation=True)
                    labels = tok([ref], return_tensors="pt", truncation=True)["input_ids"].to(device)
                    out = lm(
                        input_ids=enc["input_ids"].to(device),
                        attention_mask=enc["attention_mask"].to(device),
                        labels=labels,
                    )
                    total += float(out.loss) * labels.shape[1]
                    count += labels.shape[1]
        return math.exp(total / count) if count else math.nan


metrics.add("causal_perplexity", PolicyPerplexity, "RL4LMs's id of perplexity (the policy on the references)")
