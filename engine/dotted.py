"""Dotted config paths (``algorithm.args.learning_rate``): the one place that walks nested mappings.

Why one module: the CLI's ``--set``, sweeps, presets, tracker params, the compare page's config diff
and the web's sweep table all name a config field by its dotted path. Written once, they agree on
the rules: a path goes through mappings only (a list is a leaf), an empty mapping is a leaf of its
own, ``set_path`` makes the missing mappings on the way, and ``deep_merge`` merges mappings key by
key while replacing lists and scalars whole. Standard library only: the web process imports it.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any


def flatten(data: Mapping[str, Any], prefix: str = "", *, empty: bool = True) -> dict[str, Any]:
    """``{"a": {"b": 1, "c": [2]}}`` → ``{"a.b": 1, "a.c": [2]}``: lists stay leaves. An empty
    mapping is a leaf (``{"a.d": {}}``) unless ``empty`` is false, when it adds no key at all."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten(value, path, empty=empty))
        elif empty or not isinstance(value, Mapping):
            out[path] = value
    return out


def get_path(data: Mapping[str, Any], path: str, default: Any = None) -> Any:
    """The value at ``path``, or ``default`` when a part is missing or not a mapping."""
    cur: Any = data
    for part in path.split("."):
        if not isinstance(cur, Mapping) or part not in cur:
            return default
        cur = cur[part]
    return cur


def set_path(data: dict[str, Any], path: str, value: Any) -> None:
    """Set ``path`` to ``value`` in place, making (or replacing a non-mapping with) the mappings on
    the way, as a ``--set a.b.c=value`` override means."""
    keys = path.split(".")
    cur = data
    for k in keys[:-1]:
        nxt = cur.get(k)
        if not isinstance(nxt, dict):
            nxt = {}
            cur[k] = nxt
        cur = nxt
    cur[keys[-1]] = value


def deep_merge(
    base: Mapping[str, Any],
    *overrides: Mapping[str, Any] | None,
    replace: Callable[[str, Any, Any], bool] | None = None,
) -> dict[str, Any]:
    """A new mapping: ``base`` with each override merged in, key by key (later wins). Two mappings
    under the same key merge, unless ``replace(key, old, new)`` says the new one replaces the old
    whole; lists and scalars are always replaced, never concatenated. Nothing is shared with the
    inputs (values are deep-copied), so a caller may change the result freely."""
    out = copy.deepcopy(dict(base))
    for over in overrides:
        for key, value in (over or {}).items():
            old = out.get(key)
            if (
                isinstance(value, Mapping)
                and isinstance(old, dict)
                and not (replace is not None and replace(key, old, value))
            ):
                out[key] = deep_merge(old, value, replace=replace)
            else:
                out[key] = copy.deepcopy(value)
    return out
