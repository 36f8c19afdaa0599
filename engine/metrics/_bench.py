"""Throughput and sanity benchmark of the metric suite (not imported by the registry: leading underscore).

``python -m engine.metrics._bench --commongen <validation.jsonl> [-n 200]``: for n CommonGen concept
sets, scores (a) one human reference against the other references (a human upper bound) and (b) the
bare concept list ("field look stand") as a weak baseline; prints seconds per metric and the values.
"""

from __future__ import annotations

import argparse
import time

from engine.jsonl import iter_jsonl_file
from engine.metrics import build_metrics, compute_all


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--commongen", required=True)
    ap.add_argument("-n", type=int, default=200)
    args = ap.parse_args()

    rows = []
    for _n, r in iter_jsonl_file(args.commongen):
        if len(r["scene"]) >= 2:
            rows.append(r)
        if len(rows) == args.n:
            break
    prompts = ["generate a sentence with: " + " ".join(r["concepts"]) for r in rows]
    refs = [r["scene"][1:] for r in rows]
    systems = {"human": [r["scene"][0] for r in rows], "concepts": [" ".join(r["concepts"]) for r in rows]}
    ids = ["meteor", "rouge", "bleu", "sacrebleu", "chrf", "ter", "cider", "bertscore", "rouge_l_max",
           "diversity", "generation_perplexity", "sentiment"]  # fmt: skip
    meta = [{} for _ in rows]
    print(f"{len(rows)} CommonGen validation concept sets, {sum(map(len, refs))} references")
    print("| metric | build s | score s (x2 systems) | key | human | concepts |")
    print("|---|---|---|---|---|---|")
    for mid in ids:
        t0 = time.perf_counter()
        (obj,) = build_metrics([{"id": mid}])
        t1 = time.perf_counter()
        res = {name: compute_all([obj], prompts, gens, refs, meta)[0] for name, gens in systems.items()}
        t2 = time.perf_counter()
        for i, key in enumerate(res["human"]):
            build, score = (f"{t1 - t0:.1f}", f"{t2 - t1:.1f}") if i == 0 else ("", "")
            print(f"| {mid if i == 0 else ''} | {build} | {score} | {key} | "
                  f"{res['human'][key]:.4f} | {res['concepts'][key]:.4f} |")  # fmt: skip


if __name__ == "__main__":
    main()
