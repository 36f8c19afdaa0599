"""PARENT (Dhingra et al., ACL 2019): table-aware precision and recall for data-to-text.

Implemented from the paper's definition, "PARENT-W" variant with the word-overlap entailment model,
which is what ToTTo reports:

* Entailment probability of an n-gram g by the table T: ``w(g) = |{t in g : t in values(T)}| / |g|``.
* Entailed precision of order n:
  ``P_n = sum_g c(g) [p(g in R) + (1 - p(g in R)) w(g)] / sum_g c(g)`` over candidate n-grams, where
  ``p(g in R) = min(1, count_R(g) / count_G(g))``.
* Entailed recall against the reference, of order n:
  ``R_n = sum_g c_R(g) w(g) min(1, count_G(g) / c_R(g)) / sum_g c_R(g) w(g)`` (1 when the denominator is 0).
* Recall against the table: mean over the recall table's entries of ``LCS(value, generation) / |value|``.
* P = geometric mean of P_1..P_4, R_ref likewise (orders 2..4 that are 0 become 1e-5, as the
  reference implementation smooths); R = R_ref^(1-lambda) * R_table^lambda; F = 2PR / (P + R).
  ``lambda_weight=None`` (default, as ToTTo's ``totto_parent_eval.py``) uses the paper's per-example
  ``lambda = 1 - (mean mention probability of the recall table's entries in the reference)``;
  a number fixes lambda (0.5 is the original ``table_text_eval.py`` default).
* Several references: the one with the best F counts. Corpus values are means over samples, in [0, 1]
  (ToTTo's script prints them x100).

Tables come from ``meta``: either ``meta["table"]`` = list of ``[attribute, value]`` pairs (strings; used
for both entailment and table recall), or a raw ToTTo example (``meta["raw_table"]`` as the ``totto``
task writes it, or ``meta`` itself) turned into two tables exactly as ToTTo's
``prepare_references_for_eval.py`` does: the entailment ("precision") table holds every cell of the
whole table plus page title, section title and section text; the recall table holds the highlighted
cells plus page and section title. Attributes never enter the computation (only values do).
Tokens: ToTTo's normalisation, sacrebleu's 13a tokenizer on lowercased text (``tokenizer="13a"``,
default) or lowercased words and punctuation marks (``tokenizer="simple"``).
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any

from engine.metrics.base import Metric, MetricError, MetricResult, check_inputs, mean, simple_tokenize
from engine.registry import metrics

Table = list[tuple[list[str], list[str]]]


def _ngram_counts(tokens: list[str], n: int) -> Counter:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def lcs_len(a: list[str], b: list[str]) -> int:
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0]
        for j, y in enumerate(b):
            cur.append(prev[j] + 1 if x == y else max(prev[j + 1], cur[j]))
        prev = cur
    return prev[-1]


def overlap_probability(ngram: tuple[str, ...], table_values: set[str]) -> float:
    return sum(1 for t in ngram if t in table_values) / len(ngram)


def mention_probability(entry: tuple[list[str], list[str]], tokens: list[str]) -> float:
    value = entry[1]
    return lcs_len(value, tokens) / len(value) if value else 0.0


def parent_single(
    prediction: list[str],
    references: list[list[str]],
    table: Table,
    lambda_weight: float | None = 0.5,
    smoothing: float = 1e-5,
    max_order: int = 4,
    recall_table: Table | None = None,
) -> tuple[float, float, float]:
    """(precision, recall, F) of one tokenised prediction; see the module docstring.

    ``table`` gives the entailment probabilities; ``recall_table`` (default: the same) the entries
    whose mention is the table recall (ToTTo: the highlighted cells only).
    """
    recall_table = table if recall_table is None else recall_table
    if not table or not recall_table:
        raise MetricError("parent: the table has no (attribute, value) entries")
    values = {t for _, v in table for t in v}
    best = (0.0, 0.0, -1.0)
    table_rec = sum(mention_probability(e, prediction) for e in recall_table) / len(recall_table)
    for reference in references:
        precs, recs = [], []
        for n in range(1, max_order + 1):
            pc, rc = _ngram_counts(prediction, n), _ngram_counts(reference, n)
            num = den = 0.0
            for g, c in pc.items():
                den += c
                p_in_ref = min(1.0, rc.get(g, 0) / c)
                num += c * (p_in_ref + (1.0 - p_in_ref) * overlap_probability(g, values))
            precs.append(num / den if den else 0.0)
            num = den = 0.0
            for g, c in rc.items():
                w = overlap_probability(g, values)
                den += c * w
                num += c * w * min(1.0, pc.get(g, 0) / c)
            recs.append(num / den if den else 1.0)
        for i in range(1, max_order):  # higher orders only, as the reference implementation does
            precs[i] = precs[i] or smoothing
            recs[i] = recs[i] or smoothing
        prec = 0.0 if min(precs) == 0 else math.exp(sum(math.log(p) for p in precs) / max_order)
        ref_rec = smoothing if min(recs) == 0 else math.exp(sum(math.log(r) for r in recs) / max_order)
        t_rec = table_rec or smoothing
        if lambda_weight is None:
            lw = 1.0 - sum(mention_probability(e, reference) for e in recall_table) / len(recall_table)
        else:
            lw = lambda_weight
        rec = math.exp((1.0 - lw) * math.log(ref_rec) + lw * math.log(t_rec))
        f = 2 * prec * rec / (prec + rec + 1e-8)
        if f > best[2]:
            best = (prec, rec, f)
    return best


def _clean(value: Any) -> str:
    return str(value or "").strip().replace("|", "-")


def totto_tables(example: dict[str, Any]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(precision table, recall table) of a raw ToTTo example, as ToTTo's official evaluation builds them.

    Precision (entailment) table: every cell of the whole table ("header"/"cell", value) plus page title,
    section title and section text. Recall table: the highlighted cells plus page and section title.
    """
    rows = example.get("table")
    if not isinstance(rows, list):
        raise MetricError("parent: raw ToTTo example has no 'table' list")
    titles = [(k, _clean(example.get(f"table_{k}"))) for k in ("page_title", "section_title")]
    titles = [(k, v) for k, v in titles if v]
    prec: list[tuple[str, str]] = []
    for row in rows:
        for cell in row:
            if _clean(cell.get("value")):
                prec.append(("header" if cell.get("is_header") else "cell", _clean(cell.get("value"))))
    prec += titles
    if _clean(example.get("table_section_text")):
        prec.append(("section_text", _clean(example.get("table_section_text"))))
    rec: list[tuple[str, str]] = []
    for r, c in example.get("highlighted_cells", []):
        try:
            cell = rows[r][c]
        except (IndexError, TypeError):
            raise MetricError(f"parent: highlighted cell {[r, c]} is outside the table") from None
        if _clean(cell.get("value")):
            rec.append(("header" if cell.get("is_header") else "cell", _clean(cell.get("value"))))
    return prec, rec + titles


def _tokenizer(name: str) -> Any:
    if name == "13a":
        from sacrebleu.tokenizers.tokenizer_13a import Tokenizer13a

        tok13a = Tokenizer13a()
        return lambda text: tok13a(text.strip().lower()).split()
    if name == "simple":
        return simple_tokenize
    raise MetricError(f"parent: tokenizer must be '13a' or 'simple', got {name!r}")


def tables_from_meta(
    meta: dict[str, Any], index: int = 0, tokenize: Any = simple_tokenize
) -> tuple[Table, Table]:
    """Tokenised (precision table, recall table) from a sample's meta (formats in the module docstring)."""
    raw = meta.get("table")
    if isinstance(raw, list) and all(
        isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in raw
    ):
        prec = rec = [tuple(p) for p in raw]
    elif isinstance(raw, list) and raw and not isinstance(raw[0], list | tuple):
        raise MetricError(f"meta[{index}].table: expected a list of [attribute, value] pairs")
    elif isinstance(meta.get("raw_table"), dict):
        prec, rec = totto_tables(meta["raw_table"])
    elif "highlighted_cells" in meta:
        prec, rec = totto_tables(meta)
    else:
        raise MetricError(
            f"meta[{index}]: PARENT needs 'table' ([attribute, value] pairs) or a raw ToTTo example ('raw_table')"
        )
    out = []
    for pairs in (prec, rec):
        table = [(tokenize(a), tokenize(v)) for a, v in pairs]
        table = [e for e in table if e[1]]
        if not table:
            raise MetricError(f"meta[{index}]: the table has no non-empty values")
        out.append(table)
    return out[0], out[1]


@metrics.register("parent", "PARENT-W precision/recall/F (Dhingra et al. 2019) against the meta table")
class Parent(Metric):
    """PARENT-W as ToTTo evaluates it; ``lambda_weight=None`` (default) = the per-example lambda."""

    reward_key = "table_to_text/parent_overall_f_score"

    def __init__(
        self,
        lambda_weight: float | None = None,
        smoothing: float = 1e-5,
        max_order: int = 4,
        tokenizer: str = "13a",
    ):
        if lambda_weight is not None and not 0.0 <= lambda_weight <= 1.0:
            raise MetricError(f"parent: lambda_weight must be in [0, 1] or null, got {lambda_weight}")
        self.lambda_weight, self.smoothing, self.max_order = lambda_weight, smoothing, max_order
        self.tokenize = _tokenizer(tokenizer)

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        meta = meta if meta is not None else [{} for _ in generations]
        check_inputs(prompts, generations, references, meta, need_references=True)
        ps, rs, fs = [], [], []
        for i, (g, refs, m) in enumerate(zip(generations, references, meta)):
            prec_table, rec_table = tables_from_meta(m, i, self.tokenize)
            p, r, f = parent_single(
                self.tokenize(g),
                [self.tokenize(x) for x in refs],
                prec_table,
                self.lambda_weight,
                self.smoothing,
                self.max_order,
                recall_table=rec_table,
            )
            ps.append(p)
            rs.append(r)
            fs.append(f)
        out: MetricResult = {
            "table_to_text/parent_overall_precision": (ps, mean(ps)),
            "table_to_text/parent_overall_recall": (rs, mean(rs)),
            "table_to_text/parent_overall_f_score": (fs, mean(fs)),
        }
        flags = [m.get("overlap_subset") for m in meta]
        if all(isinstance(x, bool) for x in flags):
            for name, want in (("overlap", True), ("non_overlap", False)):
                sub = [f for f, x in zip(fs, flags) if x is want]
                out[f"table_to_text/parent_{name}_f_score"] = (None, mean(sub))
        return out


metrics.add("parent_totto", Parent, "alias of parent (RL4LMs id)")
