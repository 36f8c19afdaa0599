"""The Bradley–Terry reward-model trainer learns a synthetic preference (MiniLM backbone, offline)."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from engine import reward_model as rm

POS = [
    "wonderful",
    "delightful",
    "brilliant",
    "excellent",
    "charming",
    "superb",
    "lovely",
    "great",
    "moving",
    "fantastic",
]
NEG = [
    "awful",
    "terrible",
    "boring",
    "dreadful",
    "horrible",
    "dull",
    "painful",
    "bad",
    "weak",
    "disappointing",
]
SUBJ = [
    "The movie",
    "The plot",
    "The acting",
    "This film",
    "The ending",
    "The soundtrack",
    "The script",
    "The cast",
]


def synthetic_pairs(n: int, seed: int = 0) -> list[dict]:
    """Humans (synthetically) prefer the positive continuation of the same prompt."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        s = rng.choice(SUBJ)
        prompt = f"Review {i}: "
        good = f"{s} was {rng.choice(POS)} and {rng.choice(POS)}."
        bad = f"{s} was {rng.choice(NEG)} and {rng.choice(NEG)}."
        rows.append({"prompt": prompt, "chosen": good, "rejected": bad, "meta": {"i": i}})
    return rows


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_parse_pairs_names_line_and_field(tmp_path):
    good = json.dumps({"prompt": "p", "chosen": "a", "rejected": "b"})
    with pytest.raises(rm.PairsError, match=r"line 2: missing field 'rejected'"):
        rm.parse_pairs([good, json.dumps({"prompt": "p", "chosen": "a"})])
    with pytest.raises(rm.PairsError, match=r"line 1: field 'chosen' must be a string"):
        rm.parse_pairs([json.dumps({"prompt": "p", "chosen": 3, "rejected": "b"})])
    with pytest.raises(rm.PairsError, match=r"line 3: invalid JSON"):
        rm.parse_pairs([good, "", "{nope"])
    with pytest.raises(rm.PairsError, match="not found"):
        rm.load_pairs(tmp_path / "missing.jsonl")


def _item_keys(p: rm.PreferencePair) -> set[str]:
    lo, hi = sorted((p.chosen, p.rejected))
    keys = {f"text:{p.prompt}|{lo}|{hi}"}
    if p.meta.get("item") is not None:
        keys.add(f"item:{p.meta['item']}")
    return keys


def campaign_like_pairs(seed: int) -> list[rm.PreferencePair]:
    """Judgments as a campaign exports them: 40 items, each judged by 1-4 annotators who may disagree
    (chosen/rejected swapped), some items showing the same two texts as another item (a duplicated
    sample), plus 20 CLI-style rows without meta that repeat one comparison in both directions."""
    rng = random.Random(seed)
    texts = [f"{s} was {w}." for s in SUBJ for w in POS + NEG]
    out = []
    for item in range(40):
        prompt = f"Review {item % 25}: "  # several items share a prompt
        a, b = rng.sample(texts, 2)
        if item % 10 == 9:  # a duplicated sample: the same texts as the previous item, another item id
            a, b = out[-1].chosen, out[-1].rejected
            prompt = out[-1].prompt
        for annotator in range(rng.randint(1, 4)):
            first = rng.random() < 0.7
            chosen, rejected = (a, b) if first else (b, a)
            out.append(rm.PreferencePair(prompt, chosen, rejected, {"item": item, "annotator": annotator}))
    for _ in range(10):
        a, b = rng.sample(texts, 2)
        out += [rm.PreferencePair("cli: ", a, b), rm.PreferencePair("cli: ", b, a)]
    rng.shuffle(out)
    return out


@pytest.mark.parametrize("fraction", [0.1, 0.2, 0.5])
def test_heldout_split_never_shares_an_item_with_training(fraction):
    """No item id and no comparison (prompt + the two texts, in either order) is on both sides, for
    several seeds and fractions; the held-out side still gets about the requested share."""
    for seed in range(5):
        pairs = campaign_like_pairs(seed)
        held, train = rm.split_heldout(pairs, fraction, random.Random(seed))
        assert sorted(map(id, held + train)) == sorted(map(id, pairs))  # a partition: nothing lost
        held_keys = set().union(*(_item_keys(p) for p in held))
        train_keys = set().union(*(_item_keys(p) for p in train))
        assert not held_keys & train_keys, (seed, fraction, sorted(held_keys & train_keys)[:3])
        assert held and train
        # groups are at most a few pairs, so the share lands within a few pairs of the target
        assert abs(len(held) - fraction * len(pairs)) <= 8, (seed, fraction, len(held), len(pairs))


def test_heldout_split_keeps_a_group_and_swapped_duplicates_together():
    p = rm.PreferencePair
    pairs = [
        p("q", "good", "bad"),
        p("q", "bad", "good"),  # the same comparison judged the other way round, no meta
        p("x", "one", "two", {"group": "g1"}),
        p("y", "three", "four", {"group": "g1"}),
        p("z", "five", "six", {"item": 7}),
        p("w", "seven", "eight", {"item": 7, "group": "g2"}),
        p("v", "nine", "ten", {"group": "g2"}),  # joined to item 7 through group g2
    ]
    for seed in range(20):
        held, train = rm.split_heldout(pairs, 0.4, random.Random(seed))
        sides = {(q.prompt, q.chosen): ("held" if any(q is h for h in held) else "train") for q in pairs}
        assert sides[("q", "good")] == sides[("q", "bad")]
        assert sides[("x", "one")] == sides[("y", "three")]
        assert sides[("z", "five")] == sides[("w", "seven")] == sides[("v", "nine")]


def test_reward_model_learns_synthetic_preference(tmp_path):
    """fp32 on the CPU (the trainer uses no autocast). Measured with data and training seeds 0-3: held-out
    accuracy 1.0 on all four (30 pairs), final loss 0.24-0.27, score margin of the probe pair below
    1.37-1.64; the test asks for 0.85 accuracy and a positive margin."""
    pairs = rm.parse_pairs([json.dumps(r) for r in synthetic_pairs(120)])
    seen = []
    res = rm.train_reward_model(
        pairs, tmp_path / "rm", epochs=2, batch_size=16, max_length=24, heldout_fraction=0.25,
        learning_rate=1e-4, progress=lambda s, t, info: seen.append((s, t, info["loss"])),
    )  # fmt: skip
    assert res.heldout_pairs == 30 and res.train_pairs == 90
    assert res.heldout_accuracy is not None and res.heldout_accuracy >= 0.85  # chance is 0.5
    assert [s for s, _, _ in seen] == list(range(1, res.steps + 1)) and seen[-1][1] == res.steps
    # Saved as a HF directory with tokenizer, num_labels=1, loadable by the generic scorer.
    from transformers import AutoConfig

    assert AutoConfig.from_pretrained(tmp_path / "rm").num_labels == 1
    assert (tmp_path / "rm" / "tokenizer_config.json").exists()
    scorer = rm.RewardModelScorer(tmp_path / "rm")
    good, bad = scorer(["The plot was superb and lovely.", "The plot was dreadful and dull."])
    assert good > bad


def test_cli_trains_from_jsonl(tmp_path):
    pairs = write_jsonl(tmp_path / "pairs.jsonl", synthetic_pairs(24, seed=3))
    out = tmp_path / "cli_rm"
    proc = subprocess.run(
        [sys.executable, "-m", "engine.reward_model", "train", "--pairs", str(pairs), "--out", str(out),
         "--epochs", "1", "--batch-size", "8", "--max-length", "16"],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["train_pairs"] + summary["heldout_pairs"] == 24 and summary["steps"] == 3
    assert json.loads((out / rm.METADATA_FILE).read_text())["kind"] == "bradley_terry_reward_model"
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "p", "chosen": "a", "rejected": "b"}\n{"prompt": "p"}\n')
    proc = subprocess.run(
        [sys.executable, "-m", "engine.reward_model", "train", "--pairs", str(bad), "--out", str(tmp_path / "x")],
        capture_output=True, text=True, timeout=120, cwd=Path(__file__).resolve().parents[2],
    )  # fmt: skip
    assert proc.returncode == 2 and "line 2: missing field 'chosen'" in proc.stderr


def test_policy_backbone_gpt2_gets_a_pad_token_and_loads_as_learned_reward(tmp_path):
    """The policy's own (causal LM) backbone works too; the engine's `learned` reward reads the result."""
    from engine.registry import rewards

    pairs = rm.parse_pairs([json.dumps(r) for r in synthetic_pairs(16, seed=5)])
    res = rm.train_reward_model(
        pairs, tmp_path / "rm", backbone="builtin:tiny-gpt2", epochs=1, batch_size=8, max_length=16
    )
    assert res.steps == 2 and res.heldout_pairs == 3
    texts = ["The plot was superb.", "The plot was dull."]
    direct = rm.RewardModelScorer(tmp_path / "rm")(texts)
    learned = rewards.build("learned", model_path=str(tmp_path / "rm"), label_index=0)
    assert learned(["", ""], texts, [[], []], [{}, {}]) == pytest.approx(direct, abs=1e-5)
