"""YAML alias bombs and oversized configs are refused quickly, with the line, by every loader."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engine import yamlio
from engine.config import ConfigError, load_yaml, parse_overrides


def bomb(levels: int = 9) -> str:
    """A 'billion laughs' document nested in algorithm.extra: 9 levels expand to 10**9 items."""
    lines = [
        "algorithm:",
        "  id: ppo",
        "  extra:",
        '    l0: &l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]',
    ]
    for i in range(1, levels + 1):
        refs = ", ".join([f"*l{i - 1}"] * 10)
        lines.append(f"    l{i}: &l{i} [{refs}]")
    return "\n".join(lines) + "\n"


def test_alias_bomb_in_algorithm_extra_is_refused_before_anything_is_expanded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refused while composing, at the first alias: a handful of nodes are composed and no Python object is
    ever constructed, so nothing of the 10**9 items is expanded however slow the machine is."""
    path = tmp_path / "bomb.yaml"
    path.write_text(bomb())
    composed: list[int] = []
    constructed: list[int] = []
    compose, construct = yamlio.NoAliasSafeLoader.compose_node, yamlio.NoAliasSafeLoader.construct_document

    def count_compose(self, parent, index):
        composed.append(1)
        return compose(self, parent, index)

    def count_construct(self, node):
        constructed.append(1)
        return construct(self, node)

    monkeypatch.setattr(yamlio.NoAliasSafeLoader, "compose_node", count_compose)
    monkeypatch.setattr(yamlio.NoAliasSafeLoader, "construct_document", count_construct)
    with pytest.raises(ConfigError) as err:
        load_yaml(path)
    msg = str(err.value)
    assert "aliases" in msg and "*l0" in msg
    assert "line 5" in msg  # the first alias
    # keys and values down to l0's 10 strings, l1's list, then the refused alias: 22 nodes with PyYAML 6
    assert 0 < len(composed) <= 30, len(composed)
    assert constructed == []


def test_safe_load_refuses_aliases_but_accepts_anchors_and_normal_yaml() -> None:
    with pytest.raises(yaml.YAMLError, match="not allowed"):
        yamlio.safe_load("a: &x 1\nb: *x\n")
    assert yamlio.safe_load("a: &x 1\nb: 2\n") == {"a": 1, "b": 2}
    assert yamlio.safe_load("train: {n_iters: 3, lr: 1.0e-5}\n") == {"train": {"n_iters": 3, "lr": 1.0e-5}}
    with pytest.raises(yaml.YAMLError):  # python tags stay refused (safe loader)
        yamlio.safe_load("!!python/object/apply:os.system ['true']")


def test_oversized_config_is_refused_before_parsing(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text("notes: " + "x" * (yamlio.MAX_CONFIG_BYTES + 10) + "\n")
    with pytest.raises(ConfigError, match="over the limit"):
        load_yaml(path)
    big_json = tmp_path / "big.json"
    big_json.write_text('{"notes": "' + "x" * (yamlio.MAX_CONFIG_BYTES + 10) + '"}')
    with pytest.raises(ConfigError, match="over the limit"):
        load_yaml(big_json)


def test_set_override_with_alias_is_kept_as_a_string() -> None:
    # --set values fall back to the raw string on YAML errors: an alias never expands.
    assert parse_overrides(["algorithm.extra.x=*a"]) == [("algorithm.extra.x", "*a")]
