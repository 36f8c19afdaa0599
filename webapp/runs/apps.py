from django.apps import AppConfig


class RunsConfig(AppConfig):
    name = "webapp.runs"
    label = "runs"
    verbose_name = "Runs"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The over-optimisation watch's jobs (webapp/runs/gold_jobs.py): imported here so that the
        # worker registers their Celery tasks (autodiscovery imports only webapp.runs.tasks) and the
        # launch form gets its ``?checkpoint=<run>:<step>`` source.
        from webapp.runs import gold_jobs

        gold_jobs.register()
