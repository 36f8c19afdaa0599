"""String-id registries for pluggable components.

Components are chosen by registered id (never by import path) so that configs coming from the web
can only select code that the installation registered on purpose.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownComponentError(KeyError):
    """Raised for an id nobody registered; the message lists the ids that exist."""

    def __init__(self, kind: str, key: str, known: list[str]):
        self.kind, self.key, self.known = kind, key, known
        super().__init__(f"unknown {kind} id {key!r}; registered {kind} ids: {', '.join(known) or '(none)'}")

    def __str__(self) -> str:  # KeyError quotes its message otherwise
        return self.args[0]


class Registry(Generic[T]):
    """A named mapping from id to factory, filled with the ``register`` decorator."""

    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}
        self._descriptions: dict[str, str] = {}

    def register(self, key: str, /, description: str | None = None) -> Callable[[T], T]:
        def deco(obj: T) -> T:
            if key in self._items and self._items[key] is not obj:
                raise ValueError(f"{self.kind} id {key!r} is already registered")
            self._items[key] = obj
            doc = description or (getattr(obj, "__doc__", None) or "").strip().split("\n")[0]
            self._descriptions[key] = doc
            return obj

        return deco

    def add(self, key: str, obj: T, description: str | None = None) -> T:
        return self.register(key, description)(obj)

    def get(self, key: str) -> T:
        _ensure_builtins()
        try:
            return self._items[key]
        except KeyError:
            raise UnknownComponentError(self.kind, key, sorted(self._items)) from None

    def build(self, key: str, /, **kwargs: Any) -> Any:
        """Instantiate a registered factory; argument errors name the component."""
        factory = self.get(key)
        try:
            return factory(**kwargs)  # type: ignore[operator]
        except TypeError as exc:
            raise TypeError(f"{self.kind} {key!r}: bad arguments {sorted(kwargs)}: {exc}") from exc

    def ids(self) -> list[str]:
        _ensure_builtins()
        return sorted(self._items)

    def describe(self) -> dict[str, str]:
        _ensure_builtins()
        return dict(sorted(self._descriptions.items()))

    def __contains__(self, key: object) -> bool:
        _ensure_builtins()
        return key in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self.ids())


tasks: Registry[Any] = Registry("task")
rewards: Registry[Any] = Registry("reward")
metrics: Registry[Any] = Registry("metric")
algorithms: Registry[Any] = Registry("algorithm")
kl_controllers: Registry[Any] = Registry("kl_controller")

_loaded = False
_loading = False
_load_lock = threading.RLock()


def _ensure_builtins() -> None:
    """Import the built-in component modules once, so their decorators run before a lookup.

    Thread-safe: the web server's first requests arrive together, and a lookup made while another
    thread was still importing used to see a half-filled (or empty) registry ("unknown algorithm id
    'ppo'; registered: "). A lookup from inside those imports (same thread) returns at once."""
    global _loaded, _loading
    if _loaded:
        return
    with _load_lock:
        if _loaded or _loading:
            return
        _loading = True
        try:
            for mod in (
                "engine.data",
                "engine.rewards",
                "engine.metrics",
                "engine.algorithms",
                "engine.kl",
            ):
                try:
                    importlib.import_module(mod)
                except ModuleNotFoundError as exc:  # a module still being written must not hide the others
                    if exc.name != mod:
                        raise
            _loaded = True
        finally:
            _loading = False
