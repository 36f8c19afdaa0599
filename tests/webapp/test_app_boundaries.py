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
