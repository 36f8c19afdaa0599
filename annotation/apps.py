from django.apps import AppConfig


class AnnotationConfig(AppConfig):
    name = "annotation"
    label = "annotation"
    verbose_name = "Human evaluation"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # Imported here because models must be loaded first: the Celery task registers with the
        # project's app (webapp.celery autodiscovers only webapp.runs), and the plugins register
        # this app's reward choices and run-page panel with the runs app.
        from annotation import plugins, tasks  # noqa: F401

        plugins.register()
