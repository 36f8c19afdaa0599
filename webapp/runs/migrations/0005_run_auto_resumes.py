"""Run.auto_resumes: how many times the watchdog resumed a run after its worker was lost."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0004_run_dir_ownership"),
    ]

    operations = [
        migrations.AddField(
            model_name="run",
            name="auto_resumes",
            field=models.IntegerField(default=0),
        ),
    ]
