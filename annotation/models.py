"""Rows of human evaluation: campaigns, items, assignments, judgments, reward models.

Concurrency invariant (enforced in the database by ``assignment.next_item``): an item's
``slots_taken`` counts its open assignments plus its judgments and never exceeds the campaign's
``overlap``. Pairwise outcomes are stored in system terms ("a" = ``Item.system_a`` won), never in
screen terms; the left/right placement shown to the annotator is stored on the assignment and the
judgment so that position bias can be audited.
"""

from __future__ import annotations

import secrets

from django.conf import settings
from django.db import models


class CampaignKind(models.TextChoices):
    PAIRWISE = "pairwise", "pairwise (A vs B)"
    LIKERT = "likert", "Likert (1–5 per axis)"


class Pairing(models.TextChoices):
    ALL_PAIRS = "all_pairs", "all pairs of systems"
    VS_BASELINE = "vs_baseline", "every system against a baseline"


class AssignmentMode(models.TextChoices):
    """How ``assignment.next_item`` chooses among the items an annotator may still see."""

    UNIFORM = "uniform", "uniform: least-judged item first"
    ADAPTIVE = "adaptive", "adaptive: the most informative pair of systems first"


class CampaignStatus(models.TextChoices):
    DRAFT = "draft", "draft"
    ACTIVE = "active", "active"
    CLOSED = "closed", "closed"


class Choice(models.TextChoices):
    A = "a", "A better"
    B = "b", "B better"
    TIE = "tie", "tie"
    BOTH_BAD = "both_bad", "both bad"


DEFAULT_AXES = [
    {
        "name": "fluency",
        "labels": [
            "1 – incomprehensible",
            "2 – many errors",
            "3 – some errors",
            "4 – minor slips",
            "5 – perfectly fluent",
        ],
    },
    {
        "name": "relevance",
        "labels": [
            "1 – unrelated",
            "2 – barely related",
            "3 – partly on topic",
            "4 – mostly on topic",
            "5 – fully on topic",
        ],
    },
]


# Likert axes of the RL4LMs human-evaluation templates (Ramamurthy et al. 2023, appendix), 1–5 each.
AXES_PRESETS = {
    "generic": DEFAULT_AXES,
    "imdb": [
        {"name": "coherence", "labels": ["1 – incoherent", "2 – mostly incoherent", "3 – partly coherent",
                                         "4 – mostly coherent", "5 – fully coherent with the review"]},
        {"name": "sentiment", "labels": ["1 – very negative", "2 – negative", "3 – neutral", "4 – positive",
                                         "5 – very positive"]},
    ],
    "commongen": [
        {"name": "fluency", "labels": ["1 – not a sentence", "2 – many errors", "3 – understandable",
                                       "4 – minor errors", "5 – fluent"]},
        {"name": "commonsense", "labels": ["1 – impossible scene", "2 – implausible", "3 – odd but possible",
                                           "4 – plausible", "5 – perfectly natural"]},
    ],
    "dialogue": [
        {"name": "fluency", "labels": ["1 – broken", "2 – many errors", "3 – understandable", "4 – minor errors",
                                       "5 – fluent"]},
        {"name": "relevance", "labels": ["1 – ignores the context", "2 – barely related", "3 – partly relevant",
                                         "4 – relevant", "5 – highly relevant and engaging"]},
    ],
}  # fmt: skip


class Campaign(models.Model):
    name = models.CharField(max_length=200)
    kind = models.CharField(max_length=16, choices=CampaignKind.choices, default=CampaignKind.PAIRWISE)
    instructions = models.TextField(blank=True)
    # Worked examples shown above the form: [{"prompt", "output" | ("left", "right"), "answer", "why"}].
    examples = models.JSONField(default=list, blank=True)
    # Likert axes: [{"name": str, "labels": [5 anchored labels, score 1..5]}].
    axes = models.JSONField(default=list, blank=True)
    overlap = models.PositiveIntegerField(default=3)
    pairing = models.CharField(max_length=16, choices=Pairing.choices, default=Pairing.ALL_PAIRS)
    baseline_system = models.CharField(max_length=200, blank=True)
    # Pairwise only: uniform (every item gets its overlap, least judged first) or adaptive
    # (annotation/active.py chooses the pair; docs/annotation.md "Adaptive assignment").
    assignment_mode = models.CharField(
        max_length=16, choices=AssignmentMode.choices, default=AssignmentMode.UNIFORM
    )
    status = models.CharField(max_length=16, choices=CampaignStatus.choices, default=CampaignStatus.DRAFT)
    source = models.CharField(max_length=16, default="runs")  # "runs" | "upload"
    # System ids ("run:12" for runs, the uploaded id otherwise) and their researcher-facing labels.
    systems = models.JSONField(default=list, blank=True)
    system_labels = models.JSONField(default=dict, blank=True)
    # How the items were built: for runs, inputs matched by sample id / by prompt and samples left
    # unmatched per run (``campaigns.match_samples``); for uploads, lines and systems.
    build_report = models.JSONField(default=dict, blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="campaigns_created",
    )
    created = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    closed_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return self.name

    def label(self, system: str) -> str:
        return self.system_labels.get(system, system)


class Membership(models.Model):
    """An annotator admitted to a campaign (by invite link or added by a researcher)."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="annotation_memberships"
    )
    joined = models.DateTimeField(auto_now_add=True)
    invite = models.ForeignKey("Invite", null=True, blank=True, on_delete=models.SET_NULL)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["campaign", "user"], name="membership_uniq")]


def new_token() -> str:
    return secrets.token_urlsafe(24)


_token = new_token  # the name migration 0001 refers to


class Invite(models.Model):
    """A join link. ``max_uses`` None is unlimited; ``active`` False is revoked; see ``invites``."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="invites")
    token = models.CharField(max_length=64, unique=True, default=new_token)
    max_uses = models.PositiveIntegerField(null=True, blank=True)
    uses = models.PositiveIntegerField(default=0)
    active = models.BooleanField(default=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(auto_now_add=True)


class Item(models.Model):
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="items")
    order = models.PositiveIntegerField(default=0)
    key = models.CharField(max_length=300, blank=True)  # prompt identity (sample id or prompt hash)
    prompt = models.TextField()
    references = models.JSONField(default=list, blank=True)
    system_a = models.CharField(max_length=200)
    output_a = models.TextField()
    system_b = models.CharField(max_length=200, blank=True)  # empty for Likert items
    output_b = models.TextField(blank=True)
    # Automatic metric/reward values of each output ({name: value}), for metric–human agreement.
    metrics_a = models.JSONField(default=dict, blank=True)
    metrics_b = models.JSONField(default=dict, blank=True)
    sample_a = models.ForeignKey(
        "runs.Sample", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    sample_b = models.ForeignKey(
        "runs.Sample", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # Gold/attention items: a known answer ("a"/"b"/"tie"/"both_bad"); excluded from rankings.
    gold = models.CharField(max_length=16, blank=True)
    slots_taken = models.PositiveIntegerField(default=0)
    judgment_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["order", "id"]
        indexes = [models.Index(fields=["campaign", "slots_taken", "order"], name="item_next_idx")]
        constraints = [
            models.CheckConstraint(condition=models.Q(slots_taken__gte=0), name="item_slots_nonneg")
        ]


class AssignmentStatus(models.TextChoices):
    OPEN = "open", "open"
    DONE = "done", "done"
    SKIPPED = "skipped", "skipped"
    EXPIRED = "expired", "expired"


class Assignment(models.Model):
    """An item handed to one annotator; its token must come back with the judgment."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="assignments")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="assignments")
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="assignments"
    )
    token = models.CharField(max_length=64, unique=True, default=new_token)
    left_is_a = models.BooleanField(default=True)
    status = models.CharField(max_length=16, choices=AssignmentStatus.choices, default=AssignmentStatus.OPEN)
    skips = models.PositiveSmallIntegerField(default=0)  # a skipped item comes back once (assignment.py)
    created = models.DateTimeField(auto_now_add=True)
    served_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["item", "annotator"], name="assignment_item_annotator_uniq")
        ]
        indexes = [models.Index(fields=["campaign", "annotator", "status"], name="assign_camp_ann_idx")]


class Judgment(models.Model):
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="judgments")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="judgments")
    annotator = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="judgments"
    )
    assignment = models.OneToOneField(Assignment, on_delete=models.CASCADE, related_name="judgment")
    choice = models.CharField(max_length=16, choices=Choice.choices, blank=True)  # pairwise, in system terms
    left_is_a = models.BooleanField(default=True)  # what the annotator saw (position-bias audits)
    scores = models.JSONField(default=dict, blank=True)  # Likert {axis: 1..5}
    rationale = models.TextField(blank=True)
    seconds = models.FloatField(null=True, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["annotator", "item"], name="judgment_annotator_item_uniq")
        ]


class RewardModelStatus(models.TextChoices):
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"


class RewardModel(models.Model):
    name = models.CharField(max_length=200)
    campaign = models.ForeignKey(
        Campaign, null=True, blank=True, on_delete=models.SET_NULL, related_name="reward_models"
    )
    status = models.CharField(
        max_length=16, choices=RewardModelStatus.choices, default=RewardModelStatus.QUEUED
    )
    backbone = models.CharField(max_length=500, default="minilm")
    params = models.JSONField(default=dict, blank=True)
    path = models.CharField(max_length=1000, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    progress = models.FloatField(default=0.0)
    error = models.TextField(blank=True)
    task_id = models.CharField(max_length=64, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]


# --------------------------------------------------------------------------------------------------
# AI judges (annotation/ai_judges.py). They are not users: an AI judge is a row of its campaign and its
# judgments live in their own table, so no human-only query (assignment slots, agreement between
# annotators, exports) can pick them up by accident; results combine them only when asked (source).
# --------------------------------------------------------------------------------------------------


class AIJudgeKind(models.TextChoices):
    LOCAL = "local", "local causal LM"
    ENDPOINT = "endpoint", "OpenAI-compatible chat endpoint"


class AIJudgeStatus(models.TextChoices):
    IDLE = "idle", "not run yet"
    QUEUED = "queued", "queued"
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"


class AIJudge(models.Model):
    """An AI annotator of a pairwise campaign. ``api_key`` stays on the server: pages only say whether
    one is set (``has_key``)."""

    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="ai_judges")
    name = models.CharField(max_length=100)
    kind = models.CharField(max_length=16, choices=AIJudgeKind.choices, default=AIJudgeKind.LOCAL)
    # Local: "smollm2" (the offline wheel), "builtin:…", a hub id or a directory in the read roots;
    # endpoint: the model name sent in the request.
    model = models.CharField(max_length=500, default="smollm2")
    base_url = models.CharField(max_length=500, blank=True)
    api_key = models.CharField(max_length=500, blank=True)
    prompt_template = models.TextField()
    status = models.CharField(max_length=16, choices=AIJudgeStatus.choices, default=AIJudgeStatus.IDLE)
    task_id = models.CharField(max_length=64, blank=True)
    cancel_requested = models.BooleanField(default=False)
    n_total = models.PositiveIntegerField(default=0)
    n_done = models.PositiveIntegerField(default=0)
    n_errors = models.PositiveIntegerField(default=0)
    eta_seconds = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [models.UniqueConstraint(fields=["campaign", "name"], name="ai_judge_name_uniq")]

    def __str__(self) -> str:
        return self.name

    @property
    def has_key(self) -> bool:
        return bool(self.api_key)

    @property
    def progress(self) -> float:
        return self.n_done / self.n_total if self.n_total else 0.0


class AIJudgment(models.Model):
    """One pass of an AI judge over an item: ``a_first`` says whether system a's output was shown first.

    ``label`` is the verdict in prompt terms ("A" = the first response, "B" = the second, "" = none),
    ``choice`` the same in system terms ("a", "b" or "tie"). The item's verdict combines its two passes
    (``ai_judges.item_verdict``): the same system twice, else a tie.
    """

    judge = models.ForeignKey(AIJudge, on_delete=models.CASCADE, related_name="judgments")
    campaign = models.ForeignKey(Campaign, on_delete=models.CASCADE, related_name="ai_judgments")
    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="ai_judgments")
    a_first = models.BooleanField()
    label = models.CharField(max_length=8, blank=True)
    choice = models.CharField(max_length=16, choices=Choice.choices)
    p_first = models.FloatField(null=True, blank=True)  # local LM: next-token probability of "A"
    p_second = models.FloatField(null=True, blank=True)  # … and of "B"
    reply = models.TextField(blank=True)  # endpoint: the raw reply (kept when it has no verdict)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        constraints = [
            models.UniqueConstraint(fields=["judge", "item", "a_first"], name="ai_judgment_pass_uniq")
        ]
