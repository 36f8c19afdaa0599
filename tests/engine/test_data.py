"""GRUE data pools: fixtures, RL4LMs prompt formats, local files, caps and errors."""

from __future__ import annotations

import csv
import json

import pytest

from engine.config import RewardConfig, TaskConfig
from engine.data import DataError, Sample, load_task
from engine.data.totto import highlighted_subtable, linearize_subtable
from engine.registry import UnknownComponentError, tasks

GRUE_TASKS = [
    "imdb",
    "imdb_seq2seq",
    "commongen",
    "cnn_daily_mail",
    "totto",
    "narrative_qa",
    "iwslt2017en_de",
    "wmt16en_de",
    "daily_dialog",
]


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


@pytest.mark.parametrize("task_id", GRUE_TASKS)
def test_every_task_loads_its_fixture_for_every_split(task_id):
    ids_per_split = {}
    for split in ("train", "validation", "test"):
        samples = load_task(TaskConfig(id=task_id), split)
        assert samples, f"{task_id} {split} is empty"
        assert all(isinstance(s, Sample) for s in samples)
        assert all(isinstance(s.prompt, str) and s.prompt.strip() for s in samples)
        assert all(isinstance(s.references, list) and s.references for s in samples)
        assert all(isinstance(r, str) for s in samples for r in s.references)
        ids = [s.id for s in samples]
        if task_id != "commongen":  # commongen repeats prompts (one sample per scene) but not ids
            assert len(set(ids)) == len(ids)
        ids_per_split[split] = set(ids)
    if task_id.startswith("imdb"):  # validation is carved out of train: no overlap
        assert not ids_per_split["train"] & ids_per_split["validation"]


@pytest.mark.parametrize("task_id", GRUE_TASKS)
def test_every_task_declares_a_valid_default_reward_and_metrics(task_id):
    task = tasks.build(task_id)
    RewardConfig.model_validate(task.default_reward)
    from engine.registry import metrics, rewards

    assert task.default_reward["id"] in rewards.ids()
    assert task.default_metrics
    missing = [m["id"] for m in task.default_metrics if m["id"] not in metrics.ids()]
    assert not missing, f"{task_id}: default metrics not registered: {missing}"


def test_imdb_prompt_is_first_half_of_words_and_reference_the_review(tmp_path):
    review = "This film was a real joy to watch from start to end"  # 12 words
    f = write_jsonl(
        tmp_path / "test.jsonl", [{"text": review, "label": 1}, {"text": "one two three", "label": 0}]
    )
    samples = load_task(TaskConfig(id="imdb", args={"test_path": str(f)}), "test")
    assert samples[0].prompt == "This film was a real joy"
    assert samples[0].references == [review]
    assert samples[1].prompt == "one"  # int(3 * 0.5) = 1 word, as RL4LMs
    seq = load_task(TaskConfig(id="imdb_seq2seq", args={"test_path": str(f)}), "test")
    assert seq[0].prompt == "This film was a real joy"
    assert seq[0].references == ["to watch from start to end"]
    assert seq[0].meta["reference"] == review


def test_imdb_seq2seq_trains_on_positive_reviews_only():
    train = load_task(TaskConfig(id="imdb_seq2seq"), "train")
    assert train and all(s.meta["label"] == 1 for s in train)
    full = load_task(TaskConfig(id="imdb"), "train")
    assert {s.meta["label"] for s in full} == {0, 1}
    assert len(train) == sum(1 for s in full if s.meta["label"] == 1)


def test_imdb_fixture_first_test_prompt_matches_hand_split():
    rows = [json.loads(line) for line in open(tasks.get("imdb")().local_file("test"), encoding="utf-8")]
    words = rows[0]["text"].split(" ")
    sample = load_task(TaskConfig(id="imdb"), "test")[0]
    assert sample.prompt == " ".join(words[: len(words) // 2])
    assert sample.id == rows[0]["id"]


def test_commongen_prompt_format_and_references():
    val = load_task(TaskConfig(id="commongen"), "validation")
    first = val[0]
    assert first.prompt == "generate a sentence with: hold newspaper sit."
    assert first.meta["concepts"] == ["hold", "newspaper", "sit"]
    assert first.references[0] == "the man sat down holding the newspaper."
    assert len(first.references) > 1  # evaluation keeps every scene
    train = load_task(TaskConfig(id="commongen"), "train")
    assert all(len(s.references) == 1 for s in train)  # one sample per scene for training


def test_commongen_csv_with_concept_set_string_and_json_references(tmp_path):
    f = tmp_path / "train.csv"
    with f.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(["concept_set", "scene"])
        w.writerow(
            ["dog_N#frisbee_N#catch_V", json.dumps(["A dog catches a frisbee.", "The dog caught it."])]
        )
    samples = load_task(
        TaskConfig(id="commongen", args={"train_path": str(f), "prefix": "summarize: "}), "train"
    )
    assert [s.prompt for s in samples] == ["summarize: dog frisbee catch."] * 2
    assert [s.references for s in samples] == [["A dog catches a frisbee."], ["The dog caught it."]]


def test_cnn_daily_mail_prefix(tmp_path):
    f = write_jsonl(tmp_path / "v.jsonl", [{"article": "Rain fell all day.", "highlights": "It rained."}])
    s = load_task(TaskConfig(id="cnn_daily_mail", args={"validation_path": str(f)}), "validation")[0]
    assert s.prompt == "Summarize: Rain fell all day."
    assert s.references == ["It rained."]
    fixture = load_task(TaskConfig(id="cnn_daily_mail"), "test")[0]
    assert fixture.prompt.startswith("Summarize: Once upon a time, the Borscht Belt beat with life.")


def test_translation_prompt_from_jsonl_and_csv(tmp_path):
    s = load_task(TaskConfig(id="iwslt2017en_de"), "test")
    assert s[0].prompt == (
        "translate English to German: We're at a tipping point in human history, a species poised between "
        "gaining the stars and losing the planet we call home."
    )
    assert s[0].references == [
        "Wir stehen vor einem historischen Wendepunkt: zwischen dem Griff nach den Sternen und dem Verlust "
        "unseres Heimatplaneten."
    ]
    f = tmp_path / "pairs.csv"
    f.write_text("en,de\nGood morning.,Guten Morgen.\nThank you.,Danke.\n", encoding="utf-8")
    wmt = load_task(TaskConfig(id="wmt16", args={"path": str(f)}), "train")
    assert [x.prompt for x in wmt] == [
        "translate English to German: Good morning.",
        "translate English to German: Thank you.",
    ]
    assert [x.references for x in wmt] == [["Guten Morgen."], ["Danke."]]


def test_daily_dialog_context_window_eou_format_and_intent_meta(tmp_path):
    dialog = [f"u{i} ." for i in range(7)]
    f = write_jsonl(
        tmp_path / "train.jsonl",
        [{"id": "d0", "dialog": dialog, "act": [1, 2, 3, 4, 1, 2, 3], "emotion": [0, 0, 0, 4, 0, 0, 6]}],
    )
    s = load_task(TaskConfig(id="daily_dialog", args={"train_path": str(f)}), "train")
    assert len(s) == 2  # utterances 5 and 6 have five utterances before them
    assert s[0].prompt == "u0 .<EOU>u1 .<EOU>u2 .<EOU>u3 .<EOU>u4 . <EOU>"
    assert s[0].references == ["u5 .<EOU>"]
    assert s[0].meta["intent"] == [2] and s[0].meta["emotion"] == [0]
    assert s[1].prompt == "u1 .<EOU>u2 .<EOU>u3 .<EOU>u4 .<EOU>u5 . <EOU>"
    assert s[1].meta["intent"] == [3] and s[1].meta["emotion"] == [6]
    s2 = load_task(TaskConfig(id="daily_dialog", args={"train_path": str(f), "context_size": 2}), "train")
    assert len(s2) == 5 and s2[0].prompt == "u0 .<EOU>u1 . <EOU>"


def test_narrative_qa_unifiedqa_tsv_is_lowercased_and_grouped(tmp_path):
    f = tmp_path / "dev.tsv"
    f.write_text(
        "Who owns the Lantern? \\n Mara owns a Lantern.\tMara \n"
        "Who owns the Lantern? \\n Mara owns a Lantern.\t  The girl Mara\n"
        "Where? \\n At Sea.\tAt sea\n",
        encoding="utf-8",
    )
    s = load_task(TaskConfig(id="narrative_qa", args={"validation_path": str(f)}), "validation")
    assert len(s) == 2
    assert s[0].prompt == "who owns the lantern? \\n mara owns a lantern."
    assert s[0].references == ["mara", "the girl mara"]
    fx = load_task(TaskConfig(id="narrative_qa"), "test")
    assert all(" \\n " in x.prompt and x.prompt == x.prompt.lower() for x in fx)
    assert all(len(x.references) == 2 for x in fx)


def test_totto_linearisation_with_heuristic_headers():
    table = [
        [
            {"value": "Year", "is_header": True, "column_span": 1, "row_span": 1},
            {"value": "Results", "is_header": True, "column_span": 2, "row_span": 1},
        ],
        [
            {"value": "2001", "is_header": True, "column_span": 1, "row_span": 1},
            {"value": "Won", "is_header": False, "column_span": 1, "row_span": 1},
            {"value": "Gold", "is_header": False, "column_span": 1, "row_span": 1},
        ],
    ]
    sub = highlighted_subtable(table, [[1, 2]])
    # "Gold" sits under the two-column "Results" header and right of the "2001" row header.
    assert linearize_subtable(sub, None, None) == (
        "<table> <cell> Gold <col_header> Results </col_header> <row_header> 2001 </row_header> </cell> </table>"
    )
    assert linearize_subtable(sub, "Page", "Sec").startswith(
        "<page_title> Page </page_title> <section_title> Sec </section_title> <table> <cell> Gold"
    )


def test_totto_fixture_prompt_is_subtable_then_titled_subtable():
    s = load_task(TaskConfig(id="totto"), "validation")
    first = s[0]
    assert first.prompt.startswith(
        "<table> <cell> 2015 <col_header> Year </col_header> </cell> <cell> The 12 <col_header> Show </col_header>"
    )
    assert "</table><page_title> Colin Hanlon </page_title> <section_title> Theatre " in first.prompt
    assert first.references[0] == "In 2015, Colin Hanlon starred as Pete in The 12 at the Denver Center."
    assert first.meta["raw_table"]["highlighted_cells"]


def test_directory_path_finds_split_files(tmp_path):
    write_jsonl(tmp_path / "train.jsonl", [{"translation": {"en": "a", "de": "b"}}])
    write_jsonl(tmp_path / "dev.jsonl", [{"translation": {"en": "c", "de": "d"}}])
    assert load_task(TaskConfig(id="iwslt2017en_de", args={"path": str(tmp_path)}), "validation")[
        0
    ].references == ["d"]
    with pytest.raises(DataError, match="no 'test' data"):
        load_task(TaskConfig(id="iwslt2017en_de", args={"path": str(tmp_path)}), "test")


def test_caps_are_seeded_deterministic_subsets():
    full = load_task(TaskConfig(id="imdb"), "train")
    a = load_task(TaskConfig(id="imdb", max_train_samples=10, seed=1), "train")
    b = load_task(TaskConfig(id="imdb", max_train_samples=10, seed=1), "train")
    c = load_task(TaskConfig(id="imdb", max_train_samples=10, seed=2), "train")
    assert [s.id for s in a] == [s.id for s in b]
    assert len(a) == 10 and [s.id for s in a] != [s.id for s in c]
    assert {s.id for s in a} <= {s.id for s in full}
    assert [s.id for s in a] != [s.id for s in full[:10]]  # shuffled, not the first rows
    assert len(load_task(TaskConfig(id="imdb", max_eval_samples=7), "test")) == 7
    assert len(load_task(TaskConfig(id="imdb", max_eval_samples=7), "validation")) == 7
    assert len(load_task(TaskConfig(id="imdb", max_eval_samples=7), "train")) == len(full)  # eval cap only


def test_missing_local_file_names_path_and_fix(tmp_path):
    missing = tmp_path / "nope" / "train.jsonl"
    with pytest.raises(DataError) as ei:
        load_task(TaskConfig(id="imdb", args={"train_path": str(missing)}), "train")
    msg = str(ei.value)
    assert str(missing) in msg and "task.args" in msg and "fixture" in msg


def test_bad_json_line_and_missing_field_are_named(tmp_path):
    f = tmp_path / "train.jsonl"
    f.write_text('{"text": "ok", "label": 1}\n{"text": broken}\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"train.jsonl: line 2: invalid JSON"):
        load_task(TaskConfig(id="imdb", args={"train_path": str(f), "validation_path": str(f)}), "train")
    g = write_jsonl(tmp_path / "t.jsonl", [{"review_text": "x"}])
    with pytest.raises(DataError, match=r"missing field 'text' / 'review'"):
        load_task(TaskConfig(id="imdb", args={"test_path": str(g)}), "test")


def test_unknown_task_and_bad_split_and_hub_conflict():
    with pytest.raises(UnknownComponentError) as ei:
        load_task(TaskConfig(id="imbd"), "train")
    assert "imdb" in str(ei.value) and "commongen" in str(ei.value)
    with pytest.raises(DataError, match="unknown split"):
        load_task(TaskConfig(id="imdb"), "dev-set")
    with pytest.raises(DataError, match="either hub or local paths"):
        load_task(TaskConfig(id="imdb", args={"hub": True, "path": "/x"}), "train")


def test_hub_layouts_read_from_local_files(tmp_path):
    """Rows shaped like the hub data sets RL4LMs loads go through the same builders."""
    # gem/common_gen: one target per row; an empty target becomes "empty reference" (RL4LMs).
    cg = write_jsonl(tmp_path / "cg.jsonl", [{"concepts": ["sun", "beach"], "target": ""}])
    s = load_task(TaskConfig(id="commongen", args={"path": str(cg)}), "validation")[0]
    assert s.prompt == "generate a sentence with: sun beach." and s.references == ["empty reference"]
    # HF totto: sentence_annotations is a dict of parallel lists.
    raw = json.loads(open(tasks.get("totto")().local_file("test"), encoding="utf-8").readline())
    anns = raw["sentence_annotations"]
    raw["sentence_annotations"] = {k: [a[k] for a in anns] for k in anns[0]}
    raw["overlap_subset"] = "True"
    tt = write_jsonl(tmp_path / "totto.jsonl", [raw])
    hub_style = load_task(TaskConfig(id="totto", args={"path": str(tt)}), "test")[0]
    fixture = load_task(TaskConfig(id="totto"), "test")[0]
    assert hub_style.prompt == fixture.prompt and hub_style.references == fixture.references
    assert hub_style.meta["raw_table"]["overlap_subset"] is True
    # cnn_dailymail 3.0.0: article + highlights
    cnn = write_jsonl(tmp_path / "cnn.jsonl", [{"id": "x", "article": "A. B.", "highlights": "A."}])
    c = load_task(TaskConfig(id="cnn_daily_mail", args={"path": str(cnn), "truncate_article": 1}), "test")[0]
    assert c.prompt == "Summarize: A." and c.references == ["A."]


def test_hub_source_offline_error_says_how_to_use_local_files():
    import subprocess
    import sys

    code = (
        "from engine.config import TaskConfig\n"
        "from engine.data import load_task\n"
        "load_task(TaskConfig(id='imdb', args={'hub': True}), 'test')\n"
    )
    import os
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[2])
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PYTHONPATH": root}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=root
    )
    assert proc.returncode != 0
    assert "DataError" in proc.stderr and "could not load hub data set imdb" in proc.stderr
    assert "task.args.path" in proc.stderr


def test_user_data_never_mixes_with_the_fixture(tmp_path):
    f = write_jsonl(tmp_path / "train.jsonl", [{"concepts": ["a", "b"], "scene": ["a b"]}])
    cfg = TaskConfig(id="commongen", args={"train_path": str(f)})
    assert len(load_task(cfg, "train")) == 1
    with pytest.raises(DataError, match="no 'validation' data"):
        load_task(cfg, "validation")
    # IMDB carves validation out of the user's train file instead
    g = write_jsonl(
        tmp_path / "imdb.jsonl", [{"text": f"review {i} words here", "label": i % 2} for i in range(10)]
    )
    imdb = TaskConfig(id="imdb", args={"train_path": str(g)})
    assert len(load_task(imdb, "train")) == 8 and len(load_task(imdb, "validation")) == 2


def test_unknown_task_argument_names_the_task():
    with pytest.raises(TypeError, match=r"task 'commongen': bad arguments \['prefx'\]"):
        load_task(TaskConfig(id="commongen", args={"prefx": "x"}), "train")
