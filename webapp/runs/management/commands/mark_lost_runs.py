"""Mark running runs whose worker stopped heartbeating as lost (cron-friendly; beat does it too)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand

from webapp.runs.lifecycle import mark_lost_runs


class Command(BaseCommand):
    help = "Mark runs without a heartbeat for GRUE_LOST_AFTER seconds (or --older-than) as lost."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--older-than", type=float, default=None, help="seconds without heartbeat")

    def handle(self, *args: Any, **opts: Any) -> None:
        ids = mark_lost_runs(opts["older_than"])
        self.stdout.write(f"marked lost: {ids}" if ids else "no lost runs")
