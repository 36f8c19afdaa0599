from django.apps import AppConfig


class GrueConfig(AppConfig):
    name = "webapp.grue"
    label = "grue"
    verbose_name = "GRUE benchmark"
