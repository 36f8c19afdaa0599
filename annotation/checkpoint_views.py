"""“Compare this run's checkpoints with people” (issue 28 §2): the run page's panel that creates a
pairwise campaign over a run's checkpoints and lists those campaigns, and its POST endpoint.

The campaign is built by :func:`annotation.campaigns.create_campaign_from_checkpoints`; its
Bradley–Terry ratings feed the run's over-optimisation panel as a human gold through the runs app's
gold-source extension (``annotation.plugins``). Researchers only; annotators see only annotation.
"""

from __future__ import annotations

from django.contrib import messages
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string
from django.urls import reverse
from django.views.decorators.http import require_POST

from annotation import campaigns
from annotation.errors import AnnotationError
from webapp.access import researcher_required
from webapp.runs import gold_jobs
from webapp.runs.models import Run


def _int(value: str | None, field: str) -> int | None:
    if value is None or not str(value).strip():
        return None
    try:
        return int(value)
    except ValueError:
        raise AnnotationError(f"{field}: {str(value)[:20]!r} is not a whole number") from None


@researcher_required
@require_POST
def checkpoints_campaign(request: HttpRequest, run_id: int) -> HttpResponse:
    run = get_object_or_404(Run, pk=run_id)
    try:
        overlap = _int(request.POST.get("overlap"), "overlap") or 1
        if overlap < 1:
            raise AnnotationError("overlap: must be at least 1")
        camp = campaigns.create_campaign_from_checkpoints(
            request.POST.get("name", "").strip()[:200],
            run.pk,
            user=request.user,
            overlap=overlap,
            max_items=_int(request.POST.get("max_items"), "max items"),
        )
    except AnnotationError as exc:
        messages.error(request, f"Campaign not created: {exc}", extra_tags="checkpoints-campaign-error")
        return redirect(reverse("runs:detail", args=[run.pk]) + "#checkpoints-human")
    messages.success(
        request,
        f"Campaign created over {len(camp.systems)} checkpoints with {camp.items.count()} items; "
        "invite annotators and start it. Its ratings appear in the run's over-optimisation panel.",
    )
    return redirect("annotation:campaign_detail", pk=camp.pk)


def checkpoints_panel(request: HttpRequest, run: Run) -> str | None:
    """The run page's panel: the button, and the campaigns over this run's checkpoints."""
    n_ckpts = len(gold_jobs.existing_checkpoints(run.pk)[0])  # the pruned ones cannot be compared
    camps = campaigns.campaign_counts(campaigns.checkpoint_campaigns(run.pk))
    if n_ckpts < 2 and not camps:
        return None
    return render_to_string(
        "annotation/_run_checkpoints_human.html",
        {"run": run, "rows": camps, "n_checkpoints": n_ckpts},
        request=request,
    )
