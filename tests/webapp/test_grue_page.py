"""The GRUE leaderboard: grid placement, best run, normalised score, paper results, filter, access."""

from __future__ import annotations

import json

import pytest

from engine.presets import load_preset
from webapp.grue.leaderboard import build_board, final_eval, grid_algorithm, grid_task

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def cfg(alg: str = "ppo", n_iters: int = 5, sft: bool = False, task: str = "imdb") -> dict:
    return {
        "algorithm": {"id": alg},
        "train": {"n_iters": n_iters},
        "supervised": {"enabled": sft},
        "task": {"id": task},
    }


def test_grid_algorithm_from_config():
    assert grid_algorithm(cfg("ppo", 0)) == "zero_shot"
    assert grid_algorithm(cfg("sft", 0, sft=True)) == "supervised"
    assert grid_algorithm(cfg("ppo", 3)) == "ppo"
    assert grid_algorithm(cfg("nlpo", 3)) == "nlpo"
    assert grid_algorithm(cfg("ppo", 3, sft=True)) == "supervised_ppo"
    assert grid_algorithm(cfg("nlpo", 3, sft=True)) == "supervised_nlpo"
    assert grid_algorithm(cfg("a2c", 3)) == "a2c"
    assert grid_algorithm(cfg("grpo", 3, sft=True)) == "supervised_grpo"
    assert grid_algorithm(cfg("no_such_algorithm", 3)) is None
    # The presets land in the column they are named after.
    for alg in ("zero_shot", "supervised", "ppo", "nlpo", "supervised_ppo", "supervised_nlpo"):
        assert grid_algorithm(load_preset(f"imdb_{alg}")) == alg
    assert (
        grid_task("imdb_seq2seq") == "imdb" and grid_task("wmt16") == "wmt16en_de" and grid_task("x") is None
    )


def test_final_eval_prefers_summary_then_points():
    assert final_eval({"eval": {"eval/lexical/meteor": 0.3, "eval/x": None, "train/y": 1}}) == {
        "lexical/meteor": 0.3
    }
    assert final_eval({}, {"eval/a": 1.0}) == {"a": 1.0}
    assert final_eval({"eval": {}}, {"eval/a": float("nan")}) == {}


def _run(i, alg, sent, ppl, model="m1", task="imdb", sft=False, n_iters=5):
    return {
        "id": i,
        "name": f"r{i}",
        "task": task,
        "model": model,
        "config": cfg(alg, n_iters, sft, task),
        "metrics": {"semantic/sentiment_vader": sent, "fluency_metrics/perplexity": ppl},
    }


def test_best_run_and_normalised_score_hand_computed():
    runs = [
        _run(1, "ppo", 0.60, 40.0),
        _run(2, "ppo", 0.70, 50.0),  # best PPO by sentiment (first metric)
        _run(3, "nlpo", 0.50, 30.0),
        _run(4, "ppo", 0.20, 10.0, n_iters=0),  # zero-shot
    ]
    board = build_board(runs)
    imdb = next(r for r in board["tasks"] if r["task"] == "imdb")
    cells = {c["algorithm"]: c for c in imdb["cells"]}
    assert cells["ppo"]["run"]["id"] == 2 and cells["ppo"]["n_runs"] == 2
    assert cells["ppo"]["values"] == [0.70, 50.0]
    # Sentiment over cells {ppo .7, nlpo .5, zero .2}: (v-.2)/.5 -> 1, .6, 0.
    # Perplexity (lower better) over {50, 30, 10}: 1-(v-10)/40 -> 0, .5, 1.
    assert cells["ppo"]["score"] == pytest.approx(0.5)
    assert cells["nlpo"]["score"] == pytest.approx(0.55)
    assert cells["zero_shot"]["score"] == pytest.approx(0.5)
    assert cells["supervised"]["run"] is None and cells["supervised"]["score"] is None
    # Paper values sit beside ours for IMDB.
    assert cells["nlpo"]["paper"] == [0.611, 33.83]
    assert cells["supervised_ppo"]["paper"] == [0.626, 35.05]
    assert cells["zero_shot"]["paper"] == [0.489, 32.17]


def test_single_cell_row_and_model_filter():
    runs = [_run(1, "ppo", 0.6, 40.0, model="a"), _run(2, "ppo", 0.9, 40.0, model="b")]
    board = build_board(runs, model="a")
    imdb = board["tasks"][0]
    ppo = next(c for c in imdb["cells"] if c["algorithm"] == "ppo")
    assert ppo["run"]["id"] == 1 and ppo["score"] == 1.0
    assert [m["name"] for m in board["models"]] == ["a", "b"]
    assert build_board(runs)["tasks"][0]["cells"][2]["run"]["id"] == 2


# --------------------------------------------------------------------------- database + HTTP


def _make_run(name, preset, status, eval_values=None, points=None, **overrides):
    from webapp.runs import ingest, services
    from webapp.runs.models import Run

    config = load_preset(preset)
    for k, v in overrides.items():
        config.setdefault(k.split("__")[0], {})[k.split("__")[1]] = v
    run = services.create_run(config, name=name)
    Run.objects.filter(pk=run.pk).update(status=status, summary={"eval": eval_values} if eval_values else {})
    if points:
        ingest.ingest_metrics(run.pk, points)
    return Run.objects.get(pk=run.pk)


@pytest.fixture
def grue_runs(db):
    good = _make_run(
        "cg <script>alert(1)</script>",
        "commongen_ppo",
        "succeeded",
        {"eval/lexical/meteor": 0.31, "eval/lexical/cider": 0.9, "eval/semantic/bert_score": 0.8},
    )
    worse = _make_run("cg-worse", "commongen_ppo", "succeeded", {"eval/lexical/meteor": 0.11})
    failed = _make_run("cg-failed", "commongen_ppo", "failed", {"eval/lexical/meteor": 0.99})
    # No summary: the last eval/* point counts (step 10, not step 5).
    zs = _make_run(
        "imdb-zs",
        "imdb_zero_shot",
        "succeeded",
        points=[
            ("eval/semantic/sentiment_vader", 5, 0.1),
            ("eval/semantic/sentiment_vader", 10, 0.55),
            ("eval/fluency_metrics/perplexity", 10, 31.0),
            ("train/reward_mean", 10, 7.0),
        ],
    )
    other_model = _make_run(
        "imdb-ppo-t5",
        "imdb_ppo",
        "succeeded",
        {"eval/semantic/sentiment_vader": 0.7},
        model__name_or_path="builtin:tiny-gpt2",
    )
    return {"good": good, "worse": worse, "failed": failed, "zs": zs, "other": other_model}


def test_page_shows_best_runs_with_links_and_escapes_names(researcher_client, grue_runs):
    r = researcher_client.get("/grue/")
    assert r.status_code == 200
    html = r.content.decode()
    good = grue_runs["good"]
    assert f'href="/runs/{good.pk}/"' in html
    assert "&lt;script&gt;alert(1)" in html and "<script>alert(1)" not in html
    assert f'href="/runs/{grue_runs["failed"].pk}/"' not in html  # failed runs never count
    assert f'href="/runs/{grue_runs["worse"].pk}/"' not in html  # beaten in its cell
    assert "0.310" in html and "best of 2" in html
    assert "paper (GPT-2): 0.611 / 33.83" in html
    assert "0.550" in html  # IMDB zero-shot from metric points
    assert 'id="chart-scores"' in html and "/static/vendor/plotly.min.js" in html
    chart = html.split('id="grue-chart" type="application/json">')[1].split("</script>")[0]
    data = json.loads(chart)
    assert {t["name"] for t in data["scores"]} == {"CommonGen", "IMDB sentiment continuation"}
    assert data["paper"][0]["y"] == [0.489, 0.539, 0.602, 0.611, 0.626, 0.620]
    # Empty cells tell which preset fills them.
    assert "imdb_supervised_nlpo" in html
    # Human rankings live on the annotation app's leaderboard, linked from here.
    assert 'id="human-leaderboard-link"' in html and 'href="/annotate/leaderboard/"' in html


def test_json_and_model_filter(researcher_client, grue_runs):
    data = researcher_client.get("/grue/data.json").json()
    cg = next(t for t in data["tasks"] if t["task"] == "commongen")
    ppo = next(c for c in cg["cells"] if c["algorithm"] == "ppo")
    assert ppo["run"]["id"] == grue_runs["good"].pk and ppo["n_runs"] == 2
    assert ppo["values"][0] == pytest.approx(0.31)
    imdb = next(t for t in data["tasks"] if t["task"] == "imdb")
    zs = next(c for c in imdb["cells"] if c["algorithm"] == "zero_shot")
    assert zs["values"] == [pytest.approx(0.55), pytest.approx(31.0)]
    assert {m["name"] for m in data["models"]} == {"t5-base", "lvwerra/gpt2-imdb", "builtin:tiny-gpt2"}

    filtered = researcher_client.get("/grue/data.json", {"model": "builtin:tiny-gpt2"}).json()
    assert filtered["model"] == "builtin:tiny-gpt2"
    cells = [c for t in filtered["tasks"] for c in t["cells"] if c["run"]]
    assert [c["run"]["id"] for c in cells] == [grue_runs["other"].pk]
    html = researcher_client.get("/grue/", {"model": "builtin:tiny-gpt2"}).content.decode()
    assert '<option value="builtin:tiny-gpt2" selected>' in html
    assert f'href="/runs/{grue_runs["good"].pk}/"' not in html


def test_access_requires_researcher(client, annotator, nobody, admin, db):
    r = client.get("/grue/")
    assert r.status_code == 302 and "/accounts/login/" in r["Location"]
    assert client.get("/grue/data.json", HTTP_ACCEPT="application/json").status_code == 401
    client.force_login(annotator)
    r = client.get("/grue/")
    assert r.status_code == 302 and r["Location"] == "/annotate/"
    client.force_login(nobody)
    assert client.get("/grue/").status_code == 403
    client.force_login(admin)
    assert client.get("/grue/").status_code == 200


@pytest.mark.django_db(transaction=True)
def test_real_engine_runs_land_on_the_board(researcher_client, tmp_path):
    """engine.train with the platform's recorder (no mocks): the final evaluation reaches the right cells.
    The recorder stores from its own thread and connection, so the runs must be committed."""
    from pathlib import Path

    from django.conf import settings

    import engine
    from webapp.runs import services
    from webapp.runs.models import Run, RunStatus
    from webapp.runs.recorder import Recorder

    small = {
        "train": {
            "n_iters": 2,
            "prompts_per_iter": 8,
            "eval_every": 0,
            "save_every": 0,
            "save_final_model": False,
        },
        "task": {"max_eval_samples": 4},
    }
    ids = {}
    for alg in ("ppo", "zero_shot"):
        config = load_preset(f"synthetic_{alg}")
        for section, values in small.items():
            config[section].update(values)
        config["train"]["output_dir"] = str(Path(settings.RUNS_DIR) / f"grue-page-{alg}")
        if alg == "zero_shot":
            config["train"]["n_iters"] = 0
        run = services.create_run(config, name=f"syn-{alg}")
        engine.train(run.config, sink=Recorder(run.pk, broadcast_enabled=False))
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)
        ids[alg] = run.pk

    data = researcher_client.get("/grue/data.json").json()
    row = next(t for t in data["tasks"] if t["task"] == "synthetic_increasing_numbers")
    cells = {c["algorithm"]: c for c in row["cells"]}
    for alg, pk in ids.items():
        run = Run.objects.get(pk=pk)
        assert cells[alg]["run"]["id"] == pk
        assert cells[alg]["values"][0] == pytest.approx(run.summary["eval"]["eval/reward_mean"])
    assert cells["ppo"]["run"]["model"] == "builtin:tiny-gpt2"
    html = researcher_client.get("/grue/").content.decode()
    assert f'href="/runs/{ids["ppo"]}/"' in html and f'href="/runs/{ids["zero_shot"]}/"' in html
