"""Import a CLI run directory (config.json, metrics.jsonl, samples.jsonl) as a Run."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from webapp.runs.services import ServiceError, import_run_dir


class Command(BaseCommand):
    help = "Import an engine run directory into the experiment manager."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("path")
        parser.add_argument("--user", default=None, help="owner username")
        parser.add_argument("--project", default=None)
        parser.add_argument("--tags", default="")

    def handle(self, *args: Any, **opts: Any) -> None:
        user = get_user_model().objects.filter(username=opts["user"]).first() if opts["user"] else None
        try:
            run = import_run_dir(opts["path"], user=user, project=opts["project"], tags=opts["tags"])
        except ServiceError as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"imported run #{run.pk} {run.name}")
