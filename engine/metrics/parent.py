"""PARENT (Dhingra et al., ACL 2019): table-aware precision and recall for data-to-text.

Implemented from the paper's definition, "PARENT-W" variant with the word-overlap entailment model,
which is what ToTTo reports:

* Entailment probability of an n-gram g by the table T: ``w(g) = |{t in g : t in values(T)}| / |g|``.
* Entailed precision of order n:
  ``P_n = sum_g c(g) [p(g in R) + (1 - p(g in R)) w(g)] / sum_g c(g)`` over candidate n-grams, where
  ``p(g in R) = min(1, count_R(g) / count_G(g))``.
* Entailed recall against the reference, of order n:
  ``R_n = sum_g c_R(g) w(g) min(1, count_G(g) / c_R(g)) / sum_g c_R(g) w(g)`` (1 when the denominator is 0).
* Recall against the table: mean over the table's entries (attribute, value) of
  ``LCS(value, generation) / |value|``.
* P = geometric mean of P_1..P_4, R_ref likewise (orders 2..4 that are 0 become 1e-5, as the
  reference implementation smooths); R = R_ref^(1-lambda) * R_table^lambda; F = 2PR / (P + R).
  ``lambda`` is 0.5 by default; ``lambda_weight=None`` uses the paper's per-example
  ``1 - (mean mention probability of the table entries in the reference)``.
* Several references: the one with the best F counts. Corpus values are means over samples.

Tables come from ``meta``: either ``meta["table"]`` = list of ``[attribute, value]`` pairs (strings), or
a raw ToTTo example (``meta["raw_table"]``, or ``meta`` itself, with ``table``, ``highlighted_cells``,
``table_page_title``, ``table_section_title``), turned into pairs as ToTTo's evaluation does: page title,
section title, and each highlighted cell with its row/column header cells as attribute.
Tokens: lowercased words and punctuation marks (``simple_tokenize``).
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
) -> tuple[float, float, float]:
    """(precision, recall, F) of one tokenised prediction; see the module docstring."""
    if not table:
        raise MetricError("parent: the table has no (attribute, value) entries")
    values = {t for _, v in table for t in v}
    best = (0.0, 0.0, -1.0)
    table_rec = sum(mention_probability(e, prediction) for e in table) / len(table)
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
            lw = 1.0 - sum(mention_probability(e, reference) for e in table) / len(table)
        else:
            lw = lambda_weight
        rec = math.exp((1.0 - lw) * math.log(ref_rec) + lw * math.log(t_rec))
        f = 2 * prec * rec / (prec + rec + 1e-8)
        if f > best[2]:
            best = (prec, rec, f)
    return best


def _totto_pairs(example: dict[str, Any]) -> list[tuple[str, str]]:
    """ToTTo raw example -> (attribute, value) pairs: titles plus highlighted cells with their headers."""
    rows = example.get("table")
    if not isinstance(rows, list):
        raise MetricError("parent: raw ToTTo table has no 'table' list")
    # Lay out the spans on a grid so that a cell's column is its visual column.
    grid: dict[tuple[int, int], dict[str, Any]] = {}
    pos: dict[tuple[int, int], tuple[int, int]] = {}
    for r, row in enumerate(rows):
        c = 0
        for ci, cell in enumerate(row):
            while (r, c) in grid:
                c += 1
            pos[(r, ci)] = (r, c)
            for dr in range(int(cell.get("row_span", 1) or 1)):
                for dc in range(int(cell.get("column_span", 1) or 1)):
                    grid.setdefault((r + dr, c + dc), cell)
            c += int(cell.get("column_span", 1) or 1)
    pairs: list[tuple[str, str]] = []
    if example.get("table_page_title"):
        pairs.append(("page_title", str(example["table_page_title"])))
    if example.get("table_section_title"):
        pairs.append(("section_title", str(example["table_section_title"])))
    for r, ci in example.get("highlighted_cells", []):
        if (r, ci) not in pos:
            raise MetricError(f"parent: highlighted cell {[r, ci]} is outside the table")
        gr, gc = pos[(r, ci)]
        cell = grid[(gr, gc)]
        headers: list[str] = []
        for (hr, hc), h in sorted(grid.items()):
            if h is cell or not h.get("is_header") or h["value"] in headers:
                continue
            if (hc == gc and hr < gr) or (hr == gr and hc < gc):
                headers.append(h["value"])
        pairs.append((" ".join(headers), str(cell.get("value", ""))))
    return pairs


def table_from_meta(meta: dict[str, Any], index: int = 0) -> Table:
    """Tokenised (attribute, value) entries from a sample's meta (formats in the module docstring)."""
    if (
        "table" in meta
        and isinstance(meta["table"], list)
        and meta["table"]
        and not isinstance(meta["table"][0], list | tuple)
    ):
        raise MetricError(f"meta[{index}].table: expected a list of [attribute, value] pairs")
    if (
        "table" in meta
        and isinstance(meta["table"], list)
        and all(
            isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(x, str) for x in p)
            for p in meta["table"]
        )
    ):
        pairs = [tuple(p) for p in meta["table"]]
    elif isinstance(meta.get("raw_table"), dict):
        pairs = _totto_pairs(meta["raw_table"])
    elif "highlighted_cells" in meta:
        pairs = _totto_pairs(meta)
    else:
        raise MetricError(
            f"meta[{index}]: PARENT needs 'table' ([attribute, value] pairs) or a raw ToTTo example ('raw_table')"
        )
    table = [(simple_tokenize(a), simple_tokenize(v)) for a, v in pairs]
    table = [e for e in table if e[1]]
    if not table:
        raise MetricError(f"meta[{index}]: the table has no non-empty values")
    return table


@metrics.register("parent", "PARENT-W precision/recall/F (Dhingra et al. 2019) against the meta table")
class Parent(Metric):
    """PARENT with the word-overlap entailment model; ``lambda_weight=None`` = the paper's adaptive lambda."""

    reward_key = "table_to_text/parent_overall_f_score"

    def __init__(self, lambda_weight: float | None = 0.5, smoothing: float = 1e-5, max_order: int = 4):
        if lambda_weight is not None and not 0.0 <= lambda_weight <= 1.0:
            raise MetricError(f"parent: lambda_weight must be in [0, 1], got {lambda_weight}")
        self.lambda_weight, self.smoothing, self.max_order = lambda_weight, smoothing, max_order

    def compute(self, prompts, generations, references, meta=None) -> MetricResult:
        meta = meta if meta is not None else [{} for _ in generations]
        check_inputs(prompts, generations, references, meta, need_references=True)
        ps, rs, fs = [], [], []
        for i, (g, refs, m) in enumerate(zip(generations, references, meta)):
            p, r, f = parent_single(
                simple_tokenize(g),
                [simple_tokenize(x) for x in refs],
                table_from_meta(m, i),
                self.lambda_weight,
                self.smoothing,
                self.max_order,
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
