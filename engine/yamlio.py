"""The one YAML loader of the project: safe tags only, no aliases, a size cap.

``yaml.safe_load`` still expands aliases, so a few hundred bytes of nested ``*ref`` lists (a "billion
laughs" bomb, e.g. inside the free-form ``algorithm.extra`` mapping) become gigabytes of Python
objects and a config that takes minutes to render. Configs, presets and model maps never need
aliases, so they are refused at the first ``*alias`` with its line, before anything is expanded.
Anchors (``&name``) without aliases are harmless and allowed.

Errors are ``yaml.YAMLError`` subclasses carrying ``problem`` and ``problem_mark``, so every caller's
existing "bad YAML at line N" handling reports them unchanged.
"""

from __future__ import annotations

import os
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent

#: Largest YAML/JSON config text accepted (bytes); env ``GRUE_MAX_CONFIG_BYTES``.
MAX_CONFIG_BYTES = int(os.environ.get("GRUE_MAX_CONFIG_BYTES", str(1024 * 1024)))


class YamlTooLarge(yaml.YAMLError):
    """The text is over the size cap; raised before parsing."""

    def __init__(self, size: int, limit: int):
        self.problem = f"{size} bytes is over the limit of {limit} bytes for a config"
        self.problem_mark = None
        super().__init__(self.problem)


class NoAliasSafeLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses aliases (``*name``) instead of expanding them."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(AliasEvent):
            event = self.peek_event()
            raise ComposerError(
                None,
                None,
                f"YAML aliases (*{event.anchor}) are not allowed; write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def check_size(text: str | bytes, max_bytes: int | None = None) -> None:
    """Raise ``YamlTooLarge`` when ``text`` is over the config size cap."""
    limit = MAX_CONFIG_BYTES if max_bytes is None else max_bytes
    size = len(text.encode() if isinstance(text, str) else text)
    if size > limit:
        raise YamlTooLarge(size, limit)


def safe_load(text: str | bytes, *, max_bytes: int | None = None) -> Any:
    """Parse one YAML document with safe tags, no aliases and the size cap."""
    check_size(text, max_bytes)
    return yaml.load(text, Loader=NoAliasSafeLoader)  # noqa: S506 - a SafeLoader subclass
