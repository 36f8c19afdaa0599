"""Mark running runs whose worker stopped heartbeating as lost, and fail the over-optimisation jobs
(gold, export) such a worker held (cron-friendly; the watchdog and beat do it too)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Mark runs without a heartbeat for GRUE_LOST_AFTER seconds (or --older-than) as lost, and fail "
        "the gold and export jobs without one."
    )

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--older-than", type=float, default=None, help="seconds without heartbeat")

    def handle(self, *args: Any, **opts: Any) -> None:
        from webapp import watchdog

        res = watchdog.mark_lost(opts["older_than"])
        self.stdout.write(f"marked lost: {res.lost}" if res.lost else "no lost runs")
        if res.failed_jobs:
            self.stdout.write(f"failed jobs of stopped workers: {res.failed_jobs}")
