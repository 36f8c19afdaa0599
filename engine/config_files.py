"""Reading a run config file in either format: GRUE Studio's own or an RL4LMs task config.

This sits above both ``engine.config`` (the schema) and ``engine.rl4lms`` (the translation, which needs
the schema's errors), so neither of those imports the other back: the format dispatch lives here.
It imports no torch, so the web process and ``import engine`` stay cheap.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine import dotted
from engine.config import RunConfig, is_rl4lms_config, load_yaml, parse_config, parse_overrides
from engine.rl4lms import convert_rl4lms


def read_config_file(path: str | Path) -> tuple[dict[str, Any], list[str]]:
    """The file's config as GRUE Studio data, with the RL4LMs keys that could not be honoured (a
    converted RL4LMs file may silently mean less than it says, so callers show that list)."""
    data = load_yaml(path)
    if is_rl4lms_config(data):
        converted, unhonoured = convert_rl4lms(data)
        return converted, list(unhonoured or [])
    return data, []


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Load a GRUE Studio config (or an RL4LMs task config, converted) with ``key=value`` overrides."""
    data, _unhonoured = read_config_file(path)
    for key, value in parse_overrides(overrides or []):
        dotted.set_path(data, key, value)
    return parse_config(data, source=str(path))
