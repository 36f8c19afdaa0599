"""The unit of task data and the protocol every task (data pool) implements."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Protocol, runtime_checkable

SPLITS = ("train", "validation", "test")


@dataclass(frozen=True)
class Sample:
    """One prompt with its references, as RL4LMs's data pools produce them."""

    id: str
    prompt: str
    references: list[str] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@runtime_checkable
class Task(Protocol):
    """A data pool: ``load(split)`` returns the samples of ``train``, ``validation`` or ``test``."""

    def load(self, split: str) -> list[Sample]: ...
