"""``manage.py watch_runs``: the run watchdog (lost-run detection and automatic resume) as a small
process of its own, so it never waits behind training. ``--once`` sweeps once (cron-friendly)."""

from __future__ import annotations

import signal
from typing import Any

from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Mark runs whose worker stopped heartbeating as lost and resume them from their checkpoint."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--once", action="store_true", help="one sweep, then exit")
        parser.add_argument("--interval", type=float, default=None, help="seconds between sweeps")

    def handle(self, *args: Any, **opts: Any) -> None:
        from webapp import watchdog

        if opts["once"]:
            res = watchdog.sweep()
            self.stdout.write(
                f"marked lost: {res.lost}; resumed: {res.resumed}; "
                f"failed jobs of stopped workers: {res.failed_jobs}"
            )
            return
        stop = {"now": False}

        def on_signal(signum: int, frame: Any) -> None:
            stop["now"] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)

        def report(line: str) -> None:
            self.stdout.write(line)
            self.stdout.flush()

        report("run watchdog started")
        watchdog.watch(opts["interval"], should_stop=lambda: stop["now"], report=report)
