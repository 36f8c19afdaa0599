"""AI judges beside the human annotators of a pairwise campaign (RLAIF-style AI feedback).

An AI judge judges every non-gold item twice, once with system a's output shown first and once with
system b's shown first. The item's verdict is the system that wins both passes; two passes that
disagree (or a pass without a verdict) make a tie, as LLM-as-a-judge practice recommends (Zheng et
al. 2023, "Judging LLM-as-a-judge"), because a judge that follows the position is not judging.

AI judges are not users and cannot log in: a judge is a row of its campaign (:class:`AIJudge`) and
its passes live in their own table (:class:`AIJudgment`). Human-only code (assignment, agreement
between annotators, the human ranking) never sees them; results, reward models and DPO take them in
only when asked, through an explicit ``source``: ``human``, ``ai`` or ``both``.

Judging runs in the worker (``annotation.tasks.run_ai_judge``, queued by name after the transaction
commits), item by item, each item's two passes written in one transaction; items that already have
both passes are skipped, so running a judge again fills in what is missing and never duplicates.
Progress, ETA and cancellation go through the judge's row.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import defaultdict
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from annotation import stats
from annotation.ai_backends import SMOLLM2, EndpointJudge, JudgeCallError, LocalLMJudge, Verdict
from annotation.errors import AnnotationError
from annotation.models import (
    AIJudge,
    AIJudgeKind,
    AIJudgeStatus,
    AIJudgment,
    Campaign,
    CampaignKind,
    Item,
    Judgment,
)
from engine import netguard, templates
from webapp.celery import app as celery_app
from webapp.runs import paths
from webapp.runs.workers import run_queue

JUDGE_TASK = "annotation.tasks.run_ai_judge"
SOURCES = ("human", "ai", "both")
#: Consecutive failed calls after which a judging job stops (a wrong key or a dead endpoint).
MAX_CONSECUTIVE_ERRORS = 5

DEFAULT_TEMPLATE = """You are judging two responses to the same input.
{instructions}
Criteria: {axes}

Input:
{prompt}

Response A:
{response_a}

Response B:
{response_b}

Which response is better? Answer with a single letter, A or B.
Answer:"""

#: The placeholders a prompt template may use, and nothing else (no attributes, indexes or formats).
TEMPLATE_FIELDS = ("instructions", "axes", "prompt", "response_a", "response_b")
ACTIVE = (AIJudgeStatus.QUEUED, AIJudgeStatus.RUNNING)


# ---------------------------------------------------------------------------------------- templates


def check_template(template: str) -> str:
    """A prompt template, or :class:`AnnotationError` naming the first placeholder that is not allowed.

    Templates are user text: they are never evaluated, never Django templates and never given to
    ``str.format`` (which would follow ``{prompt.__class__}``); only bare known names are substituted
    (:mod:`engine.templates`, which GSM8K's prompt template uses too).
    """
    try:
        return templates.check_template(template, TEMPLATE_FIELDS, ("response_a", "response_b"))
    except templates.TemplateError as exc:
        raise AnnotationError(str(exc)) from None


def render_template(template: str, values: dict[str, str]) -> str:
    """Substitute the known fields (after :func:`check_template`); the values are inserted verbatim."""
    return templates.render_template(template, values)


def axes_text(camp: Campaign) -> str:
    names = [a.get("name", "") for a in camp.axes or [] if isinstance(a, dict)]
    return ", ".join(n for n in names if n) or "overall quality"


def pass_prompt(judge: AIJudge, item: Item, a_first: bool) -> str:
    """The prompt of one pass: system a's output as "Response A" when ``a_first``, else as "Response B"."""
    camp = judge.campaign
    first, second = (item.output_a, item.output_b) if a_first else (item.output_b, item.output_a)
    return render_template(
        judge.prompt_template,
        {"instructions": camp.instructions or "", "axes": axes_text(camp), "prompt": item.prompt,
         "response_a": first, "response_b": second},
    )  # fmt: skip


# ------------------------------------------------------------------------------------- validation


def outbound_allow() -> netguard.AllowList:
    """The deployment's exceptions to the outbound policy (``GRUE_OUTBOUND_ALLOW``: a judge server
    of its own on a private address); empty by default."""
    return netguard.parse_allow(getattr(settings, "OUTBOUND_ALLOW", ()))


def check_base_url(url: str) -> str:
    """An http(s) URL with a host, without credentials, query or fragment (the key goes in a header),
    whose host is not an internal address (:mod:`engine.netguard`; ``GRUE_OUTBOUND_ALLOW`` exempts
    a private judge server). A name that does not resolve now is accepted: every call checks again."""
    url = (url or "").strip()
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise AnnotationError(f"base URL: {url[:80]!r} is not an http(s) URL, e.g. https://api.openai.com/v1")
    if parts.username or parts.password or parts.query or parts.fragment:
        raise AnnotationError(
            "base URL: no user, password, query or fragment (put the key in the API key field)"
        )
    try:
        netguard.check_url(url, allow=outbound_allow())
    except netguard.AddressNotAllowed as exc:
        raise AnnotationError(f"base URL: {exc}") from None
    except netguard.OutboundError:
        pass  # DNS is down or the name is not published yet: judged again before every call
    return url.rstrip("/")


def check_local_model(model: str) -> str:
    """``smollm2``, a builtin model, a hub id, or a local directory inside the read roots."""
    model = (model or SMOLLM2).strip()
    if model.lower() == SMOLLM2 or paths.is_model_reference_safe(model):
        return model
    return str(paths.check_path(model, paths.read_roots()))


def create_judge(
    camp: Campaign,
    *,
    name: str,
    kind: str = AIJudgeKind.LOCAL,
    model: str = "",
    base_url: str = "",
    api_key: str = "",
    prompt_template: str = "",
    user: Any = None,
) -> AIJudge:
    """Add an AI annotator to a pairwise campaign (validated; nothing is judged until :func:`start_judging`)."""
    if camp.kind != CampaignKind.PAIRWISE:
        raise AnnotationError("AI judges judge pairwise campaigns; this is a Likert campaign")
    name = (name or "").strip()[:100]
    if not name:
        raise AnnotationError("AI judge: name is required")
    if camp.ai_judges.filter(name=name).exists():
        raise AnnotationError(f"AI judge: this campaign already has a judge named {name!r}")
    template = check_template(prompt_template or DEFAULT_TEMPLATE)
    if kind == AIJudgeKind.LOCAL:
        try:
            model = check_local_model(model)
        except Exception as exc:  # noqa: BLE001 - PathNotAllowed names the path
            raise AnnotationError(f"model: {exc}") from None
        base_url, api_key = "", ""
    elif kind == AIJudgeKind.ENDPOINT:
        base_url = check_base_url(base_url)
        model = (model or "").strip()
        if not model:
            raise AnnotationError("model: the endpoint's model name is required (e.g. gpt-4o-mini)")
        if len(api_key) > 500:
            raise AnnotationError("API key: longer than 500 characters")
    else:
        raise AnnotationError(f"kind: {kind!r} is not one of {', '.join(AIJudgeKind.values)}")
    return AIJudge.objects.create(
        campaign=camp, name=name, kind=kind, model=model[:500], base_url=base_url, api_key=api_key.strip(),
        prompt_template=template, created_by=user if getattr(user, "is_authenticated", False) else None,
    )  # fmt: skip


# ------------------------------------------------------------------------------- queue and cancel


def start_judging(judge: AIJudge, enqueue: bool = True) -> AIJudge:
    """Queue a judging job (after the transaction commits); a job already queued or running is kept."""
    with transaction.atomic():
        judge = AIJudge.objects.select_for_update().get(pk=judge.pk)
        if judge.status in ACTIVE:
            raise AnnotationError(f"AI judge {judge.name!r} is already {judge.status}")
        if not judge.campaign.items.filter(gold="").exists():
            raise AnnotationError("the campaign has no items to judge")
        judge.status = AIJudgeStatus.QUEUED
        judge.task_id = uuid.uuid4().hex
        judge.cancel_requested = False
        judge.error = ""
        judge.eta_seconds = None
        judge.finished_at = None
        judge.save(
            update_fields=["status", "task_id", "cancel_requested", "error", "eta_seconds", "finished_at"]
        )
        if enqueue:
            jid, tid = judge.pk, judge.task_id
            transaction.on_commit(lambda: _enqueue(jid, tid))
    return judge


def _enqueue(judge_id: int, task_id: str) -> None:
    """Send by name (the web side never imports the worker's task module); a broker that does not
    answer fails the job with the reason instead of hanging the request."""
    try:
        with celery_app.connection_for_write() as conn:
            conn.ensure_connection(max_retries=1, interval_start=0, interval_step=0.2, interval_max=0.5)
            celery_app.send_task(
                JUDGE_TASK, args=[judge_id, task_id], queue=run_queue(), task_id=task_id, retry=False,
                connection=conn,
            )  # fmt: skip
    except Exception as exc:  # noqa: BLE001 - kombu/redis raise many types for "broker down"
        AIJudge.objects.filter(pk=judge_id, task_id=task_id).update(
            status=AIJudgeStatus.FAILED, error=f"could not queue: {exc}", finished_at=timezone.now()
        )


def cancel_judging(judge: AIJudge) -> AIJudge:
    """The judge is cancelled at once (so a job whose worker died can be run again); a worker still
    running it stops after its current item, whose passes are kept, like everything judged before.

    A worker only ever writes to the row while the row still names its task id and is not cancelled
    (:func:`run_judging`), so a new run started right after a cancel is never disturbed by the old one.
    """
    with transaction.atomic():
        judge = AIJudge.objects.select_for_update().get(pk=judge.pk)
        if judge.status not in ACTIVE:
            raise AnnotationError(f"AI judge {judge.name!r} is not running")
        judge.status = AIJudgeStatus.CANCELLED
        judge.finished_at = timezone.now()
        judge.eta_seconds = None
        judge.cancel_requested = True
        judge.save(update_fields=["status", "finished_at", "eta_seconds", "cancel_requested"])
    return judge


def delete_judge(judge: AIJudge) -> None:
    if judge.status in ACTIVE:
        raise AnnotationError(f"cancel AI judge {judge.name!r} before deleting it")
    judge.delete()


# ---------------------------------------------------------------------------------------- judging


def make_backend(judge: AIJudge) -> Any:
    if judge.kind == AIJudgeKind.LOCAL:
        return LocalLMJudge(judge.model)
    return EndpointJudge(
        judge.base_url, judge.api_key, judge.model,
        timeout=float(getattr(settings, "ANNOTATION_AI_TIMEOUT", 60.0)),
        retries=int(getattr(settings, "ANNOTATION_AI_RETRIES", 2)),
        retry_delay=float(getattr(settings, "ANNOTATION_AI_RETRY_DELAY", 2.0)),
        allow=outbound_allow(),
    )  # fmt: skip


def pass_row(judge: AIJudge, item: Item, a_first: bool, v: Verdict) -> AIJudgment:
    """A pass in system terms: "A" is the first response shown, which is system a when ``a_first``."""
    if v.label in ("A", "B"):
        first_won = v.label == "A"
        choice = "a" if first_won == a_first else "b"
    else:
        choice = "tie"
    return AIJudgment(
        judge=judge, campaign_id=item.campaign_id, item=item, a_first=a_first, label=v.label, choice=choice,
        p_first=v.p_first, p_second=v.p_second, reply=v.reply[:10_000],
    )  # fmt: skip


def _mine(judge_id: int, task_id: str) -> Any:
    """The judge's row while this job still owns it: same task id, running, not cancelled."""
    return AIJudge.objects.filter(
        pk=judge_id, task_id=task_id, status=AIJudgeStatus.RUNNING, cancel_requested=False
    )


def _finish(judge_id: int, task_id: str, status: str, **fields: Any) -> None:
    _mine(judge_id, task_id).update(status=status, finished_at=timezone.now(), eta_seconds=None, **fields)


def _claim(judge_id: int, task_id: str | None) -> tuple[AIJudge, list[Item], dict[int, set[bool]]] | None:
    """Queued → running in one conditional update (None when the job is not ours to run), then the
    campaign's items and, per item, the sides already judged (``a_first`` values)."""
    claim = AIJudge.objects.filter(pk=judge_id, status=AIJudgeStatus.QUEUED)
    if task_id is not None:
        claim = claim.filter(task_id=task_id)
    items = list(Item.objects.filter(campaign__ai_judges__pk=judge_id, gold="").order_by("order", "id"))
    if not claim.update(
        status=AIJudgeStatus.RUNNING, started_at=timezone.now(), n_total=len(items), n_errors=0, error=""
    ):
        return None
    judge = AIJudge.objects.select_related("campaign").get(pk=judge_id)
    have: dict[int, set[bool]] = defaultdict(set)
    for item_id, a_first in AIJudgment.objects.filter(judge=judge).values_list("item_id", "a_first"):
        have[item_id].add(a_first)
    return judge, items, have


def run_judging(judge_id: int, task_id: str | None = None, backend: Any = None) -> AIJudge:
    """The worker's job: claim the queued judge, judge every item that lacks a pass, record progress.

    The claim is a conditional update (queued → running, same task id), so a cancelled job or a
    redelivered message judges nothing. Afterwards the job writes progress only while the row still
    names its task id, and finishes (or goes on to the next item) only while the row is running and not
    cancelled (:func:`_mine`): a cancel ends the loop after the current item, and a newer run is never
    disturbed by an older one. Each item's missing passes are decided, then stored in one transaction
    with the progress; the unique (judge, item, side) constraint makes a duplicate impossible. A call
    error leaves the item without judgments (counted in ``n_errors``, retried by the next run);
    ``MAX_CONSECUTIVE_ERRORS`` in a row fail the job.
    """
    claimed = _claim(judge_id, task_id)
    if claimed is None:
        return AIJudge.objects.get(pk=judge_id)
    judge, items, have = claimed
    task = judge.task_id
    ours = AIJudge.objects.filter(pk=judge_id, task_id=task)
    todo = [it for it in items if len(have[it.pk]) < 2]
    done = len(items) - len(todo)
    ours.update(n_done=done)
    try:
        if todo and backend is None:
            backend = make_backend(judge)
    except Exception as exc:  # noqa: BLE001 - any loading failure is the job's failure, with its reason
        _finish(
            judge_id,
            task,
            AIJudgeStatus.FAILED,
            error=f"could not load the judge: {type(exc).__name__}: {exc}",
        )
        return AIJudge.objects.get(pk=judge_id)
    t0 = time.monotonic()
    n_errors = consecutive = judged = 0
    last_error = ""
    for item in todo:
        if not _mine(judge_id, task).exists():  # cancelled, or a newer run owns the judge
            return AIJudge.objects.get(pk=judge_id)
        try:
            rows = [pass_row(judge, item, a_first, backend.judge(pass_prompt(judge, item, a_first)))
                    for a_first in (True, False) if a_first not in have[item.pk]]  # fmt: skip
        except JudgeCallError as exc:
            n_errors += 1
            consecutive += 1
            last_error = f"item {item.pk}: {exc}"
            ours.update(n_errors=n_errors, error=last_error)
            if consecutive >= MAX_CONSECUTIVE_ERRORS:
                _finish(judge_id, task, AIJudgeStatus.FAILED,
                        error=f"stopped after {consecutive} failed calls in a row; last: {last_error}")  # fmt: skip
                return AIJudge.objects.get(pk=judge_id)
            continue
        except Exception as exc:  # noqa: BLE001 - a model error fails the job, with its reason
            _finish(
                judge_id, task, AIJudgeStatus.FAILED, error=f"item {item.pk}: {type(exc).__name__}: {exc}"
            )
            return AIJudge.objects.get(pk=judge_id)
        consecutive = 0
        judged += 1
        done += 1
        eta = (time.monotonic() - t0) / judged * (len(items) - done)
        with transaction.atomic():
            AIJudgment.objects.bulk_create(rows, ignore_conflicts=True)
            ours.update(n_done=done, eta_seconds=eta)
    if n_errors and not judged:
        _finish(
            judge_id, task, AIJudgeStatus.FAILED, error=f"no item could be judged; last error: {last_error}"
        )
    else:
        msg = (
            f"{n_errors} item(s) could not be judged (last error: {last_error}); run the judge again to retry them"
            if n_errors
            else ""
        )
        _finish(judge_id, task, AIJudgeStatus.SUCCEEDED, error=msg)
    return AIJudge.objects.get(pk=judge_id)


# ----------------------------------------------------------------------------------- verdicts/stats


def item_verdict(choices: list[str]) -> str:
    """Both passes name the same system → that system; otherwise (inconsistent, or no verdict) → tie."""
    if len(choices) == 2 and choices[0] == choices[1] and choices[0] in ("a", "b"):
        return choices[0]
    return "tie"


def ai_passes(camp: Campaign, include_gold: bool = False) -> dict[int, dict[int, dict[bool, dict[str, Any]]]]:
    """{judge id: {item id: {a_first: pass}}} of a campaign's AI judgments."""
    qs = AIJudgment.objects.filter(campaign=camp)
    if not include_gold:
        qs = qs.filter(item__gold="")
    out: dict[int, dict[int, dict[bool, dict[str, Any]]]] = defaultdict(lambda: defaultdict(dict))
    for r in qs.values("judge_id", "item_id", "a_first", "label", "choice", "p_first", "p_second"):
        out[r["judge_id"]][r["item_id"]][r["a_first"]] = r
    return out


def ai_verdicts(camp: Campaign, include_gold: bool = False) -> list[dict[str, Any]]:
    """One row per (judge, item) with both passes: the item's AI verdict and the judge's name."""
    names = dict(camp.ai_judges.values_list("pk", "name"))
    items = {
        i["id"]: i
        for i in camp.items.values(
            "id", "system_a", "system_b", "prompt", "output_a", "output_b", "key", "gold"
        )
    }
    out = []
    for jid, per_item in ai_passes(camp, include_gold).items():
        for item_id, passes in per_item.items():
            if len(passes) < 2:
                continue
            it = items[item_id]
            out.append({"judge_id": jid, "judge": names.get(jid, str(jid)), "item_id": item_id,
                        "choice": item_verdict([passes[True]["choice"], passes[False]["choice"]]),
                        "system_a": it["system_a"], "system_b": it["system_b"], "prompt": it["prompt"],
                        "output_a": it["output_a"], "output_b": it["output_b"], "key": it["key"],
                        "gold": it["gold"]})  # fmt: skip
    out.sort(key=lambda r: (r["judge_id"], r["item_id"]))
    return out


def check_source(source: str | None) -> str:
    source = (source or "human").strip().lower()
    if source not in SOURCES:
        raise AnnotationError(f"source: {source[:20]!r} is not one of human, ai, both")
    return source


def human_majorities(camp: Campaign) -> dict[int, str | None]:
    """Each non-gold item's strict-plurality human label (None when the humans split evenly)."""
    labels: dict[int, list[str]] = defaultdict(list)
    for item_id, choice in Judgment.objects.filter(campaign=camp, item__gold="").values_list(
        "item_id", "choice"
    ):
        labels[item_id].append(choice)
    return {i: stats.majority_label(v) for i, v in labels.items()}


def judge_panel(camp: Campaign) -> list[dict[str, Any]]:
    """Per AI judge, what the results page shows: counts, position bias and agreement with the humans."""
    majority = human_majorities(camp)
    passes = ai_passes(camp)
    out = []
    for judge in camp.ai_judges.all():
        per_item = {i: p for i, p in passes.get(judge.pk, {}).items() if len(p) == 2}
        rows = [
            {"item": i, "passes": [(p[True]["label"], p[True]["choice"]), (p[False]["label"], p[False]["choice"])],
             "human": majority.get(i)}
            for i, p in sorted(per_item.items())
        ]  # fmt: skip
        agreement = stats.ai_judge_agreement(rows)
        warnings = judge_warnings(agreement)
        out.append({"id": judge.pk, "name": judge.name, "kind": judge.kind, "model": judge.model,
                    "status": judge.status, "status_label": judge.get_status_display(), **agreement,
                    "warnings": warnings, "advice": ADVICE if warnings else ""})  # fmt: skip
    return out


# ------------------------------------------------------------------------- an uninformative judge

#: When a judge's results are flagged (docs/annotation.md, "When an AI judge is uninformative"). Each
#: needs at least ``WARN_MIN_N`` observations, so two or three items never raise a warning.
WARN_MIN_N = 8
#: Position bias: the exact two-sided binomial test of first-position wins against 1/2 rejects at
#: this level, and the rate is at least this far from 1/2 (a large campaign's 53 % is significant
#: but harmless: the swap rule absorbs it).
POSITION_ALPHA = 0.01
POSITION_RATE = 0.75
#: Ties: this share of items ended as ties after the swap (the judge separates almost nothing).
TIE_RATE = 0.8
#: Agreement: Cohen's kappa against the human majority at or below this (chance level).
KAPPA_CHANCE = 0.05

ADVICE = (
    "What to try: another judge model (a larger or instruction-tuned local model, or an "
    "OpenAI-compatible endpoint); a different prompt template (state the criteria, ask for one letter, "
    "repeat the question after both responses); swap-averaging for a local judge: compare each "
    "system's probability averaged over both orders instead of asking both passes to agree (every "
    "pass's probabilities are in the CSV of AI passes)."
)


def binomial_two_sided_p(k: int, n: int) -> float:
    """Exact two-sided p-value of ``k`` successes in ``n`` fair coin flips (the probability of an
    outcome at least as far from n/2): how surprising a judge's first-position count is if position
    did not matter."""
    if n <= 0:
        return 1.0
    tail = min(k, n - k)
    total = sum(math.comb(n, i) for i in range(tail + 1))
    return min(1.0, 2 * total / 2**n)


def judge_warnings(agreement: dict[str, Any]) -> list[str]:
    """Why a judge's verdicts carry (almost) no information, one sentence per reason; empty when
    none applies. ``agreement`` is ``stats.ai_judge_agreement``'s result."""
    out: list[str] = []
    n_passes = agreement.get("n_decided_passes") or 0
    rate = agreement.get("first_position_rate")
    if rate is not None and n_passes >= WARN_MIN_N:
        first = round(rate * n_passes)
        p = binomial_two_sided_p(first, n_passes)
        if p < POSITION_ALPHA and abs(rate - 0.5) >= POSITION_RATE - 0.5:
            side, count = ("first", first) if rate > 0.5 else ("second", n_passes - first)
            out.append(
                f"Position bias: it chose the {side}-shown response in {count} of {n_passes} decided passes "
                f"(exact binomial test against 50 %: p = {p:.2g}), whatever the responses said."
            )
    n_items = agreement.get("n_items") or 0
    ties = (agreement.get("verdicts") or {}).get("tie", 0)
    if n_items >= WARN_MIN_N and ties / n_items >= TIE_RATE:
        out.append(
            f"Ties: {ties} of {n_items} items ended as ties after the swap (its two passes rarely named "
            "the same system), so it ranks almost nothing."
        )
    kappa = agreement.get("kappa")
    if kappa is not None and (agreement.get("n_kappa") or 0) >= WARN_MIN_N and kappa <= KAPPA_CHANCE:
        out.append(
            f"Agreement: κ = {kappa:.2f} against the human majority on {agreement['n_kappa']} items, "
            "no better than chance."
        )
    return out
