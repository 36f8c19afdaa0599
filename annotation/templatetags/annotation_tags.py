"""``{% load annotation_tags %}{% human_eval_panel run %}``: a run's human-evaluation results on its page."""

from __future__ import annotations

from typing import Any

from django import template

register = template.Library()


@register.inclusion_tag("annotation/_run_human_eval.html")
def human_eval_panel(run: Any) -> dict[str, Any]:
    from annotation.services import human_eval_for_run

    try:
        rows = human_eval_for_run(run)
    except Exception:  # noqa: BLE001 - a run page must render even if annotation tables are missing
        rows = []
    return {"rows": rows, "run": run}
