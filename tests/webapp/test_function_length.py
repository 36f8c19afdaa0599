"""The web apps follow the engine's length rule (issue 27): no function in ``webapp/`` or
``annotation/`` is over 80 lines unless its docstring says why (a line starting ``Long because:``;
docs/architecture.md, "Contributing"). Migrations are generated code and do not count."""

from __future__ import annotations

import ast

from tests.engine.test_algorithm_contract import MAX_LINES, REASON, ROOT, long_functions


def test_no_web_function_is_over_80_lines_without_a_reason():
    offenders, n_functions = [], 0
    for app in ("webapp", "annotation"):
        for path in sorted((ROOT / app).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            tree = ast.parse(path.read_text(), filename=str(path))
            n_functions += sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree))
            offenders += [
                f"{path.relative_to(ROOT)}:{line} {name} ({n} lines)"
                for name, line, n in long_functions(tree)
            ]
    assert n_functions > 500  # the walk found the apps
    assert not offenders, (
        f"functions over {MAX_LINES} lines: split them, or give the docstring a line starting {REASON!r}: "
        f"{offenders}"
    )
