"""``python manage.py load_reference_runs [FILE ...]``: load shipped reference runs (idempotent).

Without arguments it loads every ``webapp/grue/reference/*.json.gz`` (``manage.py up`` runs it on every
start); a file already loaded changes nothing, a re-exported one replaces its runs. See
``webapp/grue/reference.py`` and docs/reproduction.md.
"""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandError

from webapp.grue.reference import REFERENCE_DIR, StudyError, load_shipped, shipped_files


class Command(BaseCommand):
    help = "Load reference runs (a reproduction study's results) into the database; idempotent."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("files", nargs="*", help=f"reference files (default: {REFERENCE_DIR}/*.json.gz)")

    def handle(self, *args: Any, **opts: Any) -> None:
        files = opts["files"] or shipped_files()
        if not files:
            self.stdout.write(f"reference runs: none shipped yet ({REFERENCE_DIR} has no *.json.gz)")
            return
        try:
            done = load_shipped(files)
        except StudyError as exc:
            raise CommandError(str(exc)) from None
        for name, c in done.items():
            self.stdout.write(
                f"reference runs from {name}: {c['created']} created, {c['replaced']} replaced, "
                f"{c['unchanged']} unchanged, {c['removed']} removed"
            )
