from django.urls import path

from webapp.api import extensions, views

urlpatterns = [
    path("api/v1/openapi.json", views.openapi, name="api_openapi"),
    path("api/v1/runs", views.runs, name="api_runs"),
    path("api/v1/runs/<int:run_id>", views.run_detail, name="api_run"),
    path("api/v1/runs/<int:run_id>/events", views.run_events, name="api_run_events"),
    path("api/v1/runs/<int:run_id>/status", views.run_status, name="api_run_status"),
    path("api/v1/runs/<int:run_id>/metrics", views.run_metrics, name="api_run_metrics"),
    path("settings/tokens/", views.tokens_page, name="api_tokens"),
    # endpoints of other apps (the annotation app's campaigns), registered in their ready()
    *extensions.url_patterns(),
]
