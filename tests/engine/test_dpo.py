"""DPO / IPO: the loss by hand, sequence log-probs by hand, and learning on a small preference set.

The preference set pairs each prompt with a chosen response of numbers and a rejected response of
words. A working DPO learner drives the loss from log 2 (0.693, policy = reference) well below it and
the implicit reward margin from 0 to clearly positive, with every pair ranked right. Runs are fp32 on
CPU, causal and seq2seq, over several seeds. MEASURED records what the settings gave while the
thresholds were chosen (6 iterations, lr 1e-3, beta 0.1).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch

import engine
from engine.algorithms.dpo import dpo_loss, response_batch, sequence_logps
from engine.config import TaskConfig, parse_config
from engine.data import load_task
from engine.data.sources import DataError
from engine.presets import FIXTURE_DIR, list_presets, load_preset
from engine.rewards import build_reward

# Iteration-6 values seen while choosing thresholds (seed 0): causal loss 0.24 / margin 1.32,
# seq2seq loss 0.04 / margin 3.2 (seed 1); the tests ask for loss < 0.45 and margin > 0.5.
MEASURED = {"causal": (0.24, 1.32), "seq2seq": (0.04, 3.2)}

PAIRS_FIXTURE = FIXTURE_DIR / "imdb_preferences" / "train.jsonl"

TOPICS = ["cats", "dogs", "rain", "music", "trains", "bread", "rivers", "stars"]


def _write_pairs(path: Path) -> Path:
    with path.open("w") as fh:
        for i, t in enumerate(TOPICS):
            row = {
                "prompt": f"Tell me about {t}.",
                "chosen": f" {i} {i + 1} {i + 2} {i + 3}",
                "rejected": f" {t} are nice and {t} are good",
            }
            fh.write(json.dumps(row) + "\n")
    return path


def _metrics(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


# ----------------------------------------------------------------------------- the loss by hand
def test_dpo_sigmoid_loss_by_hand():
    pc, pr, rc, rr = (torch.tensor([v]) for v in (-1.0, -2.0, -1.5, -1.5))
    beta = 0.5
    losses, r_c, r_r = dpo_loss(pc, pr, rc, rr, beta, "sigmoid")
    h = (-1.0 + 1.5) - (-2.0 + 1.5)  # = 1.0
    assert losses.item() == pytest.approx(math.log(1 + math.exp(-beta * h)), rel=1e-6)
    assert r_c.item() == pytest.approx(0.25) and r_r.item() == pytest.approx(-0.25)
    smoothed, _, _ = dpo_loss(pc, pr, rc, rr, beta, "sigmoid", label_smoothing=0.1)
    expected = 0.9 * math.log(1 + math.exp(-0.5)) + 0.1 * math.log(1 + math.exp(0.5))
    assert smoothed.item() == pytest.approx(expected, rel=1e-6)


def test_ipo_loss_by_hand():
    pc, pr, rc, rr = (torch.tensor(v) for v in ([-1.0, -0.2], [-2.0, -0.4], [-1.5, -0.3], [-1.5, -0.3]))
    beta = 0.25
    losses, _, _ = dpo_loss(pc, pr, rc, rr, beta, "ipo")
    # h = (-1 + 1.5) - (-2 + 1.5) = 1.0 and (-0.2 + 0.3) - (-0.4 + 0.3) = 0.2; target 1 / (2 beta) = 2
    assert losses.tolist() == pytest.approx([(1.0 - 2.0) ** 2, (0.2 - 2.0) ** 2], rel=1e-5)


def test_unknown_loss_type_is_refused():
    t = torch.zeros(1)
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(t, t, t, t, 0.1, "hinge")


# ----------------------------------------------------------------------------- log-probs by hand
@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
def test_sequence_logps_match_a_plain_forward(make_policy, kind):
    """The padded, batched log-probs equal each pair scored alone with a plain forward pass."""
    policy, tok = make_policy(kind)
    policy.eval()
    prompts = ["Tell me about cats.", "Hi"]
    responses = [" 1 2 3", " cats are nice and cats are good"]
    batch = response_batch(tok, prompts, responses, kind == "seq2seq", 32, 16, "cpu")
    total = sequence_logps(policy.lm, kind == "seq2seq", policy.decoder_start_id, batch)
    mean = sequence_logps(policy.lm, kind == "seq2seq", policy.decoder_start_id, batch, average=True)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        p_ids = tok(p)["input_ids"]
        r_ids = tok(r, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
        with torch.no_grad():
            if kind == "causal":
                logits = policy.lm(input_ids=torch.tensor([p_ids + r_ids])).logits[0]
                rows = logits[len(p_ids) - 1 : len(p_ids) + len(r_ids) - 1]
            else:
                dec = [policy.decoder_start_id] + r_ids[:-1]
                rows = policy.lm(
                    input_ids=torch.tensor([p_ids]), decoder_input_ids=torch.tensor([dec])
                ).logits[0]
        logp = torch.log_softmax(rows.float(), -1)[torch.arange(len(r_ids)), torch.tensor(r_ids)]
        assert total[i].item() == pytest.approx(logp.sum().item(), abs=1e-4)
        assert mean[i].item() == pytest.approx(logp.mean().item(), abs=1e-5)


def test_dpo_loss_on_a_tiny_batch_by_hand(make_policy):
    """One batch through the algorithm's own pair scoring equals the formula on plain log-probs."""
    from engine.algorithms.dpo import DPO
    from engine.config import AlgorithmConfig
    from engine.data.base import Sample

    policy, tok = make_policy("causal")
    ref, _ = make_policy("causal")
    with torch.no_grad():  # make the policy differ from the reference
        for p in policy.lm.parameters():
            p.add_(0.05 * torch.randn_like(p))
    samples = [
        Sample(id="a", prompt="Tell me about rain.", meta={"chosen": " 1 2 3", "rejected": " rain is wet"}),
        Sample(id="b", prompt="Hi", meta={"chosen": " 4 5", "rejected": " hello there friend"}),
    ]
    algo = DPO(AlgorithmConfig(id="dpo", dpo={"beta": 0.2}))
    with torch.no_grad():
        pc, pr = algo.pair_logps(policy.lm, policy, tok, samples, 32, "cpu")
        rc, rr = algo.pair_logps(ref.lm, policy, tok, samples, 32, "cpu")
    losses, _, _ = dpo_loss(pc, pr, rc, rr, 0.2)

    def alone(lm: Any, prompt: str, resp: str) -> float:
        b = response_batch(tok, [prompt], [resp], False, 32, 128, "cpu")
        with torch.no_grad():
            return sequence_logps(lm, False, None, b).item()

    for i, s in enumerate(samples):
        h = (alone(policy.lm, s.prompt, s.meta["chosen"]) - alone(ref.lm, s.prompt, s.meta["chosen"])) - (
            alone(policy.lm, s.prompt, s.meta["rejected"]) - alone(ref.lm, s.prompt, s.meta["rejected"])
        )
        assert abs(h) > 1e-3  # the perturbation made the case non-trivial
        assert losses[i].item() == pytest.approx(math.log1p(math.exp(-0.2 * h)), abs=1e-4)


# ----------------------------------------------------------------------------- the pairs task
def test_pairs_task_errors_name_file_and_line(tmp_path):
    bad = tmp_path / "pairs.jsonl"
    bad.write_text(
        json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"}) + "\n" + json.dumps({"prompt": "p"})
    )
    with pytest.raises(DataError, match=r"pairs\.jsonl: line 2: field 'chosen' must be a string \(missing\)"):
        load_task(TaskConfig(id="preference_pairs", args={"path": str(bad)}), "train")
    same = tmp_path / "same.jsonl"
    same.write_text(json.dumps({"prompt": "p", "chosen": "a", "rejected": "a"}) + "\n")
    with pytest.raises(DataError, match="line 1: 'chosen' and 'rejected' are the same text"):
        load_task(TaskConfig(id="preference_pairs", args={"path": str(same)}), "train")


def test_pairs_task_holds_out_whole_groups(tmp_path):
    path = tmp_path / "pairs.jsonl"
    with path.open("w") as fh:
        for g in range(40):
            for k in range(3):
                row = {
                    "prompt": f"prompt {g}",
                    "chosen": f"c{k}",
                    "rejected": f"r{k}",
                    "meta": {"group": f"g{g}"},
                }
                fh.write(json.dumps(row) + "\n")
    cfg = TaskConfig(id="preference_pairs", args={"path": str(path), "heldout_fraction": 0.3})
    train, held = load_task(cfg, "train"), load_task(cfg, "validation")
    assert len(train) + len(held) == 120 and held
    assert not {s.meta["group"] for s in train} & {s.meta["group"] for s in held}
    assert all(s.references == [s.meta["chosen"]] for s in train)


# ----------------------------------------------------------------------------- learning
def _dpo_config(tmp_path: Path, kind: str, seed: int, loss_type: str = "sigmoid") -> dict[str, Any]:
    pairs = _write_pairs(tmp_path / "pairs.jsonl")
    return {
        "name": f"dpo-{kind}-{seed}",
        "model": {
            "name_or_path": f"builtin:tiny-{'gpt2' if kind == 'causal' else 't5'}",
            "mixed_precision": "no",
        },
        "task": {"id": "preference_pairs", "args": {"path": str(pairs), "heldout_fraction": 0.0}},
        "reward": {"id": "rouge_l_max"},
        "algorithm": {
            "id": "dpo",
            "learning_rate": 1e-3,
            "minibatch_size": 4,
            "dpo": {"beta": 0.1, "loss_type": loss_type},
        },
        "train": {
            "n_iters": 6,
            "prompts_per_iter": 8,
            "seed": seed,
            "eval_every": 0,
            "save_every": 0,
            "output_dir": str(tmp_path / "run"),
            "save_final_model": False,
        },
        "eval": {"generation": {"max_new_tokens": 4, "do_sample": False}},
    }


@pytest.mark.parametrize("kind", ["causal", "seq2seq"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_dpo_lowers_loss_and_raises_margin(tmp_path, kind, seed):
    cfg = _dpo_config(tmp_path, kind, seed)
    engine.train(cfg)
    rows = [r for r in _metrics(tmp_path / "run") if "train/loss" in r]
    assert len(rows) == 6
    first, last = rows[0], rows[-1]
    # Iteration 1 scores with policy == reference: loss log 2, margin 0.
    assert first["train/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert first["rewards/margin"] == pytest.approx(0.0, abs=1e-4)
    assert last["train/loss"] < 0.45  # log 2 = 0.69; measured 0.16-0.2 (causal)
    assert last["rewards/margin"] > 0.5  # see MEASURED
    assert last["rewards/accuracy"] == 1.0
    assert last["rewards/chosen"] > last["rewards/rejected"]


def test_ipo_learns_too(tmp_path):
    cfg = _dpo_config(tmp_path, "causal", 0, loss_type="ipo")
    engine.train(cfg)
    rows = [r for r in _metrics(tmp_path / "run") if "train/loss" in r]
    # IPO starts at (0 - 1/(2 beta))^2 = 25 and moves h towards 5 (mean log-probs).
    assert rows[0]["train/loss"] == pytest.approx(25.0, abs=1e-3)
    assert rows[-1]["train/loss"] < 0.5 * rows[0]["train/loss"]
    assert rows[-1]["rewards/margin"] > 0.05 and rows[-1]["rewards/accuracy"] == 1.0


def test_dpo_refuses_a_task_without_pairs(small_config):
    cfg = small_config(algorithm={"id": "dpo"})
    with pytest.raises(ValueError, match="needs preference pairs.*preference_pairs"):
        engine.train(cfg)


def test_dpo_resume_continues_the_same_trajectory(tmp_path):
    """A run stopped after 4 iterations and resumed ends where an uninterrupted run ends."""
    (tmp_path / "a").mkdir()
    full = _dpo_config(tmp_path / "a", "causal", 0)
    full["train"]["n_iters"] = 6
    engine.train(full)
    (tmp_path / "b").mkdir()
    part = _dpo_config(tmp_path / "b", "causal", 0)
    part["train"]["n_iters"] = 6
    calls = {"n": 0}

    def stop() -> bool:
        calls["n"] += 1
        return calls["n"] > 4

    assert engine.train(part, should_stop=stop)["stopped"]
    engine.train(part, resume_from=part["train"]["output_dir"])
    a = [r["train/loss"] for r in _metrics(tmp_path / "a" / "run") if "train/loss" in r]
    b = [r["train/loss"] for r in _metrics(tmp_path / "b" / "run") if "train/loss" in r]
    assert len(a) == len(b) == 6
    assert b == pytest.approx(a, abs=1e-5)


# ----------------------------------------------------------------------------- the preset
def test_imdb_preferences_presets_are_listed_and_the_pairs_hold_their_preference():
    """imdb_preferences_dpo(_offline) and the zero-shot baseline are in the preset list (the launch form's
    menu); the offline one runs SmolLM2 from its wheel on the shipped pairs. Every shipped pair is what
    its provenance says: VADER scores the chosen continuation at least 0.3 above the rejected one."""
    rows = {p["name"]: p for p in list_presets()}
    for name in (
        "imdb_preferences_dpo",
        "imdb_preferences_dpo_offline",
        "imdb_preferences_zero_shot_offline",
    ):
        assert rows[name]["task"] == "preference_pairs", name
    assert rows["imdb_preferences_dpo_offline"]["algorithm"] == "dpo"
    cfg = parse_config(load_preset("imdb_preferences_dpo_offline"))
    assert (
        cfg.algorithm.id == "dpo"
        and cfg.algorithm.dpo.beta == 0.1
        and cfg.algorithm.dpo.loss_type == "sigmoid"
    )
    assert Path(cfg.model.name_or_path).is_file() and cfg.model.name_or_path.endswith(".gguf")
    assert Path(cfg.task.args["path"]) == PAIRS_FIXTURE
    online = parse_config(load_preset("imdb_preferences_dpo"))
    assert online.model.name_or_path == "lvwerra/gpt2-imdb" and online.task.args == cfg.task.args
    train, held = load_task(cfg.task, "train"), load_task(cfg.task, "validation")
    assert len(train) >= 40 and len(held) >= 2
    assert not {s.meta["group"] for s in train} & {s.meta["group"] for s in held}
    # a run sees every training pair about three times
    assert 2.5 <= cfg.train.n_iters * cfg.train.prompts_per_iter / len(train) <= 3.5
    vader = build_reward({"id": "sentiment_vader", "include_prompt": False, "args": {"score": "compound"}})
    pairs = train + held
    chosen = vader(
        [s.prompt for s in pairs], [s.meta["chosen"] for s in pairs], [[]] * len(pairs), [{}] * len(pairs)
    )
    rejected = vader(
        [s.prompt for s in pairs], [s.meta["rejected"] for s in pairs], [[]] * len(pairs), [{}] * len(pairs)
    )
    assert all(c >= r + 0.3 - 1e-9 for c, r in zip(chosen, rejected))


def test_imdb_preferences_dpo_preset_trains(tmp_path):
    """The offline preset, as shipped except for the model (the tiny GPT-2 stands in for SmolLM2, as the
    GSM8K preset test does) and a shorter run at a larger step: the loss leaves log 2, the margin turns
    positive, and the evaluation on the held-out prompts reports the preset's sentiment metric."""
    cfg = load_preset("imdb_preferences_dpo_offline")
    cfg["model"] = {"name_or_path": "builtin:tiny-gpt2", "type": "causal", "mixed_precision": "no"}
    cfg["algorithm"]["learning_rate"] = 1e-3
    cfg["train"].update(n_iters=3, eval_every=0, save_every=0, output_dir=str(tmp_path / "run"))
    cfg["train"]["save_final_model"] = False
    cfg["task"]["max_eval_samples"] = 4
    cfg["eval"]["generation"].update(max_new_tokens=8)
    engine.train(cfg)
    rows = _metrics(tmp_path / "run")
    steps = [r for r in rows if "train/loss" in r]
    assert len(steps) == 3
    assert steps[0]["train/loss"] == pytest.approx(math.log(2), abs=1e-4)
    assert steps[-1]["train/loss"] < steps[0]["train/loss"] and steps[-1]["rewards/margin"] > 0
    evals = [r["eval/semantic/sentiment_vader"] for r in rows if "eval/semantic/sentiment_vader" in r]
    assert evals and all(0.0 <= v <= 1.0 for v in evals), rows[-1]


# ----------------------------------------------------------------------------- a control
HELD_OUT = ["clouds", "apples", "boats", "lamps"]


def _held_out_margin(model_dir: str) -> float:
    """Mean over unseen topics of h = (log pi - log pi_ref)(numbers) - (log pi - log pi_ref)(words):
    how much more the trained policy prefers a number response to a word response than its start did."""
    from engine.models.builtin import builtin_model_dir
    from engine.models.loading import load_lm, load_tokenizer

    ref_dir = builtin_model_dir("builtin:tiny-gpt2")
    tok = load_tokenizer(str(ref_dir))
    prompts = [f"Tell me about {t}." for t in HELD_OUT]
    numbers = [f" {i} {i + 1} {i + 2} {i + 3}" for i in range(20, 20 + len(HELD_OUT))]
    words = [f" {t} are nice and {t} are good" for t in HELD_OUT]
    out = []
    for path in (model_dir, str(ref_dir)):
        lm = load_lm(path, "causal").eval()
        with torch.no_grad():
            pair = [
                sequence_logps(lm, False, None, response_batch(tok, prompts, resp, False, 32, 16, "cpu"))
                for resp in (numbers, words)
            ]
        out.append(pair[0] - pair[1])
    return float((out[0] - out[1]).mean())


def _flip_every_other_pair(path: Path) -> Path:
    """The control's data: the same pairs with chosen and rejected swapped in every second one, so
    numbers win four pairs and words four: the same texts, updates of the same size, no preference."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    for i, row in enumerate(rows):
        if i % 2:
            row["chosen"], row["rejected"] = row["rejected"], row["chosen"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_dpo_generalises_the_preference_and_a_flipped_preference_control_does_not(tmp_path):
    """Loss and margin on the training pairs fall and rise for any pairs a model can memorise; what the
    preference teaches shows on pairs it never saw. After DPO on "numbers over words" the policy prefers
    a number response to a word response on four unseen topics far more than its reference does; the
    control (half the pairs flipped) moves by far less. Measured (fp32, causal, these settings): held-out
    margin 9.24 after DPO, -0.29 for the control; the same for seeds 0-3 (one step per iteration takes all
    8 pairs, so the seed changes nothing here). A learner that never steps stays at 0 and fails."""
    margins = {}
    for name in ("dpo", "control"):
        (tmp_path / name).mkdir()
        cfg = _dpo_config(tmp_path / name, "causal", 0)
        cfg["train"]["save_final_model"] = True
        if name == "control":
            _flip_every_other_pair(Path(cfg["task"]["args"]["path"]))
        summary = engine.train(cfg)
        margins[name] = _held_out_margin(summary["model_dir"])
    assert margins["dpo"] > 2.0, margins
    assert abs(margins["control"]) < 0.25 * margins["dpo"], margins
