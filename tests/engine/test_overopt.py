"""The over-optimisation watch on hand-made series: alignment on √KL, the warning's two rules (gold falls
N evaluations in a row while the proxy rises; gold more than z standard errors below its best at N
evaluations in a row while the proxy stands above its value there), the best evaluation and checkpoint by gold, and the
``gold`` evaluation metric that scores any registered reward (here a rubric) on evaluations only."""

from __future__ import annotations

import json
import math

import pytest

from engine import overopt
from engine.metrics import build_metrics, compute_all
from engine.overopt import Point, align, drops_from_best, falling_episodes, watch

# Gao et al.'s shape: the proxy climbs all along, the gold rises, peaks at step 40, then falls.
STEPS = [0, 10, 20, 30, 40, 50, 60, 70, 80]
PROXY = dict(zip(STEPS, [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9]))
GOLD = dict(zip(STEPS, [0.30, 0.40, 0.50, 0.55, 0.60, 0.58, 0.52, 0.45, 0.40]))


def _pts(gold, proxy):
    return [Point(i, p, g, None) for i, (g, p) in enumerate(zip(gold, proxy))]


def test_gold_falling_while_proxy_rises_warns_with_the_steps():
    w = watch(GOLD, PROXY, falls=3)
    assert w.best is not None and w.best.step == 40 and w.best.gold == 0.60
    [e] = w.episodes
    assert (e.start_step, e.end_step, e.falls) == (40, 80, 4)
    assert e.gold_drop == pytest.approx(0.20) and e.proxy_rise == pytest.approx(0.40)
    assert "4 consecutive evaluations (steps 40–80" in w.warning and "still falling" in w.warning


def test_no_warning_below_n_falls_or_when_the_proxy_fell_too():
    assert watch(GOLD, PROXY, falls=5).warning is None  # four falls only
    falling_proxy = {s: 1 - v for s, v in PROXY.items()}
    assert watch(GOLD, falling_proxy, falls=3).warning is None  # both fell: not over-optimisation
    # a tie breaks the run of falls: 0.6 -> 0.5 -> 0.5 -> 0.4 is never three strict falls in a row
    assert falling_episodes(_pts([0.6, 0.5, 0.5, 0.4, 0.3], [1, 2, 3, 4, 5]), 3) == []
    # a missing proxy cannot show that the proxy rose
    assert falling_episodes(_pts([0.9, 0.8, 0.7, 0.6], [None, 2, 3, 4]), 3) == []


def test_exactly_n_falls_warns_and_earlier_stretches_are_counted():
    gold = [0.9, 0.8, 0.7, 0.6, 0.9, 0.8, 0.7, 0.6, 0.7]
    episodes = falling_episodes(_pts(gold, list(range(9))), 3)
    assert [(e.start_step, e.end_step) for e in episodes] == [(0, 3), (4, 7)]
    w = watch(dict(enumerate(gold)), dict(enumerate(range(9))), falls=3)
    assert "2 such stretches" in w.warning and "still falling" not in w.warning  # it recovered at 8
    with pytest.raises(ValueError, match="falls must be at least 1"):
        falling_episodes([], 0)


# A gold that falls past its peak with noise: never two falls in a row, so the falls rule stays silent.
NOISY_GOLD = [0.50, 0.52, 0.46, 0.47, 0.45, 0.46, 0.44]
RISING = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7]


def test_below_the_best_catches_a_noisy_fall_the_falls_rule_misses():
    se = {s: 0.01 for s in range(7)}  # the difference's SE: sqrt(2) * 0.01 = 0.014142
    w = watch(dict(enumerate(NOISY_GOLD)), dict(enumerate(RISING)), falls=3, errors=se)
    assert w.episodes == [] and w.has_errors
    [d] = w.drops
    # best 0.52 at step 1; steps 2..6 lie 0.06, 0.05, 0.07, 0.06, 0.08 below it: 3.5 to 5.7 SE, all > 2
    assert (d.best_step, d.start_step, d.end_step, d.evaluations) == (1, 2, 6, 5)
    assert d.gold_drop == pytest.approx(0.08) and d.z_last == pytest.approx(0.08 / 0.0141421, rel=1e-5)
    assert d.proxy_rise == pytest.approx(0.5)
    assert "more than 2 standard errors below its best (step 1) at 5 consecutive evaluations" in w.warning
    assert "(steps 2–6; −0.08, 5.7 SE at step 6)" in w.warning and "and still does" in w.warning
    assert w.to_dict()["drops"][0]["evaluations"] == 5
    # exactly N evaluations warn, N + 1 do not
    assert drops_from_best(w.points, se, 5) and not drops_from_best(w.points, se, 6)


def test_below_the_best_needs_the_drop_beyond_the_noise_and_the_proxy_above():
    pts = watch(dict(enumerate(NOISY_GOLD)), dict(enumerate(RISING))).points
    # SE 0.03 per point: 2 SE of the difference = 0.0849, more than any drop here (0.08 at most)
    assert drops_from_best(pts, {s: 0.03 for s in range(7)}, 3) == []
    falling = watch(dict(enumerate(NOISY_GOLD)), dict(enumerate(reversed(RISING)))).points
    assert drops_from_best(falling, {s: 0.01 for s in range(7)}, 1) == []  # the proxy fell too
    # a point without a standard error ends the stretch: 2..3 and 5..6 are two evaluations each
    gap = {s: 0.01 for s in range(7) if s != 4}
    assert drops_from_best(pts, gap, 3) == [] and len(drops_from_best(pts, gap, 2)) == 2
    # without errors the second rule does not run
    w = watch(dict(enumerate(NOISY_GOLD)), dict(enumerate(RISING)))
    assert not w.has_errors and w.drops == [] and w.warning is None
    with pytest.raises(ValueError, match="falls must be at least 1"):
        drops_from_best(pts, {}, 0)


def test_a_new_best_becomes_the_reference():
    gold = [0.50, 0.40, 0.39, 0.60, 0.55, 0.50, 0.45]
    pts = watch(dict(enumerate(gold)), dict(enumerate(RISING))).points
    se = {s: 0.01 for s in range(7)}
    # 1..2 lie below step 0 (two only), then step 3 is the new best and 4..6 lie below it
    [d] = drops_from_best(pts, se, 3)
    assert (d.best_step, d.start_step, d.end_step) == (3, 4, 6)
    assert [(x.best_step, x.start_step, x.end_step) for x in drops_from_best(pts, se, 2)] == [
        (0, 1, 2),
        (3, 4, 6),
    ]


def test_paired_differences_see_a_drop_the_prompts_spread_hides():
    """Four prompts whose gold differs a lot by prompt (0.2 .. 0.8) and drops by about 0.1 on each:
    as independent means the drop is under one standard error; paired over the prompts it is many."""
    best = {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.8}
    later = {"a": 0.11, "b": 0.29, "c": 0.50, "d": 0.70}  # differences 0.09, 0.11, 0.10, 0.10
    # independent: se of each mean = sd / 2 = 0.129099 and 0.127867 -> sqrt(sum of squares) = 0.181705
    # paired: sd of (0.09, 0.11, 0.10, 0.10) = 0.0081650, / 2 = 0.0040825
    n, se = overopt.paired_error(best, later)
    assert n == 4 and se == pytest.approx(0.0040825, rel=1e-4)
    assert overopt.paired_error(best, {"a": 0.1, "x": 0.3}) is None  # one shared prompt: no error
    gold = {0: 0.5, 1: sum(later.values()) / 4, 2: sum(later.values()) / 4 - 0.001}
    scores = {0: best, 1: later, 2: {k: v - 0.001 for k, v in later.items()}}
    errors = {s: overopt.standard_error(list(v.values())) for s, v in scores.items()}
    assert overopt.difference_error(1, 0, errors) == (pytest.approx(0.181705, rel=1e-4), False)
    assert overopt.difference_error(1, 0, errors, scores) == (pytest.approx(0.0040825, rel=1e-4), True)
    proxy = {0: 0.1, 1: 0.5, 2: 0.9}
    independent = watch(gold, proxy, falls=2, errors=errors)
    assert independent.drops == []  # 0.1 / 0.18 = 0.55 SE
    paired = watch(gold, proxy, falls=2, errors=errors, scores=scores)
    [d] = paired.drops
    assert (d.best_step, d.start_step, d.end_step, d.paired) == (0, 1, 2, True)
    assert d.z_last == pytest.approx(0.101 / 0.0040825, rel=1e-3)
    assert "standard errors of the paired per-prompt differences below its best (step 0)" in paired.warning
    # scores alone (no per-point errors) run the rule; a step without scores falls back to its error
    assert watch(gold, proxy, falls=2, scores=scores).drops == paired.drops
    partial = {0: best, 1: later}
    [d2] = watch(gold, proxy, falls=1, errors=errors, scores=partial).drops
    assert (d2.start_step, d2.end_step, d2.paired) == (1, 1, True)  # step 2: 0.101 / 0.18 SE, not below


def test_sample_scores_pair_a_run_dirs_evaluations_by_prompt(tmp_path):
    rows = [
        {"step": 0, "eval/reward_mean": 0.1, "eval/gold": 0.5},
        {"step": 5, "eval/reward_mean": 0.5, "eval/gold": 0.4},
        {"step": 10, "eval/reward_mean": 0.9, "eval/gold": 0.399},
    ]
    base = {"a": 0.2, "b": 0.4, "c": 0.6, "d": 0.8}
    per_step = {
        0: base,
        5: {k: v - 0.1 for k, v in base.items()},
        10: {k: v - 0.101 for k, v in base.items()},
    }
    samples = [
        {"step": s, "split": "validation", "sample_id": sid, "metrics": {"gold": v}}
        for s, ids in per_step.items()
        for sid, v in ids.items()
    ]
    samples.append({"step": 5, "split": "validation", "metrics": {"gold": 0.3}})  # no id: not paired
    samples.append({"step": 10, "split": "train", "sample_id": "a", "metrics": {"gold": 9.0}})  # not eval
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in samples) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"eval": {"split": "validation"}}))
    scores = overopt.sample_scores(tmp_path, "eval/gold")
    assert scores[5] == pytest.approx(per_step[5]) and scores[10]["a"] == pytest.approx(0.099)
    assert overopt.sample_errors(tmp_path, "eval/gold")[5][0] == 5  # the unpaired sample still counts
    assert overopt.group_scores([(1, "a", 0.2), (1, "a", 0.4), (1, "b", float("nan"))]) == {
        1: {"a": pytest.approx(0.3)}
    }
    w, _ = overopt.watch_run_dir(tmp_path, falls=2)
    [d] = w.drops
    assert (d.best_step, d.start_step, d.end_step, d.paired) == (0, 5, 10, True)


def test_sqrt_kl_is_that_of_the_policy_each_evaluation_scored():
    # train/kl_episode at step s comes from rollout s, sampled before update s: the policy an
    # evaluation at step s scored (after s updates) is measured at step s + 1 when that was logged,
    # else the latest KL at or before s stands in.
    kl = {1: 0.0, 5: 4.0, 9: 9.0, 10: 16.0, 11: float("nan")}
    pts = align({0: 1.0, 5: 2.0, 8: 3.0, 10: 4.0, 12: float("nan")}, {5: 0.5}, kl)
    assert [(p.step, p.sqrt_kl, p.proxy) for p in pts] == [
        (0, 0.0, None),  # the starting policy: rollout 1's KL (0 here)
        (5, 2.0, 0.5),  # no step 6 logged: step 5's
        (8, 3.0, None),  # step 9's rollout was sampled by the policy evaluated at 8
        (10, 4.0, None),  # step 11's KL is NaN: step 10's; the NaN gold at 12 is no point
    ]
    # step 0 with nothing logged is at KL 0 by definition (the reference is the starting policy); a
    # later evaluation with no KL logged at or before it, or just after, has none (not a made-up 0)
    assert [p.sqrt_kl for p in align({0: 1.0, 3: 2.0}, {}, {5: 1.0})] == [0.0, None]


def test_best_checkpoint_is_the_saved_one_with_the_best_gold():
    w = watch(GOLD, PROXY, checkpoints=[20, 60, 80])
    assert w.best.step == 40 and w.best_checkpoint == 60  # 60 (0.52) beats 80 (0.40) and 20 (0.50)
    assert watch(GOLD, PROXY, checkpoints=[40]).best_checkpoint == 40
    assert watch(GOLD, PROXY).best_checkpoint is None
    assert watch({}, PROXY).best is None and watch({}, PROXY).warning is None


def test_watch_run_dir_reads_metrics_and_rl_checkpoints(tmp_path, capsys):
    rows = []
    for s in STEPS:
        rows.append({"step": s, "train/reward_mean": PROXY[s] - 0.05, "train/kl_episode": s / 10})
        rows.append({"step": s, "eval/reward_mean": PROXY[s], "eval/gold": GOLD[s]})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    for name in ("rl-000040", "rl-000080", "sft-000003", "latest.json"):
        (tmp_path / "checkpoints" / name).mkdir(parents=True)
    w, proxy_key = overopt.watch_run_dir(tmp_path)
    assert proxy_key == "eval/reward_mean" and w.best_checkpoint == 40
    assert w.points[-1].sqrt_kl == pytest.approx(math.sqrt(8.0))
    assert overopt.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "best by gold: step 40" in out and "Possible reward over-optimisation" in out
    with pytest.raises(
        KeyError, match="no 'eval/judge' in metrics.jsonl; evaluation keys: eval/gold, eval/reward_mean"
    ):
        overopt.watch_run_dir(tmp_path, "eval/judge")


def test_gold_metric_scores_a_rubric_on_evaluations():
    crit = [
        {"name": "numeric", "description": "numbers", "weight": 3},
        {"name": "varied", "description": "distinct", "scale": {"min": 0, "max": 4}},
    ]
    judge = {"backend": "stub", "features": {"varied": "distinct"}}
    [metric] = build_metrics(
        [{"id": "gold", "args": {"reward": {"id": "rubric", "args": {"criteria": crit, "judge": judge}}}}]
    )
    corpus, per_sample = compute_all([metric], ["p", "p"], ["1 2 3", "cat cat"], [[], []], [{}, {}])
    assert per_sample["gold"] == pytest.approx([1.0, 0.125])
    assert corpus["gold"] == pytest.approx(0.5625)
    assert corpus["gold/numeric"] == pytest.approx(3.0) and corpus["gold/varied"] == pytest.approx(3.0)


def test_sample_errors_and_the_charts_of_a_run_dir(tmp_path, capsys):
    # three evaluations; the middle one keeps only one sample (no error bar), the others four
    rows, samples = [], []
    vals = {0: [0.2, 0.4, 0.6, 0.8], 5: [0.5], 10: [0.1, 0.1, 0.1, 0.5]}
    for s, vs in vals.items():
        rows.append({"step": s, "eval/reward_mean": 0.1 * s, "eval/gold": sum(vs) / len(vs)})
        rows.append({"step": s + 1, "train/kl_episode": float(s)})
        samples += [{"step": s, "split": "validation", "metrics": {"gold": v}} for v in vs]
    samples.append({"step": 10, "split": "train", "metrics": {"gold": 9.0}})  # not an evaluation
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (tmp_path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in samples) + "\n")
    (tmp_path / "config.json").write_text(json.dumps({"eval": {"split": "validation"}}))
    errs = overopt.sample_errors(tmp_path, "eval/gold")
    # sd of 0.2, 0.4, 0.6, 0.8 = 0.2582; / sqrt(4) = 0.1291; of 0.1, 0.1, 0.1, 0.5 = 0.2; / 2 = 0.1
    assert set(errs) == {0, 10}
    assert errs[0][0] == 4 and errs[0][1] == pytest.approx(0.129099, abs=1e-6)
    assert errs[10][1] == pytest.approx(0.1)
    # the run-directory watch hands them to the below-the-best rule
    w, _ = overopt.watch_run_dir(tmp_path)
    assert w.has_errors and w.drops == []
    assert overopt.main([str(tmp_path), "--svg", str(tmp_path / "fig")]) == 0
    assert "wrote" in capsys.readouterr().out
    step_svg = (tmp_path / "fig" / "overopt-step.svg").read_text()
    kl_svg = (tmp_path / "fig" / "overopt-kl.svg").read_text()
    # the legend names each key by its last part (a full key would not fit beside the plot)
    assert "proxy: reward_mean" in step_svg and "gold: gold" in kl_svg
    assert "eval/reward_mean" not in step_svg
    assert "training step" in step_svg and "√KL from the initial policy" in kl_svg
    # the gold's ± SE band is drawn (its points have errors), the proxy has none
    assert step_svg.count("<polygon") == 1 and step_svg.count("<polyline") == 2
    # the √KL chart's x ticks: KL 0, 5, 10 at steps 0, 5, 10 (logged at s + 1) -> √KL up to 3.16
    assert ">3<" in kl_svg and ">4<" not in kl_svg


def test_the_documented_real_case_config_builds_over_its_preset():
    """docs/engine.md's real case is run from bench/overopt_vader.yaml: it must stay a valid config
    whose proxy is VADER without a KL penalty and whose gold is the rubric, every evaluation keeping
    all its samples (the charts' standard errors)."""
    from pathlib import Path

    from engine.cli import build_config

    path = Path(__file__).resolve().parents[2] / "bench" / "overopt_vader.yaml"
    cfg = build_config(str(path), [], "imdb_ppo_offline")
    assert cfg.reward.id == "sentiment_vader" and not cfg.reward.include_prompt
    assert cfg.kl.controller == "fixed" and cfg.kl.init_coef == 0.0
    assert cfg.train.eval_at_start and cfg.train.log_samples >= cfg.task.max_eval_samples
    gold = cfg.eval.metrics[0]
    assert gold.id == "gold" and gold.args["reward"]["id"] == "rubric"
