"""GRUE's task rewards under RL4LMs's reward ids (``reward.py`` of allenai/RL4LMs), batched.

- ``common_gen_repeat_penalty``: −1 when a generation merely repeats the prompt's concept list
  (``"drill field run team"``) or echoes the instruction (``"generate a sentence with: "``, "generate",
  "sentence"), else 0 — RL4LMs's shaping term for CommonGen.
- ``meteor`` (optionally ``shaping_fn``), ``rouge`` (``rouge_type``), ``rouge_combined``, ``rouge_l_max``,
  ``bleu``, ``sacre_bleu``, ``chrf``, ``bert_score``, ``parent``, ``cider``: the metric's per-sample score.
- ``ter``: 1 − TER (translation).
- ``intent_accuracy``: ``intent_coeff`` × intent match + ``auto_coeff`` × METEOR (DailyDialog). RL4LMs
  computed the METEOR term as a running corpus score over the batch; here it is each sample's own METEOR.
"""

from __future__ import annotations

from typing import Any

from engine.registry import rewards
from engine.rewards.metric_based import MetricReward

COMMONGEN_PREFIX = "generate a sentence with: "


class CommonGenRepeatPenalty:
    """−1 for a generation that copies the concept list or the instruction words, else 0."""

    def __init__(self, prefix: str = COMMONGEN_PREFIX, penalty: float = -1.0):
        self.prefix = prefix
        self.penalty = float(penalty)

    def concept_string(self, prompt: str, meta: dict[str, Any]) -> str:
        if self.prefix and self.prefix in prompt:
            return prompt.split(self.prefix, 1)[1][:-1]  # drop the concept end token, as RL4LMs
        concepts = meta.get("concepts") if isinstance(meta, dict) else None
        return " ".join(concepts) if concepts else prompt[:-1]

    def __call__(self, prompts, generations, references=None, meta=None) -> list[float]:
        meta = meta or [{} for _ in generations]
        out = []
        for prompt, gen, m in zip(prompts, generations, meta):
            g = gen.lower()
            concepts = self.concept_string(prompt, m).lower()
            hit = (
                (concepts and concepts in g)
                or (self.prefix and self.prefix.lower() in g)
                or "generate" in g
                or "sentence" in g
            )
            out.append(self.penalty if hit else 0.0)
        return out


rewards.register("common_gen_repeat_penalty")(CommonGenRepeatPenalty)
rewards.add(
    "common_gen_repeat_penalty_batched",
    CommonGenRepeatPenalty,
    "RL4LMs id: alias of common_gen_repeat_penalty",
)


class ShapedMetricReward(MetricReward):
    """A metric reward plus an optional shaping reward given by id (RL4LMs's ``shaping_fn``)."""

    def __init__(self, metric_id: str, shaping_fn: str | None = None, **kw: Any):
        super().__init__(metric_id, **kw)
        self.shaping = rewards.build(shaping_fn) if shaping_fn else None

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        base = super().__call__(prompts, generations, references, meta)
        if self.shaping is None:
            return base
        extra = self.shaping(prompts, generations, references, meta)
        return [b + float(e) for b, e in zip(base, extra)]


@rewards.register("meteor")
def meteor_reward(shaping_fn: str | None = None, **metric_args: Any) -> ShapedMetricReward:
    """METEOR per sample (+ ``shaping_fn``, e.g. common_gen_repeat_penalty for CommonGen)."""
    return ShapedMetricReward("meteor", shaping_fn=shaping_fn, metric_args=metric_args)


@rewards.register("rouge")
def rouge_reward(
    rouge_type: str = "rouge1", shaping_fn: str | None = None, use_single_ref: bool = True
) -> Any:
    """ROUGE-``rouge_type`` F-measure per sample (first reference only unless use_single_ref is False)."""
    return ShapedMetricReward(
        "rouge",
        shaping_fn=shaping_fn,
        key=f"lexical/rouge_{rouge_type}",
        metric_args={"rouge_types": [rouge_type], "use_single_ref": use_single_ref},
    )


class RougeCombined(ShapedMetricReward):
    """Mean of ROUGE-1, ROUGE-2 and ROUGE-L F-measures."""

    def __init__(self, shaping_fn: str | None = None):
        super().__init__(
            "rouge", shaping_fn=shaping_fn, key="lexical/rouge_rouge1",
            metric_args={"rouge_types": ["rouge1", "rouge2", "rougeL"]},
        )  # fmt: skip

    def raw(self, prompts, generations, references, meta) -> list[float]:
        res = self.metric.compute(list(prompts), list(generations), [list(r) for r in references], list(meta))
        keys = ("lexical/rouge_rouge1", "lexical/rouge_rouge2", "lexical/rouge_rougeL")
        return [sum(vals) / 3 for vals in zip(*(res[k][0] for k in keys))]


rewards.register("rouge_combined")(RougeCombined)


# py-rouge options RL4LMs passes to its ROUGE-L-max reward; rouge-score has no equivalent for them.
PYROUGE_ONLY_ARGS = {
    "max_n",
    "limit_length",
    "length_limit",
    "length_limit_type",
    "apply_avg",
    "apply_best",
    "alpha",
    "weight_factor",
}


@rewards.register("rouge_l_max")
def rouge_l_max_reward(stemming: bool = True, **rl4lms_args: Any) -> MetricReward:
    """ROUGE-L F max over references (NarrativeQA); RL4LMs's py-rouge-only options are accepted and ignored."""
    unknown = set(rl4lms_args) - PYROUGE_ONLY_ARGS
    if unknown:
        raise TypeError(f"unexpected arguments {sorted(unknown)}")
    return MetricReward("rouge_l_max", metric_args={"use_stemmer": stemming})


@rewards.register("ter")
def ter_reward(**metric_args: Any) -> MetricReward:
    """1 − TER per sample (translation); TER above 1 gives a negative reward, as in RL4LMs."""
    return MetricReward("ter", metric_args=metric_args, scale=-1.0, shift=1.0)


def _simple(metric_id: str, doc: str):
    def factory(**metric_args: Any) -> MetricReward:
        return MetricReward(metric_id, metric_args=metric_args)

    factory.__doc__ = doc
    return factory


for _rid, _mid, _doc in (
    ("bleu", "bleu", "Sentence BLEU per sample (smoothed)"),
    ("sacre_bleu", "sacrebleu", "SacreBLEU per sample / 100"),
    ("chrf", "chrf", "chrF per sample / 100"),
    ("bert_score", "bertscore", "BERTScore F1 per sample"),
    ("parent", "parent", "PARENT F-score per sample (ToTTo; needs meta raw_table)"),
    ("cider", "cider", "CIDEr-D per sample"),
):
    rewards.add(_rid, _simple(_mid, _doc), _doc)


class IntentAccuracyReward:
    """``intent_coeff`` × (predicted dialogue act == meta intent) + ``auto_coeff`` × METEOR (DailyDialog)."""

    def __init__(
        self,
        intent_coeff: float = 1.0,
        auto_coeff: float = 1.0,
        shape: bool = True,
        intent_args: dict[str, Any] | None = None,
    ):
        self.intent_coeff, self.auto_coeff = float(intent_coeff), float(auto_coeff)
        self.intent = MetricReward("intent_accuracy", metric_args=intent_args or {})
        self.meteor = MetricReward("meteor") if shape and self.auto_coeff else None

    def __call__(self, prompts, generations, references, meta) -> list[float]:
        intent = self.intent(prompts, generations, references, meta)
        out = [self.intent_coeff * v for v in intent]
        if self.meteor is not None:
            auto = self.meteor(prompts, generations, references, meta)
            out = [o + self.auto_coeff * a for o, a in zip(out, auto)]
        return out


rewards.register("intent_accuracy")(IntentAccuracyReward)
