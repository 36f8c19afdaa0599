"""Issue #13's rule for the web side: apps plug in, they do not reach across. The annotation app adds
its launch-form rewards, run-page panel, DPO launch source and API endpoints through the extension
points of the runs app (``webapp.runs.extensions``) and of the API (``webapp.api.extensions``); the
project's own packages import nothing from it, so removing it from INSTALLED_APPS removes all of that."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _imports(path: Path) -> list[tuple[str, int]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.module, node.lineno))
    return out


def test_the_project_packages_import_nothing_from_the_annotation_app():
    files = sorted((ROOT / "webapp").rglob("*.py"))
    assert len(files) > 30  # the walk found the package
    reaching = [
        f"{p.relative_to(ROOT)}:{line} imports {name}"
        for p in files
        for name, line in _imports(p)
        if name == "annotation" or name.startswith("annotation.")
    ]
    assert not reaching, reaching


def test_the_annotation_endpoints_are_plugged_into_the_api(client):
    """Registered from the annotation app's ready(): routed, described, and behind the API's auth."""
    from webapp.api import extensions

    assert {p.name for p in extensions.url_patterns()} == {
        "api_campaigns",
        "api_campaign_detail",
        "api_campaign_pairs",
    }
    assert "Pair" in extensions.openapi_schemas()
    assert client.get("/api/v1/campaigns").status_code == 401  # no token: the API's own refusal


def _private_imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            if node.module.split(".")[0] in ("webapp", "annotation", "engine"):
                out.extend(
                    f"{path.relative_to(ROOT)}:{node.lineno} imports {node.module}.{a.name}"
                    for a in node.names
                    if a.name.startswith("_") and not a.name.startswith("__")
                )
    return out


def test_no_web_module_imports_a_private_name_of_another():
    """Issue #27: the API's batch ingest used to subclass the recorder and import its private
    ``_Event``, ``_Barrier`` and ``_jsonable``; it now uses the public ``translation`` module. A
    private name stays inside its module, so a module's internals can change without breaking another."""
    files = sorted(p for d in ("webapp", "annotation") for p in (ROOT / d).rglob("*.py"))
    assert len(files) > 30
    reaching = [line for p in files for line in _private_imports(p)]
    assert not reaching, reaching


def test_delivery_and_translation_stay_apart():
    """The recorder delivers (queue, thread, retries, backpressure); ``translation`` turns events into
    rows and messages and knows nothing of delivery; the API stores through the translation, not the
    recorder; and only ``broadcast.py`` talks to the Channels layer's groups (one home for broadcasting)."""
    translation = {n for n, _line in _imports(ROOT / "webapp/runs/translation.py")}
    assert not translation & {"webapp.runs.recorder", "webapp.runs.broadcast", "threading", "queue"}
    assert "webapp.runs.translation" in {n for n, _line in _imports(ROOT / "webapp/runs/recorder.py")}
    api = {n for p in (ROOT / "webapp/api").rglob("*.py") for n, _line in _imports(p)}
    assert "webapp.runs.recorder" not in api
    assert "webapp.runs.translation" in api
    senders = sorted(
        str(p.relative_to(ROOT))
        for d in ("webapp", "annotation")
        for p in (ROOT / d).rglob("*.py")
        if "group_send(" in p.read_text()
    )
    assert senders == ["webapp/runs/broadcast.py"]


def test_queue_routing_has_one_home():
    """Which Celery queue a job goes to is decided in ``webapp/runs/workers.py`` only (``run_queue``),
    beside the queues a worker consumes, so the two cannot disagree."""
    deciders = sorted(
        str(p.relative_to(ROOT))
        for d in ("webapp", "annotation")
        for p in (ROOT / d).rglob("*.py")
        if "def run_queue" in p.read_text() or "GPU_QUEUE_SUFFIX =" in p.read_text()
    )
    assert deciders == ["webapp/runs/workers.py"]
