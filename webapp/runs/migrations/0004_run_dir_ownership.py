"""One owner per run directory: ``run_dir_owned`` and a unique ``run_dir``.

Databases from before this rule may hold several runs sharing one directory (a launch pointed at
another run's directory, a directory imported twice). The oldest run keeps the directory; the others
lose the claim (their ``run_dir`` is cleared) and say so in their notes, so nothing is deleted with
the wrong run and the constraint can be created.
"""

from django.db import migrations, models
from django.db.models import Q


def give_each_directory_one_owner(apps, schema_editor):
    Run = apps.get_model("runs", "Run")
    seen: dict[str, int] = {}
    for run in Run.objects.exclude(run_dir="").order_by("pk").only("pk", "run_dir", "notes"):
        owner = seen.setdefault(run.run_dir, run.pk)
        if owner != run.pk:
            note = f"Run directory {run.run_dir} is run #{owner}'s (it was shared); this run no longer claims it."
            Run.objects.filter(pk=run.pk).update(run_dir="", notes=(run.notes + "\n" + note).strip())


class Migration(migrations.Migration):
    dependencies = [("runs", "0003_metric_rollup_and_log_keys")]

    operations = [
        migrations.AddField(model_name="run", name="run_dir_owned", field=models.BooleanField(default=False)),
        migrations.RunPython(give_each_directory_one_owner, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="run",
            constraint=models.UniqueConstraint(
                condition=~Q(run_dir=""), fields=("run_dir",), name="run_dir_one_owner"
            ),
        ),
    ]
