"""The platform app: commands that run the whole installation rather than one domain.

Why an app of its own: ``manage.py up`` (the supervisor of the web server, workers, watchdog and
embedded services) and ``manage.py grue_admin`` (the first admin account and the role groups) belong
to no single domain app; living in ``webapp/runs`` they made the runs app look responsible for the
whole site. The app has no models, views or URLs, only ``management/commands/``.
"""
