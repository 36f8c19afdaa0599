from django.apps import AppConfig


class AnnotationConfig(AppConfig):
    name = "annotation"
    label = "annotation"
    verbose_name = "Human evaluation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Register the Celery task with the project's app (webapp.celery autodiscovers only webapp.runs).
        from annotation import tasks  # noqa: F401
