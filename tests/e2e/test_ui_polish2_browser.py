"""Issue 26, the remaining items, checked in Debian chromium with the Content-Security-Policy enforced
(the ``csp_page`` fixture of test_ui_polish_browser): every error of a config at once and task ×
algorithm checks at launch (item 4), charts that follow what the algorithm logs (item 6), the AI
judge's position-bias warning (item 7), GRUE columns for every algorithm (item 8), one-click DPO's
defaults (item 10). Measured in the browser (text, element counts, bounding boxes), never timed."""

from __future__ import annotations

from typing import Any

import pytest
import yaml
from playwright.sync_api import expect

from tests.e2e.test_ui_polish_browser import csp_page  # noqa: F401 - the fixture, CSP enforced
from webapp.runs.models import Run

pytestmark = [pytest.mark.e2e]


@pytest.mark.django_db(transaction=True)
def test_every_error_of_a_config_shows_at_once_and_nothing_is_queued(
    csp_page: Any,  # noqa: F811
    asgi_server: Any,
    researcher: Any,
    login: Any,
) -> None:
    page = csp_page
    base = asgi_server.url
    login(page, base, researcher)
    # The server's first launch page reads every preset and the schema: slow on a loaded machine.
    page.goto(f"{base}/launch/?preset=synthetic_grpo", timeout=120_000)
    page.locator("#section-tabs a[data-section='algorithm']").click()
    page.fill("input[name='algorithm__learning_rate']", "-1")
    page.fill("input[name='algorithm__group__group_size']", "1")
    page.click("#launch-btn")
    lr = page.locator("ul.field-errors[data-error-for='algorithm.learning_rate']")
    group = page.locator("ul.field-errors[data-error-for='algorithm.group.group_size']")
    expect(lr).to_contain_text("greater than 0")
    expect(group).to_contain_text("needs at least 2 per prompt")
    expect(page.locator("#section-tabs a[data-section='algorithm']")).to_contain_text("⚠")

    # DPO on the synthetic task: refused at launch, on the algorithm field, saying what to use.
    page.goto(f"{base}/launch/?preset=synthetic_ppo")
    page.locator("#section-tabs a[data-section='algorithm']").click()
    page.select_option("select[name='algorithm__id']", "dpo")
    page.click("#launch-btn")
    alg = page.locator("ul.field-errors[data-error-for='algorithm.id']")
    expect(alg).to_contain_text("learns from preference pairs")
    expect(alg).to_contain_text("task.id 'preference_pairs'")

    # The YAML view: an unknown key, an unknown algorithm id and a type error in one list.
    page.click("#tab-yaml")
    text = page.locator("textarea[name='config_yaml']").input_value()
    cfg = yaml.safe_load(text)
    cfg["id"] = "grpo2"
    cfg["algorithm"]["id"] = "grpo2"
    cfg["algorithm"]["learning_rate"] = "fast"
    page.fill("textarea[name='config_yaml']", yaml.safe_dump(cfg))
    page.click("#launch-btn")
    errors = page.locator("#yaml-errors li")
    expect(errors.filter(has_text="id: unknown key")).to_have_count(1)
    expect(errors.filter(has_text="algorithm.learning_rate:")).to_have_count(1)
    expect(errors.filter(has_text="algorithm.id: unknown algorithm id 'grpo2'")).to_have_count(1)
    assert not Run.objects.exists()


class FirstShownJudge:
    """A judge that always answers "A", the response shown first: what the local SmolLM2 judge did
    in 32 of 32 passes (issue 26.7). A real backend object for ``run_judging``; no model behind it."""

    def judge(self, prompt: str) -> Any:
        from annotation.ai_backends import Verdict

        return Verdict("A", 0.9, 0.1)


class SystemAJudge:
    """A judge that prefers system a's output on whichever side it is shown: consistent, unbiased."""

    def __init__(self, pairs: list[tuple[str, str]]):
        self.pairs = pairs  # (system a's output, system b's output) of every item

    def judge(self, prompt: str) -> Any:
        from annotation.ai_backends import Verdict

        for out_a, out_b in self.pairs:
            if out_a in prompt and out_b in prompt:
                return Verdict("A" if prompt.find(out_a) < prompt.find(out_b) else "B")
        return Verdict("")


@pytest.mark.django_db(transaction=True)
def test_an_ai_judge_that_follows_the_position_is_flagged_with_what_to_try(
    csp_page: Any,  # noqa: F811
    asgi_server: Any,
    researcher: Any,
    login: Any,
) -> None:
    from annotation import ai_judges
    from tests.annotation.test_ai_judges import _campaign

    camp = _campaign(16, "bias")
    biased = ai_judges.create_judge(camp, name="first-shown judge", model="builtin:tiny-gpt2")
    fair = ai_judges.create_judge(camp, name="content judge", model="builtin:tiny-gpt2")
    idle = ai_judges.create_judge(camp, name="idle judge", model="builtin:tiny-gpt2")
    pairs = [(it.output_a, it.output_b) for it in camp.items.filter(gold="")]
    n = len(pairs)
    for judge, backend in ((biased, FirstShownJudge()), (fair, SystemAJudge(pairs))):
        ai_judges.start_judging(judge, enqueue=False)
        assert ai_judges.run_judging(judge.pk, backend=backend).status == "succeeded"

    page = csp_page
    base = asgi_server.url
    login(page, base, researcher, next_url=f"/annotate/campaigns/{camp.pk}/")
    expect(page.locator(f'#ai-judge-table tr[data-judge="{idle.pk}"] .ai-progress-text')).to_have_text(
        "not run yet"
    )

    page.goto(f"{base}/annotate/campaigns/{camp.pk}/results/")
    warning = page.locator(f'.ai-warning[data-judge="{biased.pk}"]')
    expect(warning).to_contain_text(f"chose the first-shown response in {2 * n} of {2 * n} decided passes")
    expect(warning).to_contain_text(f"p = {ai_judges.binomial_two_sided_p(2 * n, 2 * n):.2g}")
    expect(warning).to_contain_text(f"{n} of {n} items ended as ties")
    expect(warning.locator(".ai-advice")).to_contain_text("another judge model")
    expect(warning.locator(".ai-advice")).to_contain_text("swap-averaging")
    expect(
        page.locator(f'#ai-agreement-table tr[data-judge="{biased.pk}"] .ai-uninformative')
    ).to_be_visible()
    # The consistent judge gets no warning; the idle one says it has not run.
    expect(page.locator(f'.ai-warning[data-judge="{fair.pk}"]')).to_have_count(0)
    expect(page.locator(f'#ai-agreement-table tr[data-judge="{idle.pk}"] .ai-items')).to_have_text(
        "not run yet"
    )


def _boxes_overlap(a: dict[str, float], b: dict[str, float]) -> bool:
    return not (
        a["x"] + a["width"] <= b["x"]
        or b["x"] + b["width"] <= a["x"]
        or a["y"] + a["height"] <= b["y"]
        or b["y"] + b["height"] <= a["y"]
    )


@pytest.mark.django_db(transaction=True)
def test_charts_follow_what_the_algorithm_logs_one_scale_per_quantity(
    csp_page: Any,  # noqa: F811
    asgi_server: Any,
    researcher: Any,
    login: Any,
) -> None:
    """A GRPO run as the trainer logs it: value/mean zeros and explained variance NaN (no value model),
    two eval points at steps 5 and 6 of quantities on different scales, DPO's preference rewards and a
    key that only ever held NaN."""
    from webapp.runs import ingest, services

    run = services.create_run({"name": "grpo charts", "algorithm": {"id": "grpo"}}, user=researcher)
    points = [("train/reward_mean", s, 0.05 + 0.01 * s) for s in range(10)]
    points += [("value/mean", s, 0.0) for s in range(10)] + [
        ("value/explained_var", s, None) for s in range(10)
    ]
    points += [("loss/policy", s, 0.1) for s in range(10)] + [("train/loss", s, 0.69) for s in range(10)]
    points += [("eval/reward_mean", 5, 0.05), ("eval/reward_mean", 6, 0.07)]
    points += [("eval/diversity/vocab_size", 5, 70.0), ("eval/diversity/vocab_size", 6, 72.0)]
    points += [("rewards/accuracy", s, 0.5) for s in range(10)] + [
        ("misc/nothing", s, None) for s in range(10)
    ]
    ingest.ingest_metrics(run.pk, points)

    page = csp_page
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/runs/{run.pk}/")
    charts = page.locator("#charts .chart")
    expect(page.locator("#charts .chart[data-group='reward']")).to_have_count(1)
    expect(page.locator("#charts .chart[data-group='eval']")).to_have_count(2)  # one scale per quantity
    expect(page.locator("#charts .chart[data-group='value']")).to_have_count(0)  # GRPO has no value model
    expect(page.locator("#charts .chart[data-group='other']")).to_have_count(0)  # no empty "Other"
    expect(page.locator("#charts .chart[data-group='preference']")).to_have_count(1)  # DPO's own card
    titles = page.locator("#charts .chart-card h3").all_text_contents()
    assert (
        "Eval metrics · eval/diversity/vocab_size" in titles and "Eval metrics · eval/reward_mean" in titles
    )
    assert "Value" not in titles and "Other" not in titles, titles
    assert charts.count() == len(titles)

    for key in ("eval/reward_mean", "eval/diversity/vocab_size"):
        chart = page.locator(f"#charts .chart[data-key='{key}']")
        chart.scroll_into_view_if_needed()
        expect(chart.locator(".xtick text").first).to_be_visible()
        ticks = chart.locator(".xtick text").all_text_contents()
        assert ticks == ["5", "6"], ticks  # whole steps, not 5, 5.2, ... 6
    # Two curves in one chart have a legend, and it does not cover the step axis's title.
    losses = page.locator("#charts .chart[data-group='loss']")
    losses.scroll_into_view_if_needed()
    expect(losses.locator(".legend")).to_be_visible()
    legend, title = losses.locator(".legend").bounding_box(), losses.locator(".g-xtitle").bounding_box()
    assert legend and title and not _boxes_overlap(legend, title), (legend, title)


def _finished_run(name: str, config: dict[str, Any], eval_metrics: dict[str, float]) -> Run:
    """A succeeded run with its final evaluation, as the leaderboard reads it (``Run.summary``)."""
    from webapp.runs.models import RunStatus

    return Run.objects.create(
        name=name,
        config=config,
        status=RunStatus.SUCCEEDED,
        algorithm=config["algorithm"]["id"],
        task=config["task"]["id"],
        summary={"eval": {f"eval/{k}": v for k, v in eval_metrics.items()}},
    )


@pytest.mark.django_db(transaction=True)
def test_the_grue_page_has_columns_for_grpo_a2c_trpo_and_dpo(
    csp_page: Any,  # noqa: F811
    asgi_server: Any,
    researcher: Any,
    login: Any,
) -> None:
    synthetic = {"id": "synthetic_increasing_numbers"}
    grpo = _finished_run("grpo run", {"task": synthetic, "algorithm": {"id": "grpo"}}, {"reward_mean": 0.8})
    a2c = _finished_run("a2c run", {"task": synthetic, "algorithm": {"id": "a2c"}}, {"reward_mean": 0.4})
    rloo = _finished_run("rloo run", {"task": synthetic, "algorithm": {"id": "rloo"}}, {"reward_mean": 0.6})
    pairs = {"id": "preference_pairs", "args": {"path": "pairs.jsonl"}}
    dpo = _finished_run(
        "dpo run", {"task": pairs, "algorithm": {"id": "dpo"}}, {"semantic/sentiment_vader": 0.3}
    )

    page = csp_page
    login(page, asgi_server.url, researcher)
    page.goto(f"{asgi_server.url}/grue/")
    headers = page.locator("#grue-table thead th").all_text_contents()
    for label in ("PPO", "A2C", "TRPO", "GRPO", "DPO", "RLOO"):
        assert label in headers, headers
    assert "REINFORCE++" not in headers  # an optional column appears once a run fills it
    row = page.locator("#grue-table tr[data-task='synthetic_increasing_numbers']")
    expect(row.locator("td[data-algorithm='grpo'] a")).to_have_attribute("href", f"/runs/{grpo.pk}/")
    expect(row.locator("td[data-algorithm='a2c'] a")).to_have_attribute("href", f"/runs/{a2c.pk}/")
    expect(row.locator("td[data-algorithm='rloo'] a")).to_have_attribute("href", f"/runs/{rloo.pk}/")
    # DPO on preference pairs joins the row of the metric it evaluated (IMDB's sentiment).
    imdb_row = page.locator("#grue-table tr[data-task='imdb']")
    expect(imdb_row.locator("td[data-algorithm='dpo'] a").first).to_have_attribute("href", f"/runs/{dpo.pk}/")
    # An empty cell of a new column links to its CPU preset.
    expect(imdb_row.locator("td[data-algorithm='grpo'] a.launch-preset code")).to_have_text(
        "imdb_grpo_offline"
    )
    expect(imdb_row.locator("td[data-algorithm='trpo'] a.launch-preset code")).to_have_text(
        "imdb_trpo_offline"
    )


@pytest.mark.django_db(transaction=True)
def test_one_click_dpo_opens_with_defaults_that_learn(
    csp_page: Any,  # noqa: F811
    asgi_server: Any,
    researcher: Any,
    login: Any,
) -> None:
    """The results page's DPO button opens the launch form with learning rate 1e-5 (TRL's 1e-6 left
    train/loss at ln 2 over the few dozen steps a campaign's pairs give; the measured run is in
    docs/annotation.md) and three passes over the pairs."""
    from annotation import assignment, campaigns, invites
    from tests.annotation.conftest import NEGATIVE, POSITIVE, make_run, make_user

    prompts = [f"Prompt number {i}:" for i in range(6)]
    good = make_run("good-run", prompts, [f"a {POSITIVE[i]} answer" for i in range(6)])
    bad = make_run("bad-run", prompts, [f"a {NEGATIVE[i]} answer" for i in range(6)])
    for run in (good, bad):
        run.config = {"model": {"name_or_path": "builtin:tiny-gpt2"}}
        run.save(update_fields=["config"])
    camp = campaigns.create_campaign_from_runs("dpo defaults", [good.pk, bad.pk], overlap=1)
    judge = make_user("dpo-defaults-judge")
    invites.add_member(camp, judge)
    campaigns.start_campaign(camp)
    while (a := assignment.next_item(camp, judge)) is not None:
        good_left = (a.item.system_a == f"run:{good.pk}") == a.left_is_a
        assignment.record_judgment(judge, a.token, item_id=a.item_id, choice="left" if good_left else "right")

    page = csp_page
    base = asgi_server.url
    login(page, base, researcher, next_url=f"/annotate/campaigns/{camp.pk}/results/")
    page.click("#dpo-button")
    page.wait_for_url(f"{base}/launch/?dpo_campaign={camp.pk}")
    expect(page.locator("select[name=algorithm__id]")).to_have_value("dpo")
    assert float(page.locator("input[name=algorithm__learning_rate]").input_value()) == 1e-5
    expect(page.locator("input[name=train__n_iters]")).to_have_value("3")  # 3 passes over 6 pairs
