"""API tokens and the ids of the event batches already stored.

A token is shown once, when it is created; only its SHA-256 digest is stored (a token is 256 random
bits, so a plain hash is as strong as a password hash and costs nothing per request). A token acts as
its user with the user's current role: demoting a researcher takes the token's write rights away.

``ApiBatch`` makes a re-sent batch idempotent: its id is inserted in the same transaction as the
batch's rows, so a batch whose response was lost (the client cannot know whether it committed) is
stored exactly once when the client sends it again.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models

from webapp.runs.models import Run


class ApiToken(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=16)  # the first characters, to tell tokens apart on the page
    digest = models.CharField(max_length=64, unique=True)
    created = models.DateTimeField(auto_now_add=True)
    last_used = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @property
    def active(self) -> bool:
        return self.revoked_at is None


class ApiBatch(models.Model):
    id = models.BigAutoField(primary_key=True)
    run = models.ForeignKey(Run, on_delete=models.CASCADE, related_name="api_batches")
    batch_id = models.CharField(max_length=64)
    events = models.IntegerField(default=0)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["run", "batch_id"], name="apibatch_run_batch_uniq")]
