"""User-facing errors of the runs app, shared by services, lifecycle and paths.

They live apart from the modules that raise them so that those modules (and views) can import the
errors without importing each other.
"""

from __future__ import annotations

from typing import Any


class ServiceError(Exception):
    """A user-facing error with a clear message."""


class ConfigInvalid(ServiceError):
    """The config failed the engine's schema or a check of the web app: ``errors`` is a list of
    (dotted.field.path, message)."""

    def __init__(self, message: str, errors: list[tuple[str, str]]):
        super().__init__(message)
        self.errors = errors

    @property
    def field_errors(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for path, msg in self.errors:
            out.setdefault(path, []).append(msg)
        return out


class BrokerUnavailable(ServiceError):
    """The run was saved (status draft, retryable) but could not be enqueued."""

    def __init__(self, message: str, run: Any):
        super().__init__(message)
        self.run = run


class InvalidState(ServiceError):
    """The action does not apply to the run in its current status."""


class PathNotAllowed(ServiceError):
    """A file path points outside the allowed roots, or at a directory a run may not use."""
