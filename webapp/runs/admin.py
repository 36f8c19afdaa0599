from django.contrib import admin

from webapp.runs.models import Artifact, Checkpoint, Project, Run


@admin.register(Project)
class ProjectAdmin(admin.ModelAdmin):
    list_display = ("name", "created")


@admin.register(Run)
class RunAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "status", "algorithm", "task", "created_by", "created", "worker_host")
    list_filter = ("status", "algorithm", "task")
    search_fields = ("name", "notes")
    # config, run_dir and resume_from are checked by the launch (schema, path confinement, one owner per
    # directory); editing them here would bypass those checks, so the admin only shows them.
    readonly_fields = (
        "config",
        "run_dir",
        "run_dir_owned",
        "resume_from",
        "traceback",
        "error",
        "heartbeat_at",
        "started_at",
        "finished_at",
        "task_id",
    )


admin.site.register(Checkpoint)
admin.site.register(Artifact)
