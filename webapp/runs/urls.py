"""URLs of the experiment manager (mounted at the site root)."""

from django.urls import path

from webapp.runs import gold_views, views

app_name = "runs"

urlpatterns = [
    path("", views.run_list, name="list"),
    path("launch/", views.launch, name="launch"),
    path("workers.json", views.workers_json, name="workers"),
    path("sweeps/", views.sweep_list, name="sweep_list"),
    path("sweeps/new/", views.sweep_new, name="sweep_new"),
    path("sweeps/<str:tag>/", views.sweep_detail, name="sweep"),
    path("sweeps/<str:tag>/cancel/", views.sweep_cancel, name="sweep_cancel"),
    path("sweeps/<str:tag>/status.json", views.sweep_status, name="sweep_status"),
    path("import/", views.import_run, name="import"),
    path("compare/", views.compare, name="compare"),
    path("compare/metrics.<str:fmt>", views.compare_export, name="compare_export"),
    path("runs/<int:pk>/", views.run_detail, name="detail"),
    path("runs/<int:pk>/actions/", views.run_actions, name="actions"),
    path("runs/<int:pk>/series.json", views.run_series, name="series"),
    path("runs/<int:pk>/metrics.<str:fmt>", views.run_metrics_export, name="export"),
    path("runs/<int:pk>/cancel/", views.run_cancel, name="cancel"),
    path("runs/<int:pk>/retry/", views.run_retry, name="retry"),
    path("runs/<int:pk>/resume/", views.run_resume, name="resume"),
    path("runs/<int:pk>/clone/", views.run_clone, name="clone"),
    path("runs/<int:pk>/delete/", views.run_delete, name="delete"),
    path("runs/<int:pk>/meta/", views.run_update_meta, name="meta"),
    path("runs/<int:pk>/placement.json", views.run_placement, name="placement"),
    # the over-optimisation watch's jobs (webapp/runs/gold_jobs.py)
    path("runs/<int:pk>/gold/", gold_views.gold_start, name="gold_start"),
    path("runs/<int:pk>/gold/jobs.json", gold_views.jobs_json, name="gold_jobs"),
    path("runs/<int:pk>/gold/jobs/<int:job_id>/cancel/", gold_views.gold_cancel, name="gold_cancel"),
    path("runs/<int:pk>/gold/jobs/<int:job_id>/retry/", gold_views.gold_retry, name="gold_retry"),
    path("runs/<int:pk>/checkpoints/<int:step>/export/", gold_views.checkpoint_export, name="ckpt_export"),
    path(
        "runs/<int:pk>/checkpoints/<int:step>/export/retry/",
        gold_views.checkpoint_export_retry,
        name="ckpt_export_retry",
    ),
    path(
        "runs/<int:pk>/checkpoints/<int:step>/model.tar.gz",
        gold_views.checkpoint_download,
        name="ckpt_download",
    ),
]
