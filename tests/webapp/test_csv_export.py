"""Spreadsheet-formula neutralisation in the runs' metrics CSV (the same guard as the annotation export)."""

from __future__ import annotations

import csv
import io

from django.urls import reverse

from annotation import exports
from webapp import csvsafe
from webapp.runs import ingest
from webapp.runs.models import Run


def _csv(response) -> list[list[str]]:
    body = b"".join(response.streaming_content).decode()
    return list(csv.reader(io.StringIO(body)))


def test_run_names_and_metric_keys_cannot_run_as_formulas(researcher_client):
    run = Run.objects.create(name='=HYPERLINK("http://evil.example","x")', config={})
    ingest.ingest_metrics(
        run.pk, [("+cmd|' /C calc'!A0", 0, -1.5), ("@sum(A1)", 1, 2.0), ("train/kl", 2, 0.5)]
    )
    resp = researcher_client.get(reverse("runs:export", args=[run.pk, "csv"]))
    assert resp.status_code == 200
    rows = _csv(resp)
    assert rows[0] == ["run_id", "run_name", "key", "step", "value", "time"]
    by_key = {r[2]: r for r in rows[1:]}
    assert set(by_key) == {"'+cmd|' /C calc'!A0", "'@sum(A1)", "train/kl"}
    assert all(r[1] == '\'=HYPERLINK("http://evil.example","x")' for r in rows[1:])
    # Numbers stay numbers: a negative value is not turned into text.
    assert by_key["'+cmd|' /C calc'!A0"][4] == "-1.5"
    assert by_key["train/kl"][4] == "0.5"


def test_compare_export_is_guarded_too(researcher_client):
    a = Run.objects.create(name="-2+3", config={})
    ingest.ingest_metrics(a.pk, [("k", 0, 1.0)])
    resp = researcher_client.get(reverse("runs:compare_export", args=["csv"]) + f"?ids={a.pk}")
    assert resp.status_code == 200
    rows = _csv(resp)
    assert rows[1][1] == "'-2+3"


def test_annotation_export_uses_the_shared_guard():
    assert exports.cell is csvsafe.cell
    assert [csvsafe.cell(v) for v in ("=1+1", "\tx", "\rx", "ok", -3, None)] == [
        "'=1+1",
        "'\tx",
        "'\rx",
        "ok",
        -3,
        None,
    ]
