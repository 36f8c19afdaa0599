"""The algorithm contract, held by reading the source (issue 27).

* The trainer and the evaluation read what an algorithm can do from attributes every algorithm
  declares (``engine/algorithms/base.py``): no ``getattr``/``hasattr`` probe of the algorithm object or
  class, and every ``self.algo.<name>`` / ``algo_cls.<name>`` they read is declared on the root ``Algorithm``.
* Algorithms see the trainer only through ``TrainerView``: no ``trainer._private`` read, no name the
  view does not declare.
* Every registered algorithm belongs to exactly one family and declares the capabilities with the
  right types; mixed precision goes through ``engine/models/precision.py`` only.
* No function in ``engine/`` is longer than 80 lines unless its docstring says why, on a line that
  starts with ``Long because:`` (docs/architecture.md, "Contributing").
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

from engine.algorithms.base import (
    FAMILIES,
    Algorithm,
    CriticFreeGroupAlgorithm,
    OfflinePreferenceAlgorithm,
    OnPolicyAlgorithm,
    SupervisedAlgorithm,
    TrainerView,
)
from engine.config import parse_config
from engine.registry import algorithms

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "engine"
ALGORITHMS = ENGINE / "algorithms"
TRAINER = ENGINE / "trainer.py"
EVALUATION = ENGINE / "evaluation.py"
MAX_LINES = 80
REASON = "Long because:"


def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


ALGORITHM_NAMES = ("algo", "algo_cls")


def _is_algorithm(node: ast.AST) -> bool:
    """``self.algo``, ``trainer.algo``, a name ``algo``, or ``algo_cls`` (an algorithm's class, as the
    evaluation reads it); ``cfg.algorithm`` is the config's section."""
    if isinstance(node, ast.Attribute):
        return node.attr in ALGORITHM_NAMES
    return isinstance(node, ast.Name) and node.id in ALGORITHM_NAMES


def algorithm_probes(tree: ast.Module) -> list[str]:
    """``getattr``/``hasattr`` calls whose object is the algorithm, as "line: source"."""
    out = []
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and node.args
            and _is_algorithm(node.args[0])
        ):
            out.append(f"{node.lineno}: {ast.unparse(node)}")
    return out


def algorithm_reads(tree: ast.Module) -> set[str]:
    """Names read on the algorithm object (``self.algo.<name>``)."""
    return {
        node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute) and _is_algorithm(node.value)
    }


def trainer_reads(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, name) of every attribute read on a variable called ``trainer``."""
    return [
        (node.lineno, node.attr)
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer"
    ]


def long_functions(tree: ast.Module) -> list[tuple[str, int, int]]:
    """(name, first line, length) of functions over ``MAX_LINES`` lines without a reason in their docstring."""
    out = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        length = node.end_lineno - node.lineno + 1
        doc = ast.get_docstring(node) or ""
        has_reason = any(line.strip().startswith(REASON) for line in doc.splitlines())
        if length > MAX_LINES and not has_reason:
            out.append((node.name, node.lineno, length))
    return out


# --------------------------------------------------------------------------------------------- trainer
def test_the_trainer_makes_no_getattr_probe_of_the_algorithm():
    tree = _tree(TRAINER)
    assert not algorithm_probes(tree), algorithm_probes(tree)
    # the walk sees the trainer's algorithm: a wrong file or rule would pass vacuously
    assert {"update", "is_rl", "uses_critic", "offline"} <= algorithm_reads(tree)


def test_the_trainer_reads_only_what_the_root_algorithm_declares():
    undeclared = sorted(name for name in algorithm_reads(_tree(TRAINER)) if not hasattr(Algorithm, name))
    assert not undeclared, f"the trainer reads {undeclared} of the algorithm; declare them on Algorithm"


def test_the_probe_finder_finds_probes():
    src = (
        "def f(self, algo, algo_cls):\n    getattr(self.algo, 'x', 1)\n    hasattr(algo, 'y')\n"
        "    getattr(self.kl, 'z', 0)\n    getattr(algo_cls, 'w', False)\n"
    )
    assert [p.split(":")[0] for p in algorithm_probes(ast.parse(src))] == ["2", "3", "5"]


# --------------------------------------------------------------------------------------------- evaluation
def test_the_evaluation_reads_declared_capabilities_without_a_probe():
    tree = _tree(EVALUATION)
    assert not algorithm_probes(tree), algorithm_probes(tree)
    reads = algorithm_reads(tree)
    assert "uses_masking_policy" in reads  # the walk sees the evaluation's algorithm class
    undeclared = sorted(name for name in reads if not hasattr(Algorithm, name))
    assert not undeclared, f"the evaluation reads {undeclared} of the algorithm; declare them on Algorithm"


@pytest.mark.parametrize(
    ("algorithm", "masked_eval", "masked"),
    [("nlpo", True, True), ("nlpo", False, False), ("ppo", True, False), ("grpo", True, False)],
)
def test_the_evaluation_masks_generation_for_nlpo_only(algorithm, masked_eval, masked):
    """As before the probe went: NLPO's declared ``uses_masking_policy`` and its ``masked_eval`` option."""
    from engine.evaluation import uses_masked_generation

    cfg = parse_config({"algorithm": {"id": algorithm, "nlpo": {"masked_eval": masked_eval}}})
    assert uses_masked_generation(cfg) is masked


# --------------------------------------------------------------------------------------------- algorithms
def _algorithm_files() -> list[Path]:
    files = sorted(ALGORITHMS.glob("*.py"))
    assert len(files) >= 9  # base, common, ppo, nlpo, a2c, trpo, group, dpo, sft
    return files


def test_algorithms_read_no_private_trainer_attribute_and_only_the_view():
    public = {name for name in dir(TrainerView) if not name.startswith("_")} | set(
        TrainerView.__annotations__
    )
    private, undeclared, seen = [], [], 0
    for path in _algorithm_files():
        for line, name in trainer_reads(_tree(path)):
            seen += 1
            where = f"{path.relative_to(ROOT)}:{line} trainer.{name}"
            if name.startswith("_"):
                private.append(where)
            elif name not in public:
                undeclared.append(where)
    assert not private, f"algorithms read private trainer attributes: {private}"
    assert not undeclared, f"algorithms read trainer attributes TrainerView does not declare: {undeclared}"
    assert seen >= 5  # DPO's offline iteration uses the view


def test_the_trainer_provides_what_the_view_declares():
    from engine.trainer import Trainer

    source = inspect.getsource(Trainer)
    for name in TrainerView.__annotations__:
        assert re.search(rf"self\.{name}\s*(:[^=\n]*)?=", source) or hasattr(Trainer, name), name
    for name in ("prompts_for", "autocast"):
        assert callable(getattr(Trainer, name)), name


def test_mixed_precision_only_through_the_precision_module():
    """``torch.autocast`` is spelled in ``engine/models/precision.py``; algorithms, trainer and
    rollout use its ``autocast(device, dtype)``."""
    offenders = []
    for path in [*_algorithm_files(), TRAINER, ENGINE / "rollout.py"]:
        for node in ast.walk(_tree(path)):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "autocast"
                and ast.unparse(node) == "torch.autocast"
            ):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, offenders


def _registered() -> list[tuple[str, Algorithm]]:
    return [
        (key, algorithms.build(key, cfg=parse_config({"algorithm": {"id": key}}).algorithm))
        for key in algorithms.ids()
    ]


def test_every_registered_algorithm_is_in_exactly_one_family():
    built = _registered()
    assert {"ppo", "nlpo", "a2c", "trpo", "grpo", "rloo", "reinforce_pp", "dpo", "sft"} <= {
        k for k, _ in built
    }
    for key, algo in built:
        families = [f.__name__ for f in FAMILIES if isinstance(algo, f)]
        assert len(families) == 1, (key, families)


CAPABILITIES = {
    "is_rl": bool,
    "offline": bool,
    "uses_critic": bool,
    "group_size": int,
    "needs_reference": bool,
    "uses_masking_policy": bool,
    "whitens_per_minibatch": bool,
}


@pytest.mark.parametrize("key", algorithms.ids())
def test_every_registered_algorithm_declares_its_capabilities(key):
    algo = algorithms.build(key, cfg=parse_config({"algorithm": {"id": key}}).algorithm)
    for name, kind in CAPABILITIES.items():
        assert isinstance(getattr(algo, name), kind), (key, name)
    assert algo.group_size >= 1
    assert isinstance(algo.needs_rollout_scores(8), bool)
    own = type(algo)
    if isinstance(algo, OnPolicyAlgorithm):
        assert algo.is_rl and not algo.offline
        assert own.learn is not OnPolicyAlgorithm.learn, f"{key}: an on-policy algorithm implements learn"
        assert own.update is OnPolicyAlgorithm.update, f"{key}: the update signature is declared once"
    if isinstance(algo, CriticFreeGroupAlgorithm):
        assert not algo.uses_critic and own.advantages is not CriticFreeGroupAlgorithm.advantages
    elif isinstance(algo, OnPolicyAlgorithm):
        assert algo.uses_critic
    if isinstance(algo, OfflinePreferenceAlgorithm):
        assert algo.offline and own.offline_iteration is not OfflinePreferenceAlgorithm.offline_iteration
    if isinstance(algo, SupervisedAlgorithm):
        assert not algo.is_rl


# --------------------------------------------------------------------------------------------- length
def test_no_engine_function_is_over_80_lines_without_a_reason():
    offenders, n_functions = [], 0
    for path in sorted(ENGINE.rglob("*.py")):
        tree = _tree(path)
        n_functions += sum(isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef) for n in ast.walk(tree))
        offenders += [
            f"{path.relative_to(ROOT)}:{line} {name} ({n} lines)" for name, line, n in long_functions(tree)
        ]
    assert n_functions > 500  # the walk found the engine
    assert not offenders, (
        f"functions over {MAX_LINES} lines: split them, or give the docstring a line "
        f"starting {REASON!r} (docs/architecture.md, Contributing): {offenders}"
    )


def test_the_length_rule_counts_from_def_to_last_line_and_accepts_a_reason():
    body = "\n".join(f"    x{i} = {i}" for i in range(80))
    short = f"def ok():\n{body[: body.rindex(chr(10))]}\n"  # 80 lines with the def
    long = f"def too_long():\n{body}\n"
    excused = f'def excused():\n    """Sums.\n\n    {REASON} one table, read top to bottom."""\n{body}\n'
    found = long_functions(ast.parse(short + long + excused))
    assert [name for name, _, _ in found] == ["too_long"]
