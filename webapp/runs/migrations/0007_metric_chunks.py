"""Metric points move into chunks (issue #15): one ``runs_metricchunk`` row per (run, key, write)
holding the write's points as arrays; ``runs_metricpoint`` becomes a view that unnests them.

Forward: creates the chunk table (array columns compressed with lz4 where the server has it: pglz
tripled the cost of a write), moves every stored point into chunks (per run and key, in step order,
at most 4,096 points per chunk (``CHUNK_POINTS``), chunks numbered in the order of their points' first id), drops the
point table and creates the view. Point ids change (``chunk id << 16 | position``): a browser open
across the migration reloads its charts from a cursor of 0 at worst (the page's own cursor is read
afresh on every load).

The rollup loses its FK constraint and its run_id index (as the chunks: integrity by the writers'
run-row lock; the deferred FK trigger per rollup row was most of the server's rollup work).

Backward: recreates the point table with its unique constraint and index, fills it from the chunks
(ids from the view), and drops the view and the chunk table.
"""

import django.contrib.postgres.fields
import django.db.models.deletion
from django.db import migrations, models

VIEW = """
CREATE VIEW runs_metricpoint AS
SELECT (c.id << 16) + (u.ord - 1) AS id, c.run_id, c.key, u.step, u.value, u.time
FROM runs_metricchunk c
CROSS JOIN LATERAL unnest(c.steps, c.vals, c.times) WITH ORDINALITY AS u(step, value, time, ord)
"""

FORWARD = (
    """
DO $$
BEGIN
  ALTER TABLE runs_metricchunk ALTER COLUMN steps SET COMPRESSION lz4,
                               ALTER COLUMN vals SET COMPRESSION lz4,
                               ALTER COLUMN times SET COMPRESSION lz4;
EXCEPTION WHEN feature_not_supported OR invalid_parameter_value THEN
  ALTER TABLE runs_metricchunk ALTER COLUMN steps SET STORAGE EXTERNAL,
                               ALTER COLUMN vals SET STORAGE EXTERNAL,
                               ALTER COLUMN times SET STORAGE EXTERNAL;
END $$;
""",
    """
INSERT INTO runs_metricchunk (run_id, key, first_step, last_step, steps, vals, times)
SELECT run_id, key, min(step), max(step), array_agg(step ORDER BY step),
       array_agg(value ORDER BY step), array_agg(time ORDER BY step)
FROM (SELECT id, run_id, key, step, value, time,
             (row_number() OVER (PARTITION BY run_id, key ORDER BY step) - 1) / 4096 AS part
      FROM runs_metricpoint) AS p
GROUP BY run_id, key, part
ORDER BY min(id)
""",
    "DROP TABLE runs_metricpoint",
    VIEW,
)

BACKWARD = (
    """
CREATE TABLE runs_metricpoint_old (
  id bigserial PRIMARY KEY, run_id bigint NOT NULL, key varchar(200) NOT NULL, step bigint NOT NULL,
  value double precision NULL, time timestamptz NOT NULL)
""",
    "INSERT INTO runs_metricpoint_old (id, run_id, key, step, value, time) "
    "SELECT id, run_id, key, step, value, time FROM runs_metricpoint ORDER BY id",
    "SELECT setval(pg_get_serial_sequence('runs_metricpoint_old', 'id'), "
    "coalesce((SELECT max(id) FROM runs_metricpoint_old), 0) + 1, false)",
    "DROP VIEW runs_metricpoint",
    "ALTER TABLE runs_metricpoint_old RENAME TO runs_metricpoint",
    "ALTER SEQUENCE runs_metricpoint_old_id_seq RENAME TO runs_metricpoint_id_seq",
    "ALTER INDEX runs_metricpoint_old_pkey RENAME TO runs_metricpoint_pkey",
    "ALTER TABLE runs_metricpoint ADD CONSTRAINT metric_run_key_step_uniq UNIQUE (run_id, key, step)",
    "CREATE INDEX metric_run_id_idx ON runs_metricpoint (run_id, id)",
)


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0006_metric_point_fk_without_constraint"),
    ]

    operations = [
        migrations.CreateModel(
            name="MetricChunk",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("key", models.CharField(max_length=200)),
                ("first_step", models.BigIntegerField()),
                ("last_step", models.BigIntegerField()),
                (
                    "steps",
                    django.contrib.postgres.fields.ArrayField(base_field=models.BigIntegerField(), size=None),
                ),
                (
                    "vals",
                    django.contrib.postgres.fields.ArrayField(
                        base_field=models.FloatField(null=True), size=None
                    ),
                ),
                (
                    "times",
                    django.contrib.postgres.fields.ArrayField(base_field=models.DateTimeField(), size=None),
                ),
                (
                    "run",
                    models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="metric_chunks",
                        to="runs.run",
                    ),
                ),
            ],
            options={
                "indexes": [
                    models.Index(fields=["run", "key", "last_step"], name="chunk_run_key_last_idx"),
                    models.Index(fields=["run", "id"], name="chunk_run_id_idx"),
                ],
            },
        ),
        migrations.AlterField(
            model_name="metricrollup",
            name="run",
            field=models.ForeignKey(
                db_constraint=False,
                db_index=False,
                on_delete=django.db.models.deletion.CASCADE,
                related_name="metric_rollups",
                to="runs.run",
            ),
        ),
        migrations.SeparateDatabaseAndState(
            database_operations=[migrations.RunSQL(list(FORWARD), list(BACKWARD))],
            state_operations=[
                migrations.RemoveConstraint(model_name="metricpoint", name="metric_run_key_step_uniq"),
                migrations.RemoveIndex(model_name="metricpoint", name="metric_run_id_idx"),
                migrations.AlterField(
                    model_name="metricpoint",
                    name="id",
                    field=models.BigIntegerField(primary_key=True, serialize=False),
                ),
                migrations.AlterField(
                    model_name="metricpoint",
                    name="run",
                    field=models.ForeignKey(
                        db_constraint=False,
                        db_index=False,
                        on_delete=django.db.models.deletion.DO_NOTHING,
                        related_name="metric_points",
                        to="runs.run",
                    ),
                ),
                migrations.AlterModelOptions(name="metricpoint", options={"managed": False}),
                migrations.AlterModelTable(name="metricpoint", table="runs_metricpoint"),
            ],
        ),
    ]
