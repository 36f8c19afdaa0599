"""The engine's import arrows: no circle between its modules, and the modules the web process imports
stay free of torch.

Every executed import counts as an arrow, at module level or inside a function: an import hidden in a
function is still a dependency, and two such imports were how ``config <-> rl4lms`` and
``evaluation <-> trainer`` went unnoticed. Imports under ``if TYPE_CHECKING:`` do not run and are skipped.
An arrow points at the module named (``from engine.models.policy import X`` -> ``engine.models.policy``),
not at the parent packages Python also initialises on the way, so a package's ``__init__`` re-exporting
its submodules does not count as a circle.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    return "TYPE_CHECKING" in ast.unparse(node.test)


def _imported_names(module: str, is_package: bool, tree: ast.Module) -> list[tuple[str, int]]:
    """(dotted name, line) of every import that can run, with ``from engine import x`` expanded to
    ``engine.x`` so a submodule imported that way is an arrow to the submodule."""
    out: list[tuple[str, int]] = []
    stack: list[ast.AST] = [tree]
    while stack:
        node = stack.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child):
                stack.extend(child.orelse)
                continue
            if isinstance(child, ast.Import):
                out.extend((alias.name, child.lineno) for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                base = child.module or ""
                if child.level:
                    package = module if is_package else module.rpartition(".")[0]
                    for _ in range(child.level - 1):
                        package = package.rpartition(".")[0]
                    base = f"{package}.{base}" if base else package
                # ``base.name`` falls back to ``base`` when ``name`` is not a submodule
                out.extend((f"{base}.{alias.name}", child.lineno) for alias in child.names)
            stack.append(child)
    return out


def import_graph(root: Path, package: str) -> dict[str, dict[str, str]]:
    """module -> {imported module: "file:line" of the first import}, for the modules of ``package``."""
    files = {_module_name(p, root): p for p in sorted((root / package).rglob("*.py"))}
    graph: dict[str, dict[str, str]] = {}
    for module, path in files.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        arrows: dict[str, str] = {}
        for name, line in _imported_names(module, path.name == "__init__.py", tree):
            target = name
            while target and target not in files:
                target = target.rpartition(".")[0]
            if target and target != module:
                arrows.setdefault(target, f"{path.relative_to(root)}:{line}")
        graph[module] = arrows
    return graph


def find_cycles(graph: dict[str, dict[str, str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each as a sorted list."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return cycles


def _describe(graph: dict[str, dict[str, str]], cycle: list[str]) -> str:
    members = set(cycle)
    arrows = [f"{a} -> {b} ({where})" for a in cycle for b, where in graph[a].items() if b in members]
    return "; ".join(arrows)


def test_no_import_circle_between_engine_modules():
    graph = import_graph(ROOT, "engine")
    assert len(graph) > 40  # the walk found the package (a wrong root would pass vacuously)
    assert "engine.rl4lms" in graph["engine.config_files"]
    cycles = find_cycles(graph)
    assert not cycles, "import circles in engine/: " + " | ".join(_describe(graph, c) for c in cycles)


def test_checker_finds_circles_hidden_in_functions_and_ignores_type_checking(tmp_path: Path):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from pkg import a\n")
    (pkg / "a.py").write_text("from pkg.b import f\n")
    (pkg / "b.py").write_text("def f():\n    from . import a\n    return a\n")
    (pkg / "c.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.d import X\n"
    )
    (pkg / "d.py").write_text("from .c import TYPE_CHECKING\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "e.py").write_text("from .. import c\n")
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.b"] == {"pkg.a": "pkg/b.py:2"}
    assert graph["pkg.sub.e"] == {"pkg.c": "pkg/sub/e.py:1"}
    assert "pkg.d" not in graph["pkg.c"]
    assert find_cycles(graph) == [["pkg.a", "pkg.b"]]


def test_modules_the_web_process_imports_do_not_import_torch():
    """The launch form, the leaderboard and the recorder import these; torch costs seconds and memory
    in every web process, so it stays behind the modules that train."""
    code = (
        "import sys, json\n"
        "import engine, engine.config, engine.config_files, engine.rl4lms, engine.presets, engine.registry\n"
        "import engine.sinks, engine.events, engine.yamlio, engine.assets, engine.models.builtin, engine.cli\n"
        "import engine.dotted, engine.jsonl, engine.checkpoint_layout\n"
        "print(json.dumps(sorted(m for m in ('torch', 'transformers') if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


_HEAVY = {"torch", "transformers"}


def _top_level_imports(tree: ast.Module) -> list[str]:
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            names.append(node.module)
    return names


def test_imports_inside_functions_are_only_the_ones_that_load_torch_or_optional_libraries():
    """Issue #13's rule: an import inside a function hides an arrow, so it needs a reason. The two
    reasons accepted: the module loads torch (directly or through an engine module that does), which
    the web process and the CLI's light commands must not pay for; or it is a third-party library
    that only one feature needs (nltk, sacrebleu, peft, a tracker client…). The engine's other modules
    and the standard library are imported at module top."""
    root = ROOT / "engine"
    files = {_module_name(p, ROOT): p for p in sorted(root.rglob("*.py"))}
    trees = {m: ast.parse(p.read_text(), filename=str(p)) for m, p in files.items()}
    torch_bound = {
        m for m, t in trees.items() if any(n.split(".")[0] in _HEAVY for n in _top_level_imports(t))
    }
    changed = True
    while changed:  # modules that import a torch-bound engine module at load are torch-bound too
        changed = False
        for m, t in trees.items():
            if m not in torch_bound and any(
                n in torch_bound or n.rpartition(".")[0] in torch_bound for n in _top_level_imports(t)
            ):
                torch_bound.add(m)
                changed = True
    bad = []
    for m, tree in trees.items():
        for fn in ast.walk(tree):
            if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in ast.walk(fn):
                if isinstance(node, ast.Import):
                    targets = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:  # relative: resolve like the graph does
                        package = m if files[m].name == "__init__.py" else m.rpartition(".")[0]
                        for _ in range(node.level - 1):
                            package = package.rpartition(".")[0]
                        base = f"{package}.{base}" if base else package
                    targets = [base] if base != "engine" else [f"engine.{a.name}" for a in node.names]
                else:
                    continue
                for target in targets:
                    top = target.split(".")[0]
                    if top == "engine":
                        mod = target
                        while mod and mod not in files:
                            mod = mod.rpartition(".")[0]
                        if mod not in torch_bound:
                            bad.append(
                                f"{files[m].relative_to(ROOT)}:{node.lineno} {target} (loads no torch)"
                            )
                    elif top in sys.stdlib_module_names:
                        bad.append(f"{files[m].relative_to(ROOT)}:{node.lineno} {target} (standard library)")
    assert not bad, "imports to move to the module top:\n" + "\n".join(bad)
