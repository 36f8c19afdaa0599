"""What the annotation app plugs into the runs app (``webapp.runs.extensions``) and the HTTP API
(``webapp.api.extensions``), from ``ready()``: trained reward models as launch-form reward choices, a
run's human-evaluation panel, the DPO launch source and the ``/api/v1/campaigns`` endpoints.
Neither app imports anything from here; removing this app removes all of them."""

from __future__ import annotations

from django.http import HttpRequest
from django.template.loader import render_to_string

from annotation import api, campaigns
from annotation.checkpoint_views import checkpoints_panel
from annotation.dpo import launch_config as dpo_launch_config
from annotation.results import human_eval_for_run
from annotation.reward_models import reward_choices
from webapp.api import extensions as api_extensions
from webapp.runs import extensions
from webapp.runs.models import Run


def human_eval_panel(request: HttpRequest, run: Run) -> str:
    """The run's rank and interval in every started campaign that judged it (or how to start one)."""
    return render_to_string(
        "annotation/_run_human_eval.html", {"rows": human_eval_for_run(run), "run": run}, request=request
    )


def register() -> None:
    extensions.register_reward_choices(reward_choices)
    extensions.register_run_panel("human-eval", human_eval_panel, order=50)
    extensions.register_launch_source("dpo_campaign", dpo_launch_config)
    # the over-optimisation watch's human gold: campaigns over a run's checkpoints (issue 28 §2)
    extensions.register_run_panel("checkpoints-human", checkpoints_panel, order=55)
    extensions.register_gold_source("human-checkpoints", campaigns.checkpoint_human_gold)
    api_extensions.register_routes("campaigns", api.routes())
