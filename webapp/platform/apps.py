from django.apps import AppConfig


class PlatformConfig(AppConfig):
    name = "webapp.platform"
    label = "platform"
    verbose_name = "Platform commands"
