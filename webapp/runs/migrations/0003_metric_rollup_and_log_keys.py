"""Ingest-time min/max rollup of metric points (cold charts read ~1,000 rows) and unique keys for
step log lines (a resumed run does not repeat them). Existing points are rolled up here."""

import django.db.models.deletion
from django.db import migrations, models

ROLLUP_BASE_SHIFT = 4  # width 16 (webapp.runs.ingest.ROLLUP_BASE)
ROLLUP_FACTOR_SHIFT = 2  # ×4 per level
ROLLUP_LEVELS = 8


def backfill_rollup(apps, schema_editor):
    """The same aggregates the ingest statement maintains, computed from the stored points."""
    ok = "value IS NOT NULL AND value <> 'NaN'::float8"
    with schema_editor.connection.cursor() as cur:
        for level in range(ROLLUP_LEVELS):
            shift = ROLLUP_BASE_SHIFT + ROLLUP_FACTOR_SHIFT * level
            cur.execute(
                f"""
                INSERT INTO runs_metricrollup
                  (run_id, key, level, bucket, n, min_value, min_step, max_value, max_step)
                SELECT run_id, key, {level}, bucket, n, mn[1], mn[2]::bigint, mx[1], mx[2]::bigint
                FROM (SELECT run_id, key, step >> {shift} AS bucket, count(*)::int AS n,
                             min(ARRAY[value, step::float8]) FILTER (WHERE {ok}) AS mn,
                             max(ARRAY[value, step::float8]) FILTER (WHERE {ok}) AS mx
                      FROM runs_metricpoint GROUP BY 1, 2, 3) AS agg
                """
            )


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0002_roles"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricRollup",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=200)),
                ("level", models.SmallIntegerField()),
                ("bucket", models.BigIntegerField()),
                ("n", models.IntegerField()),
                ("min_value", models.FloatField(null=True)),
                ("min_step", models.BigIntegerField(null=True)),
                ("max_value", models.FloatField(null=True)),
                ("max_step", models.BigIntegerField(null=True)),
            ],
        ),
        migrations.AddField(
            model_name="runlog",
            name="key",
            field=models.CharField(blank=True, default="", max_length=64),
        ),
        migrations.AddConstraint(
            model_name="runlog",
            constraint=models.UniqueConstraint(
                condition=models.Q(("key", ""), _negated=True),
                fields=("run", "key"),
                name="runlog_run_key_uniq",
            ),
        ),
        migrations.AddField(
            model_name="metricrollup",
            name="run",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.CASCADE, related_name="metric_rollups", to="runs.run"
            ),
        ),
        migrations.AddConstraint(
            model_name="metricrollup",
            constraint=models.UniqueConstraint(
                fields=("run", "key", "level", "bucket"), name="rollup_run_key_level_bucket_uniq"
            ),
        ),
        migrations.RunPython(backfill_rollup, migrations.RunPython.noop),
    ]
