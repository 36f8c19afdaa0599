"""The one dotted-path module: the rules every caller (``--set``, sweeps, presets, trackers, the compare
page's config diff, the sweep table) relies on."""

from __future__ import annotations

from engine import dotted
from engine.presets import deep_merge as preset_merge
from engine.trackers.base import flatten as tracker_params


def test_flatten_keeps_lists_as_leaves_and_empty_mappings_as_asked():
    cfg = {"a": {"b": 1, "c": [1, {"x": 2}], "d": {}}, "e": None}
    assert dotted.flatten(cfg) == {"a.b": 1, "a.c": [1, {"x": 2}], "a.d": {}, "e": None}
    assert dotted.flatten(cfg, empty=False) == {"a.b": 1, "a.c": [1, {"x": 2}], "e": None}
    # trackers hold scalars only: lists and empty mappings become JSON text
    assert tracker_params(cfg) == {"a.b": 1, "a.c": '[1, {"x": 2}]', "a.d": "{}", "e": None}


def test_get_and_set_paths():
    data: dict = {"train": {"n_iters": 3}, "model": "tiny"}
    assert dotted.get_path(data, "train.n_iters") == 3
    assert dotted.get_path(data, "train.missing", "dflt") == "dflt"
    assert dotted.get_path(data, "model.name", "dflt") == "dflt"  # through a non-mapping: missing
    dotted.set_path(data, "train.n_iters", 5)
    dotted.set_path(data, "algorithm.args.lr", 0.1)  # makes the mappings on the way
    dotted.set_path(data, "model.name", "gpt2")  # replaces a scalar on the way, as --set does
    assert data == {"train": {"n_iters": 5}, "model": {"name": "gpt2"}, "algorithm": {"args": {"lr": 0.1}}}


def test_deep_merge_merges_mappings_replaces_the_rest_and_shares_nothing():
    base = {"a": {"x": 1, "y": [1, 2]}, "b": 1}
    over = {"a": {"y": [3], "z": {"k": 1}}, "c": 2}
    out = dotted.deep_merge(base, over, None)
    assert out == {"a": {"x": 1, "y": [3], "z": {"k": 1}}, "b": 1, "c": 2}
    out["a"]["z"]["k"] = 99
    out["a"]["x"] = 0
    assert over["a"]["z"]["k"] == 1 and base["a"]["x"] == 1
    whole = dotted.deep_merge(base, {"a": {"q": 1}}, replace=lambda key, old, new: key == "a")
    assert whole["a"] == {"q": 1}


def test_the_presets_replace_a_reward_with_another_id_whole():
    base = {
        "reward": {"id": "rouge", "args": {"rouge_type": "rouge1"}},
        "task": {"id": "imdb", "args": {"h": 1}},
    }
    out = preset_merge(base, {"reward": {"id": "meteor"}, "task": {"id": "imdb_seq2seq"}})
    assert out["reward"] == {"id": "meteor"}
    assert out["task"] == {"id": "imdb_seq2seq", "args": {"h": 1}}
    assert preset_merge(base, {"reward": {"args": {"x": 1}}})["reward"]["args"] == {
        "rouge_type": "rouge1",
        "x": 1,
    }
